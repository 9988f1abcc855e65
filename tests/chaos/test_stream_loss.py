"""A lost event stream is made again, and what it held is said again (shared.outbox,
shared.bus, the runner's journal), on one NATS server and PostgreSQL.

The stream is lost here by deleting it (as NATS losing its store does to every stream);
``test_broker_loss`` deletes the whole JetStream store under the running platform.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from pydantic import SecretStr

from tests.fixtures.servers import lose_stream
from trainyard_platform.deploy.local.nats import NatsServer, NatsUser
from trainyard_platform.services.runner import publishing
from trainyard_platform.shared.bus import Bus, StreamMissingError
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    JobCancelRequested,
    JobProgress,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import RUNNER, SUBMISSION
from trainyard_platform.shared.outbox import OutboxRelay, enqueue
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture
async def pool(database_url: str, tmp_path: Path) -> AsyncIterator[asyncpg.Pool]:
    async with open_pool(DatabaseSettings(url=database_url), "t") as p:
        await migrate(p, "t", tmp_path)  # the platform's tables (outbox, inbox) only
        yield p


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def _enqueue(pool: asyncpg.Pool, *events: Envelope[JobCancelRequested]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events)


async def _msg_ids(bus: Bus, said_by: Bus | None = None) -> list[str]:
    """The event ids in the stream, in order, each under the ``Nats-Msg-Id`` its publisher's
    bus gives it (``said_by``, or ``bus``)."""
    info = await bus.jetstream.stream_info(bus.settings.stream)
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.jetstream.get_msg(bus.settings.stream, seq)
        assert msg.headers is not None and msg.data is not None
        event_id = json.loads(msg.data)["id"]
        assert msg.headers["Nats-Msg-Id"] == (said_by or bus).msg_id(msg.subject, event_id)
        ids.append(event_id)
    return ids


@contextlib.asynccontextmanager
async def _published(nats_url: str) -> AsyncIterator[list[str]]:
    """The ids of the events published on ``trainyard.>`` while inside, in order (a plain
    subscription on a connection of its own: it sees every publish, duplicates included)."""
    nc = await nats.connect(nats_url)
    ids: list[str] = []

    async def heard(msg: Msg) -> None:
        ids.append(json.loads(msg.data)["id"])

    try:
        sub = await nc.subscribe("trainyard.>", cb=heard)
        await nc.flush()  # subscribed on the server before anything is published
        yield ids
        await sub.unsubscribe()
    finally:
        await nc.close()


async def _lose_stream(nats_url: str, stream: str = "TRAINYARD") -> None:
    nc = await nats.connect(nats_url)
    try:
        await lose_stream(nc.jetstream(), stream)
    finally:
        await nc.close()


async def test_the_relay_publishes_its_retained_rows_again_into_a_remade_stream(
    pool: asyncpg.Pool, bus: Bus, nats_url: str
) -> None:
    relay = OutboxRelay(pool, bus)
    assert await relay.check_stream() == 0  # the first stream seen is only recorded
    events = [_event(f"job-{i}") for i in range(3)]
    await _enqueue(pool, *events)
    assert await relay.relay_once() == 3
    assert await relay.check_stream() == 0

    await _lose_stream(nats_url)
    assert await relay.check_stream() == 3  # the scheduler's bus (here: admin) made it again
    assert await relay.relay_once() == 3
    assert await _msg_ids(bus) == [e.id for e in events]  # same ids, same order
    assert await relay.check_stream() == 0
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT replays FROM outbox_stream") == 1
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0


async def test_a_service_that_may_not_make_the_stream_waits_for_it(
    pool: asyncpg.Pool,
    bus: Bus,
    nats_url: str,
    nats_server: NatsServer,
    nats_settings: NatsSettings,
    nats_service_user: Callable[..., NatsUser],
) -> None:
    user = nats_service_user("submission")
    settings = nats_settings.model_copy(
        update={"url": nats_server.address, "user": user.name, "password": SecretStr(user.password)}
    )
    async with Bus.connect(settings, "submission-under-test") as service:
        relay = OutboxRelay(pool, service)
        event = _event("job-1")
        await _enqueue(pool, event)
        assert await relay.check_stream() == 0
        assert await relay.relay_once() == 1

        await _lose_stream(nats_url)
        assert not service.makes_streams
        with pytest.raises(StreamMissingError):
            await relay.check_stream()
        await bus.ensure_streams()  # the scheduler makes it again
        assert await relay.check_stream() == 1
        assert await relay.relay_once() == 1
        assert await _msg_ids(bus, service) == [event.id]


async def test_the_running_relay_says_everything_again_after_the_loss(
    pool: asyncpg.Pool, bus: Bus, nats_url: str
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(
        OutboxRelay(pool, bus, idle_poll_s=0.05, stream_check_s=0.1).run(stop)
    )
    try:
        before = [_event(f"before-{i}") for i in range(5)]
        await _enqueue(pool, *before)
        await _until(lambda: _count(bus), 5)
        await _lose_stream(nats_url)
        after = _event("after")
        await _enqueue(pool, after)
        await _until(lambda: _count(bus), 6)
        ids = await _msg_ids(bus)
        assert set(ids) == {e.id for e in [*before, after]}
        assert [i for i in ids if i != after.id] == [e.id for e in before]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_consumer_whose_stream_was_lost_is_made_again(bus: Bus, nats_url: str) -> None:
    handled: list[str] = []

    async def handler(envelope: Envelope) -> None:  # type: ignore[type-arg]
        handled.append(envelope.id)

    stop = asyncio.Event()
    consumer = asyncio.create_task(
        bus.consume("lost-test", ["trainyard.job.cancel_requested.v1.>"], handler, stop)
    )
    try:
        first, second = _event("job-1"), _event("job-2")
        await bus.publish(first)
        await _until(lambda: _len(handled), 1)
        await _lose_stream(nats_url)
        # The consumer finds itself gone; this bus (an admin's) makes the stream again.
        await _until(lambda: _stream_exists(bus), 1)
        await bus.publish(second)
        await _until(lambda: _len(handled), 2)
        assert handled == [first.id, second.id]
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 10)


async def test_the_runner_says_again_what_it_said_about_an_allocation(
    bus: Bus, nats_url: str
) -> None:
    started = _started("job-9")
    progress = Envelope.wrap(
        JobProgress(job_id="job-9", allocation_id="a-1", step=1, metrics={"loss": 1.0}),
        source=RUNNER,
        subject="job-9",
    )
    other = _started("job-8", "a-2")
    for envelope in (started, progress, other):
        await publishing.publish_in_trace(bus, envelope, None)
    await _lose_stream(nats_url)
    await bus.ensure_streams()

    # What is said again is watched as it is published (duplicates included), and then
    # read back from the remade stream.
    async with _published(nats_url) as said:
        await publishing.say_again(bus, "a-1")  # its grant came again
        await _until(lambda: _len(said), 1)
        await asyncio.sleep(0.3)
    # The other allocation is not said again, and progress is not kept (the next says it).
    assert said == [started.id]
    ours = {started.id, progress.id, other.id}
    assert [i for i in await _msg_ids(bus) if i in ours] == [started.id]


async def test_a_restarted_runner_says_again_the_start_and_the_end_its_ledger_kept(
    bus: Bus, nats_url: str
) -> None:
    started = _started("job-7")
    ended = Envelope.wrap(
        JobSucceeded(
            job_id="job-7",
            allocation_id="a-1",
            node_id="n1",
            epoch=1,
            finished_at=datetime.now(UTC),
        ),
        source=RUNNER,
        subject="job-7",
        event_id="job-7:end",
    )
    await _lose_stream(nats_url)
    await bus.ensure_streams()

    # This bus's journal is empty, as a restarted runner's is: only the ledger remembers.
    stored: list[publishing.Said] = [(started, None), (ended, None)]
    await publishing.say_again(bus, "a-1", stored)
    assert await _msg_ids(bus) == [started.id, ended.id]


def _started(job_id: str, allocation_id: str = "a-1") -> Envelope[JobStarted]:
    from trainyard_platform.shared.events.payloads import Environment, JobSpec

    spec = JobSpec(
        name="n",
        team="t",
        user="u",
        command=["true"],
        gpus=1,
        gpu_flavor="cpu",
        seed=0,
        max_runtime_seconds=60,
    )
    environment = Environment(
        python="3", torch="2", platform="linux", hostname="h", node_id="n1", gpu_flavor="cpu"
    )
    return Envelope.wrap(
        JobStarted(
            job_id=job_id,
            allocation_id=allocation_id,
            node_id="n1",
            attempt=1,
            epoch=1,
            started_at=datetime.now(UTC),
            code_version="none",
            environment=environment,
            spec=spec,
        ),
        source=RUNNER,
        subject=job_id,
        event_id=f"{job_id}:started",
    )


async def _count(bus: Bus) -> int:
    try:
        info = await bus.jetstream.stream_info(bus.settings.stream)
    except NotFoundError:
        return 0
    return int(info.state.messages)


async def _len(items: list[str]) -> int:
    return len(items)


async def _stream_exists(bus: Bus) -> int:
    try:
        await bus.jetstream.stream_info(bus.settings.stream)
    except NotFoundError:
        return 0
    return 1


async def _until(value: Callable[[], object], expected: int, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while await value() < expected:  # type: ignore[misc]
            await asyncio.sleep(0.05)
