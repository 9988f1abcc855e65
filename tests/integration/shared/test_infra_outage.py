"""An infrastructure outage is waited out, never dead-lettered: a PostgreSQL outage longer
than the old retry budget (0.5 + 1 + 2 + 4 s) loses nothing, the consumer pauses (not ready,
alert metric up) and resumes, and every event is applied exactly once."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool, ping
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.inbox import idempotent
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings, ServiceSettings

pytestmark = pytest.mark.integration

EMPTY = Path(__file__).parent / "no-migrations"
CONSUMER = "outage-consumer"
SUBJECTS = [nats_subject(JobCancelRequested)]
OUTAGE_SECONDS = 12.0  # longer than the 7.5 s the old retries (0.5, 1, 2, 4 s) lasted


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this module's own, since its tests stop and start it."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-outage-"))
    server = PostgresServer(folder / "pgdata")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def outage_pool(own_postgres: PostgresServer) -> AsyncIterator[asyncpg.Pool]:
    name = f"outage_{uuid.uuid4().hex}"
    dsn = own_postgres.create_database(name)
    try:
        async with open_pool(DatabaseSettings(url=dsn, pool_min_size=1), "t") as pool:
            await migrate(pool, "t", EMPTY)
            async with pool.acquire() as conn:
                await conn.execute("CREATE TABLE effects (job_id text NOT NULL)")
            yield pool
    finally:
        if not own_postgres.is_running():
            own_postgres.start()
        own_postgres.drop_database(name)


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


def _metric(reader: InMemoryMetricReader, name: str) -> float:
    """The value of a sum metric (all attribute sets together), 0 when never recorded."""
    data = reader.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    total += sum(point.value for point in metric.data.data_points)  # type: ignore[union-attr]
    return total


async def test_a_postgres_outage_longer_than_the_old_retry_budget_loses_nothing(
    own_postgres: PostgresServer, outage_pool: asyncpg.Pool, nats_settings: NatsSettings
) -> None:
    pool = outage_pool
    settings = nats_settings.model_copy(
        update={"outage_retry_initial_seconds": 0.2, "outage_retry_max_seconds": 1.0}
    )
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("outage-test")
    calls: dict[str, int] = {}

    async def apply(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        calls[envelope.subject] = calls.get(envelope.subject, 0) + 1
        await conn.execute("INSERT INTO effects VALUES ($1)", envelope.subject)

    async def applied() -> list[str]:
        async with pool.acquire() as conn:
            rows = await conn.fetch("SELECT job_id FROM effects ORDER BY job_id")
        return [r["job_id"] for r in rows]

    async with Bus.connect(settings, "outage-test", meter=meter) as bus:
        runtime = ServiceRuntime("outage-test", ServiceSettings())
        runtime.add_readiness_check("database", lambda: ping(pool))
        runtime.add_readiness_check("nats", bus.ping)
        stop = asyncio.Event()
        consumer = asyncio.create_task(
            bus.consume_batches(CONSUMER, SUBJECTS, idempotent(pool, CONSUMER, apply), stop)
        )
        try:
            await bus.publish(_event("job-before"))
            async with asyncio.timeout(10):
                while await applied() != ["job-before"]:
                    await asyncio.sleep(0.05)
            assert all((await runtime.is_ready()).values())

            await asyncio.to_thread(own_postgres.stop)
            await bus.publish(_event("job-during-1"))
            await bus.publish(_event("job-during-2"))
            samples: list[tuple[dict[str, bool], dict[str, str], float]] = []
            ends = time.monotonic() + OUTAGE_SECONDS
            while time.monotonic() < ends:
                await asyncio.sleep(0.5)
                paused_metric = _metric(reader, "trainyard.consumer.paused")
                samples.append((await runtime.is_ready(), dict(bus.paused), paused_metric))
            assert not consumer.done(), consumer
            await asyncio.to_thread(own_postgres.start)

            async with asyncio.timeout(20):
                while await applied() != ["job-before", "job-during-1", "job-during-2"]:
                    await asyncio.sleep(0.1)
                while not all((await runtime.is_ready()).values()):
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.wait_for(consumer, 20)

        # Not ready throughout the outage; paused (with the reason) and alerting once the
        # events arrived, and the messages were held, not redelivered or dead-lettered.
        assert all(not all(ready.values()) for ready, _, _ in samples)
        paused = [(reasons, metric) for ready, reasons, metric in samples if reasons]
        assert len(paused) >= len(samples) // 2, samples
        assert all(
            ready["nats"] is False for ready, reasons, _ in samples if reasons
        )  # the bus's own check says so, not only the database's
        reasons, metric = paused[-1]
        assert "unreachable" in reasons[CONSUMER] or "PostgreSQL" in reasons[CONSUMER]
        assert metric == 1
        assert bus.paused == {}
        assert _metric(reader, "trainyard.consumer.paused") == 0
        assert _metric(reader, "trainyard.consumer.outage_retries") >= 5
        assert _metric(reader, "trainyard.consumer.dead_letters") == 0

        dead = await bus.jetstream.stream_info(settings.deadletter_stream)
        assert dead.state.messages == 0
        info = await bus.jetstream.consumer_info(settings.stream, CONSUMER)
        assert info.num_redelivered == 0  # kept in progress through ack_wait (5 s) twice over
        assert info.num_ack_pending == 0 and info.num_pending == 0
    assert calls["job-before"] == 1
    assert calls["job-during-1"] >= 1  # tried in the outage's failed transactions, too


async def test_stopping_during_an_outage_hands_the_message_back(
    nats_settings: NatsSettings,
) -> None:
    settings = nats_settings.model_copy(update={"outage_retry_max_seconds": 0.5})
    seen: list[str] = []

    async def down(envelope: Envelope[Payload]) -> None:
        raise ConnectionRefusedError(111, "Connect call failed ('10.0.0.7', 9000)")

    async def up(envelope: Envelope[Payload]) -> None:
        seen.append(envelope.subject)

    async with Bus.connect(settings, "outage-test") as bus:
        await bus.publish(_event("job-1"))
        stop = asyncio.Event()
        task = asyncio.create_task(bus.consume(CONSUMER, SUBJECTS, down, stop))
        try:
            async with asyncio.timeout(10):
                while CONSUMER not in bus.paused:
                    await asyncio.sleep(0.05)
            assert not await bus.ping()
        finally:
            stop.set()
            started = time.monotonic()
            await asyncio.wait_for(task, 10)
        assert time.monotonic() - started < 3  # it does not wait the outage out when stopping
        assert bus.paused == {} and await bus.ping()

        again = asyncio.Event()
        task = asyncio.create_task(bus.consume(CONSUMER, SUBJECTS, up, again))
        try:
            async with asyncio.timeout(10):
                while seen != ["job-1"]:
                    await asyncio.sleep(0.05)
        finally:
            again.set()
            await asyncio.wait_for(task, 10)
        dead: Any = await bus.jetstream.stream_info(settings.deadletter_stream)
        assert dead.state.messages == 0
