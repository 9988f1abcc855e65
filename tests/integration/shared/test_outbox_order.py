"""The outbox's order contract: events reach the stream in the order they were committed
(the order of their transactions, and within one the order they were enqueued), across
relay batches and through a failure in the middle of a batch."""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg
import pytest
from nats.errors import Error as NatsError

from tests.integration.shared.outbox_stream import cancel_event, stream_ids, unpublished
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.outbox import OutboxRelay, enqueue, enqueue_traced

pytestmark = pytest.mark.integration


async def _relay_all(relay: OutboxRelay) -> list[int]:
    """relay_once until nothing is left; the rows each call dealt with."""
    counts = []
    while count := await relay.relay_once():
        counts.append(count)
    return counts


async def test_events_leave_in_commit_order_across_batches(pool: asyncpg.Pool, bus: Bus) -> None:
    events = [cancel_event(f"job-{i}") for i in range(8)]
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events[0:3])  # several in one call keep their order
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, events[3])
        await enqueue(conn, events[4], events[5])  # and calls within one transaction too
    async with pool.acquire() as conn, conn.transaction():
        await enqueue_traced(conn, [(events[6], {}), (events[7], {"traceparent": "x"})])
    ids = [e.id for e in events]

    stored = await pool.fetch("SELECT event_id FROM outbox ORDER BY seq")
    assert [r["event_id"] for r in stored] == ids

    # Batches smaller than the backlog: the order must hold from one batch to the next.
    assert await _relay_all(OutboxRelay(pool, bus, batch=3)) == [3, 3, 2]
    assert await stream_ids(bus) == ids
    assert await unpublished(pool) == []


async def test_a_later_transaction_never_overtakes_an_earlier_one(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    relay = OutboxRelay(pool, bus, batch=2)
    first, second, third = cancel_event("job-1"), cancel_event("job-2"), cancel_event("job-3")
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, first)
    assert await relay.relay_once() == 1
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, second)
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, third)
    assert await _relay_all(relay) == [2]
    assert await stream_ids(bus) == [first.id, second.id, third.id]


class _FailsFromTheThird(Bus):
    """A bus on which batches fail, and single publishes fail from the third one on, for a
    while: an outage that starts in the middle of a batch."""

    outage = True
    singles = 0

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        batch = list(messages)
        if self.outage:
            if len(batch) > 1:
                raise NatsError("nats: connection closed")
            self.singles += 1
            if self.singles >= 3:
                raise NatsError("nats: connection closed")
        await super().publish_many(batch)


async def test_a_failure_in_the_middle_of_a_batch_keeps_the_order(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    events = [cancel_event(f"job-{i}") for i in range(5)]
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events)
    ids = [e.id for e in events]
    flaky = _FailsFromTheThird(bus.nats, bus._settings)
    relay = OutboxRelay(pool, flaky, batch=10)

    # The batch fails; one at a time the first two go out, the third meets the outage.
    assert await relay.relay_once() == 2
    assert await stream_ids(bus) == ids[:2]
    assert await unpublished(pool) == ids[2:]
    with pytest.raises(NatsError):  # nothing could be dealt with: the failure is raised
        await relay.relay_once()
    assert await unpublished(pool) == ids[2:]

    flaky.outage = False
    assert await _relay_all(relay) == [3]
    assert await stream_ids(bus) == ids
    assert await unpublished(pool) == []
