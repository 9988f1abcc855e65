"""Fixtures for the registry's integration tests: a clean bus, a migrated registry schema, an
object store on a real S3 endpoint (moto's server, one per module, a fresh bucket per test),
and the registry's consumer and outbox relay running in-process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from nats.js import api

from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.services.registry.service import MIGRATIONS, NAME, SUBJECTS
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings
from trainyard_platform.shared.storage import ObjectStore, open_store


@pytest.fixture
def nats_settings(nats_settings: NatsSettings) -> NatsSettings:
    """One more delivery than the default: these tests let a success wait for its start."""
    return nats_settings.model_copy(update={"max_deliver": 4})


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with open_pool(DatabaseSettings(url=database_url), NAME) as p:
        await migrate(p, NAME, MIGRATIONS)
        yield p


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def store(s3_server: S3Server) -> ObjectStore:
    """The registry's store: a bucket of its own per test, as jobs' checkpoints and the
    registry's copies share one in deployment."""
    return open_store(f"s3://registry-{uuid.uuid4().hex[:12]}", s3_server.storage_settings())


@pytest.fixture
async def registry(pool: asyncpg.Pool, bus: Bus, store: ObjectStore) -> AsyncIterator[None]:
    """The registry's event consumer and outbox relay (``serve`` without HTTP)."""
    stop = asyncio.Event()
    handlers = RegistryHandlers(store)
    tasks = [
        asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=0.2).run(stop)),
        asyncio.create_task(bus.consume_batches(NAME, SUBJECTS, handlers.consumer(pool), stop)),
    ]
    yield
    stop.set()
    async with asyncio.timeout(20):
        await asyncio.gather(*tasks)


@dataclass
class EventLog:
    """Every event on the stream, in order."""

    events: list[Envelope[Payload]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, predicate: Any, timeout: float = 20, what: str = "event") -> Any:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self.changed.clear()
                    found = predicate()
                    if found:
                        return found
                    await self.changed.wait()
        except TimeoutError:
            seen = [f"{e.type} {e.subject}" for e in self.events][-20:]
            raise AssertionError(f"no {what} within {timeout} s; last events: {seen}") from None


@pytest.fixture
async def events(bus: Bus) -> AsyncIterator[EventLog]:
    log = EventLog()

    async def record(msg: Any) -> None:
        log.events.append(parse_envelope(msg.data))
        log.changed.set()

    sub = await bus.jetstream.subscribe(
        "trainyard.>", cb=record, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
    )
    try:
        yield log
    finally:
        await sub.unsubscribe()
