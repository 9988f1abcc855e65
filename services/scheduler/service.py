"""The scheduler's composition root: ``serve(settings)`` runs it until SIGTERM.

Every replica serves HTTP (health, readiness with its role, the queue view, the admin API)
and relays its outbox (``shared.outbox``: rows are claimed, so replicas do not publish one
twice nor out of order). Only the leader (``leader.Leadership``) consumes events, runs
passes and sweeps for lost nodes (``loops.LeaderWork``); the others stand by and take over
within seconds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainyard_platform.services.scheduler.api import create_app, readiness_handler
from trainyard_platform.services.scheduler.compiled import is_compiled
from trainyard_platform.services.scheduler.config import Settings
from trainyard_platform.services.scheduler.leader import Leadership
from trainyard_platform.services.scheduler.loops import LeaderWork
from trainyard_platform.services.scheduler.metrics import scheduler_readings
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.shared.access import guard_for
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, ping
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.events import Payload, nats_subject
from trainyard_platform.shared.events.payloads import (
    BudgetUpdated,
    CheckpointSaved,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.retention import Retention
from trainyard_platform.shared.runtime import ServiceRuntime

NAME = "scheduler"
log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
CONSUMED: list[type[Payload]] = [
    RunnerHeartbeat,
    JobSubmitted,
    JobCancelRequested,
    JobStarted,
    CheckpointSaved,
    JobSucceeded,
    JobFailed,
    JobPreempted,
    BudgetUpdated,
]
SUBJECTS = [nats_subject(model) for model in CONSUMED]


def tuning_from(settings: Settings) -> Tuning:
    return Tuning(
        policy=PolicyConfig(
            half_life_s=settings.fair_share_half_life_seconds,
            ageing_s=settings.ageing_seconds,
            size_weight=settings.size_weight,
            backfill=settings.backfill,
            preemption=settings.preemption,
            grace_s=settings.preemption_grace_seconds,
            reservations=settings.reservations,
            min_runtime_s=settings.min_runtime_seconds,
            max_preemptions=settings.max_preemptions,
            oversize_protection_s=settings.oversize_protection_seconds,
        ),
        cancel_grace_s=settings.revoke_grace_seconds,
        restart_backoff_s=settings.restart_backoff_seconds,
        restart_backoff_max_s=settings.restart_backoff_max_seconds,
        platform_retries=settings.platform_retries,
        cordon_after_platform_failures=settings.cordon_after_platform_failures,
        cordon_seconds=settings.cordon_seconds,
        max_waiting_jobs=settings.max_waiting_jobs_per_team,
        node_inventory=settings.node_inventory,
    )


async def serve(settings: Settings) -> int:
    async with ServiceRuntime(NAME, settings) as rt:
        pool = await rt.open_pool(settings.database, NAME)
        await migrate(pool, NAME, MIGRATIONS)
        # Which policy runs: the services' image compiles it (``compiled``), a checkout not.
        log.info("placement policy %s", "compiled" if is_compiled() else "interpreted")
        bus = await rt.resources.enter_async_context(Bus.connect(settings.nats, NAME))
        rt.add_readiness_check("database", lambda: ping(pool))
        rt.add_readiness_check("nats", bus.ping)
        leadership = Leadership(
            settings.database.url,
            retry_s=settings.leader_retry_seconds,
            check_s=settings.leader_check_seconds,
            session_timeout_s=settings.leader_session_timeout_seconds,
        )
        work = LeaderWork(
            NAME,
            pool,
            bus,
            SUBJECTS,
            tuning_from(settings),
            pass_interval_s=settings.pass_interval_seconds,
            node_check_interval_s=settings.node_check_interval_seconds,
            node_timeout_s=settings.node_timeout_seconds,
            node_reconnect_grace_s=settings.node_reconnect_grace_seconds,
            guard=leadership.check,
        )
        rt.spawn(OutboxRelay(pool, bus).run(rt.stopping), "outbox-relay")
        rt.spawn(
            Retention(
                pool,
                settings.nats.retention_hours,
                audit_days=settings.audit_retention_days,
            ).run(rt.stopping),
            "retention",
        )
        rt.spawn(leadership.run(rt.stopping, work.run), "leadership")
        scheduler_readings(rt.sample_metrics(bus, NAME, pool), pool)

        async def readiness() -> tuple[bool, dict[str, Any]]:
            checks = await rt.is_ready()
            ready = all(checks.values()) and not rt.stopping.is_set()
            since = leadership.since.isoformat() if leadership.since else None
            return ready, {
                "ready": ready,
                "service": NAME,
                "checks": checks,
                "role": leadership.role,
                "leader_since": since,
            }

        health = [h for h in rt.health_handlers() if "/readyz" not in h.paths]
        guard = await rt.resources.enter_async_context(guard_for(settings))
        routes = [*health, readiness_handler(readiness), *deadletter_routes(bus, NAME, pool)]
        app = create_app(pool, guard, routes, settings.cors_origins)
        return await rt.run(app)
