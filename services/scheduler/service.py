"""The scheduler's composition root: ``serve(settings)`` runs it until SIGTERM."""

from __future__ import annotations

from pathlib import Path

from services.scheduler.api import create_app
from services.scheduler.config import Settings
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.node_watch import NodeWatch
from shared.bus import Bus
from shared.db import migrate, open_pool, ping
from shared.events import Payload, nats_subject
from shared.events.payloads import (
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from shared.inbox import idempotent
from shared.outbox import OutboxRelay
from shared.runtime import ServiceRuntime

NAME = "scheduler"
MIGRATIONS = Path(__file__).parent / "migrations"
CONSUMED: list[type[Payload]] = [
    RunnerHeartbeat,
    JobSubmitted,
    JobCancelRequested,
    JobStarted,
    JobSucceeded,
    JobFailed,
    JobPreempted,
]


async def serve(settings: Settings) -> int:
    async with ServiceRuntime(NAME, settings) as rt:
        pool = await rt.resources.enter_async_context(open_pool(settings.database, NAME))
        await migrate(pool, NAME, MIGRATIONS)
        bus = await rt.resources.enter_async_context(Bus.connect(settings.nats, NAME))
        rt.add_readiness_check("database", lambda: ping(pool))
        rt.add_readiness_check("nats", bus.ping)
        handlers = SchedulerHandlers(revoke_grace_seconds=settings.revoke_grace_seconds)
        watch = NodeWatch(pool, settings.node_check_interval_seconds, settings.node_timeout_seconds)
        rt.spawn(OutboxRelay(pool, bus).run(rt.stopping), "outbox-relay")
        rt.spawn(
            bus.consume(
                NAME,
                [nats_subject(model) for model in CONSUMED],
                idempotent(pool, NAME, handlers.dispatch),
                rt.stopping,
            ),
            "events",
        )
        rt.spawn(watch.run(rt.stopping), "node-watch")
        return await rt.run(create_app(pool, settings.admin_token, rt.health_handlers()))
