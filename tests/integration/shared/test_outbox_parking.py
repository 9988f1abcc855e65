"""The outbox parks a row the bus will never take and keeps publishing the others."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable

import asyncpg
import pytest
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.outbox import OutboxRelay, enqueue, parked_count, permanent_failure

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source="test", subject=job_id
    )


async def _insert_raw(pool: asyncpg.Pool, event_id: str, size: int) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO outbox (event_id, subject, body) VALUES ($1, $2, $3)",
            event_id,
            "trainyard.job.cancel_requested.big",
            b"x" * size,
        )


async def _enqueue(pool: asyncpg.Pool, *events: Envelope[JobCancelRequested]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events)


async def _rows(pool: asyncpg.Pool) -> dict[str, tuple[bool, str | None]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT event_id, published_at, parked_reason FROM outbox")
    return {r["event_id"]: (r["published_at"] is not None, r["parked_reason"]) for r in rows}


async def _stream_ids(bus: Bus) -> list[str]:
    info = await bus.jetstream.stream_info("TRAINYARD")
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.jetstream.get_msg("TRAINYARD", seq)
        assert msg.headers is not None and msg.data is not None
        event_id = json.loads(msg.data)["id"]
        assert msg.headers["Nats-Msg-Id"] == bus.msg_id(msg.subject, event_id)
        ids.append(event_id)
    return ids if info.state.messages else []


async def test_a_2_mib_row_is_parked_and_the_next_row_published(
    pool: asyncpg.Pool, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    before, after = _event("job-before"), _event("job-after")
    await _enqueue(pool, before)
    await _insert_raw(pool, "too-big", 2 * MiB)
    await _enqueue(pool, after)

    relay = OutboxRelay(pool, bus)
    assert relay.max_payload() == bus.nats.max_payload > 0
    with caplog.at_level(logging.ERROR, logger="trainyard_platform.shared.outbox"):
        assert await relay.relay_once() == 3
        assert await relay.relay_once() == 0  # parked rows are skipped from then on

    rows = await _rows(pool)
    assert rows[before.id] == (True, None) and rows[after.id] == (True, None)
    published, reason = rows["too-big"]
    assert not published and reason is not None and "more than the bus accepts" in reason
    assert await _stream_ids(bus) == [before.id, after.id]
    assert await parked_count(pool) == 1
    parked_logs = [r for r in caplog.records if "too-big" in r.getMessage()]
    assert len(parked_logs) == 1 and parked_logs[0].levelno == logging.ERROR


async def test_the_running_relay_survives_a_parked_row(pool: asyncpg.Pool, bus: Bus) -> None:
    await _insert_raw(pool, "too-big", 2 * MiB)
    stop = asyncio.Event()
    task = asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=0.05).run(stop))
    try:
        later = _event("job-later")
        await _enqueue(pool, later)
        async with asyncio.timeout(10):
            while (await _rows(pool))[later.id] != (True, None):
                assert not task.done(), task
                await asyncio.sleep(0.05)
        assert (await _rows(pool))["too-big"][1] is not None
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)  # returns normally: it never crashed
    assert await _stream_ids(bus) == [later.id]


async def test_a_configured_limit_below_the_servers_parks_too(pool: asyncpg.Pool, bus: Bus) -> None:
    await _insert_raw(pool, "over-config", 5000)
    small = _event("job-small")
    await _enqueue(pool, small)
    relay = OutboxRelay(pool, bus, max_payload=4096)
    assert relay.max_payload() == 4096
    assert await relay.relay_once() == 2
    rows = await _rows(pool)
    assert rows["over-config"][1] is not None and rows[small.id] == (True, None)


class _RefusingBus(Bus):
    """A bus that refuses one subject for good, or fails everything for a while."""

    refused = ""
    down = False

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        batch = list(messages)
        if self.down:
            raise NatsError("nats: connection closed")
        if any(subject == self.refused for subject, *_ in batch):
            raise MaxPayloadError
        await super().publish_many(batch)


async def test_a_row_the_bus_refuses_for_good_is_parked_in_a_batch(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    first, refused, last = _event("job-first"), _event("job-refused"), _event("job-last")
    await _enqueue(pool, first, refused, last)
    refusing = _RefusingBus(bus.nats, bus._settings)
    refusing.refused = refused.nats_subject
    relay = OutboxRelay(pool, refusing)
    assert await relay.relay_once() == 3
    rows = await _rows(pool)
    assert rows[first.id] == (True, None) and rows[last.id] == (True, None)
    assert rows[refused.id] == (False, "maximum payload exceeded")
    assert await _stream_ids(bus) == [first.id, last.id]


async def test_transient_failures_are_retried_not_parked(pool: asyncpg.Pool, bus: Bus) -> None:
    event = _event("job-1")
    await _enqueue(pool, event)
    down = _RefusingBus(bus.nats, bus._settings)
    down.down = True
    with pytest.raises(NatsError):
        await OutboxRelay(pool, down).relay_once()
    assert (await _rows(pool))[event.id] == (False, None)

    stop = asyncio.Event()
    task = asyncio.create_task(OutboxRelay(pool, down, idle_poll_s=0.05).run(stop))
    await asyncio.sleep(0.3)  # failing, retrying, not crashing
    assert not task.done()
    down.down = False
    async with asyncio.timeout(10):
        while (await _rows(pool))[event.id] != (True, None):
            await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)


def test_which_failures_are_permanent() -> None:
    assert permanent_failure(MaxPayloadError()) == "maximum payload exceeded"
    assert permanent_failure(NatsError("nats: 'Maximum Payload Exceeded'")) is not None
    assert permanent_failure(TimeoutError()) is None
    assert permanent_failure(NatsError("nats: connection closed")) is None
    violation = NatsError('nats: Permissions Violation for Publish to "trainyard.a.b"')
    assert permanent_failure(TimeoutError(), "trainyard.a.b", violation) is not None
    assert permanent_failure(TimeoutError(), "trainyard.other", violation) is None
