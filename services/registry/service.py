"""The registry's composition root: ``serve(settings)`` runs it until SIGTERM."""

from __future__ import annotations

from pathlib import Path

from trainyard_platform.services.registry.api import create_app
from trainyard_platform.services.registry.collector import for_store as collector_for
from trainyard_platform.services.registry.config import Settings
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.services.registry.retention import RegistryRetention
from trainyard_platform.shared.access import guard_for
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, ping
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.events import nats_subject
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointSaved,
    CostRecorded,
    JobCancelled,
    JobFailed,
    JobMetrics,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
)
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.runtime import ServiceRuntime, open_service_store, store_answers

NAME = "registry"
MIGRATIONS = Path(__file__).parent / "migrations"
SUBJECTS = [
    nats_subject(payload)
    for payload in (
        JobSubmitted,
        AllocationGranted,
        JobStarted,
        CheckpointSaved,
        JobSucceeded,
        JobFailed,
        JobCancelled,
        JobMetrics,
        CostRecorded,
    )
]


async def serve(settings: Settings) -> int:
    async with ServiceRuntime(NAME, settings) as rt:
        pool = await rt.open_pool(settings.database, NAME)
        await migrate(pool, NAME, MIGRATIONS)
        bus = await rt.resources.enter_async_context(Bus.connect(settings.nats, NAME))
        rt.add_readiness_check("database", lambda: ping(pool))
        rt.add_readiness_check("nats", bus.ping)
        # Opening an S3 store may create its bucket: a blocking call, kept off the loop.
        store = await open_service_store(settings.storage)
        rt.add_readiness_check("storage", lambda: store_answers(store))
        handlers = RegistryHandlers(store)
        rt.spawn(OutboxRelay(pool, bus).run(rt.stopping), "outbox-relay")
        rt.spawn(
            RegistryRetention(
                pool, settings.nats.retention_hours, audit_days=settings.audit_retention_days
            ).run(rt.stopping),
            "retention",
        )
        if settings.collector_interval_seconds > 0:
            collector = collector_for(pool, store, settings)
            rt.spawn(
                collector.run(rt.stopping, settings.collector_interval_seconds),
                "storage-collector",
            )
        rt.spawn(
            bus.consume_batches(
                NAME,
                SUBJECTS,
                handlers.consumer(pool),
                rt.stopping,
            ),
            "events",
        )
        rt.sample_metrics(bus, NAME, pool)
        guard = await rt.resources.enter_async_context(guard_for(settings))
        routes = [*rt.health_handlers(), *deadletter_routes(bus, NAME, pool)]
        app = create_app(
            pool,
            guard,
            routes,
            settings.cors_origins,
            store=store,
            download_url_seconds=settings.download_url_seconds,
            max_transfers=settings.max_transfers,
            max_transfers_per_team=settings.max_transfers_per_team,
        )
        return await rt.run(app)
