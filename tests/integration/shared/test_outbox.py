"""The outbox: a rollback publishes nothing; a crash after commit still publishes once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import asyncpg
import pytest

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.outbox import OutboxRelay, enqueue

pytestmark = pytest.mark.integration


def _event(job_id: str = "job-1") -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def _stream_messages(bus: Bus) -> int:
    info = await bus.jetstream.stream_info("TRAINYARD")
    return info.state.messages


async def test_rollback_publishes_nothing(pool: asyncpg.Pool, bus: Bus) -> None:
    with pytest.raises(RuntimeError):
        async with pool.acquire() as conn, conn.transaction():
            await enqueue(conn, _event())
            raise RuntimeError("the change failed after the event was enqueued")

    assert await OutboxRelay(pool, bus).relay_once() == 0
    assert await _stream_messages(bus) == 0


async def test_a_commit_in_this_process_wakes_the_relay_at_once(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    """No polling and no NOTIFY: the relay, idle for an hour, publishes as soon as the task
    that enqueued returns its connection (after the commit)."""
    stop = asyncio.Event()
    relay = asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=3600).run(stop))
    try:
        await asyncio.sleep(0.5)  # its first look found nothing: it sleeps for the hour now
        async with pool.acquire() as conn, conn.transaction():
            await enqueue(conn, _event())
        async with asyncio.timeout(60):
            while await _stream_messages(bus) < 1:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await relay


async def test_committed_event_published_once_and_marked(pool: asyncpg.Pool, bus: Bus) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, _event())

    relay = OutboxRelay(pool, bus)
    assert await relay.relay_once() == 1
    assert await relay.relay_once() == 0
    assert await _stream_messages(bus) == 1


class _CrashAfterPublish(Bus):
    """A bus whose process 'dies' right after the server accepted the publish."""

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        await super().publish_many(messages)
        raise SystemExit("crashed before marking the rows published")


async def test_crash_between_publish_and_mark_publishes_exactly_once(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    event = _event()
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, event)

    crashing = _CrashAfterPublish(bus.nats, bus._settings)
    with pytest.raises(SystemExit):
        await OutboxRelay(pool, crashing).relay_once()
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 1

    # The restarted relay publishes the row again; JetStream drops the duplicate id.
    assert await OutboxRelay(pool, bus).relay_once() == 1
    assert await _stream_messages(bus) == 1
    msg = await bus.jetstream.get_msg("TRAINYARD", 1)
    assert msg.headers is not None and msg.data is not None
    assert json.loads(msg.data)["id"] == event.id
    assert msg.headers["Nats-Msg-Id"] == bus.msg_id(event.nats_subject, event.id)
