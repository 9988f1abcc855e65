"""A busy relay gathers the commits made while it waits into one round (``busy_round_s``),
and its final flush still publishes them when it stops."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.outbox import OutboxRelay, enqueue

pytestmark = pytest.mark.integration


async def _commit(pool: asyncpg.Pool, job_id: str) -> str:
    event: Envelope[Payload] = Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, event)
    return event.id


async def _published_at(pool: asyncpg.Pool, event_id: str) -> object:
    async with pool.acquire() as conn:
        return await conn.fetchval("SELECT published_at FROM outbox WHERE event_id = $1", event_id)


async def test_commits_after_a_busy_round_are_published_together(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    """After a round that published, the next waits ``busy_round_s`` (an hour here) even when
    woken: two commits made meanwhile go out in one round (one UPDATE, one published_at),
    the final flush's. Without the wait the first of them goes out on its own, at once."""
    stop = asyncio.Event()
    relay = OutboxRelay(pool, bus, idle_poll_s=3600, busy_round_s=3600)
    task = asyncio.create_task(relay.run(stop))
    try:
        first = await _commit(pool, "job-1")
        async with asyncio.timeout(60):  # an idle relay woken by a commit starts at once
            while await _published_at(pool, first) is None:
                await asyncio.sleep(0.02)
        second = await _commit(pool, "job-2")
        for _ in range(25):  # a relay without the wait publishes it within milliseconds
            if await _published_at(pool, second) is not None:
                break
            await asyncio.sleep(0.02)
        third = await _commit(pool, "job-3")
    finally:
        stop.set()
        await task
    gathered = await _published_at(pool, second)
    assert gathered is not None
    assert gathered == await _published_at(pool, third)  # one round, one transaction
    assert gathered != await _published_at(pool, first)
    info = await bus.jetstream.stream_info("TRAINYARD")
    assert info.state.messages == 3
