"""The outbox at its edges (found by mutation testing, ``bench/mutation.py``): a message of
exactly the bus's limit goes out, one byte more is parked, and a parked row is logged with
everything an operator needs."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.outbox import OutboxRelay, _Message, enqueue

pytestmark = pytest.mark.integration


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def _size(pool: asyncpg.Pool, bus: Bus, event_id: str) -> int:
    row = await pool.fetchrow(
        "SELECT seq, event_id, subject, body, headers FROM outbox WHERE event_id = $1", event_id
    )
    return _Message.of(row).size(bus)


async def _state(pool: asyncpg.Pool, event_id: str) -> tuple[bool, str | None]:
    row = await pool.fetchrow(
        "SELECT published_at, parked_reason FROM outbox WHERE event_id = $1", event_id
    )
    return row["published_at"] is not None, row["parked_reason"]


async def test_a_message_of_exactly_the_limit_goes_out_one_byte_more_is_parked(
    pool: asyncpg.Pool, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    fits, over = _event("job-fits"), _event("job-over")
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, fits)
    size = await _size(pool, bus, fits.id)
    assert await OutboxRelay(pool, bus, max_payload=size).relay_once() == 1
    assert await _state(pool, fits.id) == (True, None)

    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, over)
    size = await _size(pool, bus, over.id)
    with caplog.at_level(logging.ERROR, logger="trainyard_platform.shared.outbox"):
        assert await OutboxRelay(pool, bus, max_payload=size - 1).relay_once() == 1
    reason = f"{size} bytes, more than the bus accepts ({size - 1} bytes)"
    assert await _state(pool, over.id) == (False, reason)
    assert caplog.messages == [
        f"outbox: parked event {over.id} ({over.nats_subject}, {size} bytes), it can never be "
        f"published: {reason} (1 parked rows in all; see outbox.parked_reason)"
    ]
