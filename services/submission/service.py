"""Composition root of the submission service: ``serve`` runs it, ``bootstrap`` seeds it."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from trainyard_platform.services.submission import governance, handlers, identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.bus import BatchHandler, Bus
from trainyard_platform.shared.db import migrate, open_pool, ping
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.events import nats_subject
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.inbox import TransactionalHandler, idempotent
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.retention import Retention
from trainyard_platform.shared.runtime import ServiceRuntime, open_service_store, store_answers

NAME = "submission"
MIGRATIONS = Path(__file__).parent / "migrations"
SUBJECTS = [
    *(nats_subject(event) for event in (*handlers.CONSUMED, *governance.CONSUMED)),
    *handlers.SAID_ON_ITS_BEHALF,
]


def event_handler(
    pool: asyncpg.Pool, dispatch: TransactionalHandler = handlers.dispatch
) -> BatchHandler:
    """The consumer's handler: each event is applied at most once, in one transaction with
    its inbox record (a batch of events shares one); the flavor catalogue and budget states
    go to their replicas (``governance``), the rest to ``dispatch``."""
    return idempotent(pool, NAME, governance.dispatch_with_governance(dispatch))


def outbox_relay(pool: asyncpg.Pool, bus: Bus, settings: Settings) -> OutboxRelay:
    """The service's outbox relay: its busy rounds gather ``outbox_busy_round_s`` of
    commits (the service writes an event with every accepted job)."""
    return OutboxRelay(pool, bus, busy_round_s=settings.outbox_busy_round_s)


async def serve(settings: Settings) -> int:
    async with ServiceRuntime(NAME, settings) as rt:
        pool = await rt.open_pool(settings.database, NAME)
        await migrate(pool, NAME, MIGRATIONS)
        # Code bundles are stored, and job logs read, here (S3: the bucket is made if missing).
        store = await open_service_store(settings.storage)
        bus = await rt.resources.enter_async_context(Bus.connect(settings.nats, NAME))
        rt.add_readiness_check("database", lambda: ping(pool))
        rt.add_readiness_check("nats", bus.ping)
        rt.add_readiness_check("storage", lambda: store_answers(store))
        rt.spawn(outbox_relay(pool, bus, settings).run(rt.stopping), "outbox-relay")
        rt.spawn(
            Retention(
                pool,
                settings.nats.retention_hours,
                audit_days=settings.audit_retention_days,
            ).run(rt.stopping),
            "retention",
        )
        handler = event_handler(pool)
        rt.spawn(bus.consume_batches(NAME, SUBJECTS, handler, rt.stopping), "events")
        rt.sample_metrics(bus, NAME, pool)
        routes = [*rt.health_handlers(), *deadletter_routes(bus, NAME, pool)]
        deps = AppDeps(pool=pool, store=store, health_handlers=routes)
        app = create_app(settings, deps)
        return await rt.run(app)


async def bootstrap_user(
    settings: Settings, team: str, user: str, role: Role, reissue: bool = False
) -> str:
    """Migrate, then create ``team`` (if new) and its first ``user`` with ``role`` (an admin
    of the team, or a platform operator); return the token.

    Raises ``UserExists`` when the team already has that user, unless ``reissue`` (then the
    user gets a new token: ``identity.bootstrap_user``)."""
    async with open_pool(settings.database, NAME) as pool:
        await migrate(pool, NAME, MIGRATIONS)
        token: str = await identity.bootstrap_user(
            pool, team, user, role, settings.token_ttl_days, reissue
        )
        return token
