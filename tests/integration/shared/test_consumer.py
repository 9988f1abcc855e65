"""Consumers: idempotent under redelivery, dead-letter for bad and failing messages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
import pytest

from tests.fixtures.json_log import json_lines
from trainyard_platform.shared.bus import (
    ORIGINAL_SUBJECT_HEADER,
    REASON_HEADER,
    BatchHandler,
    Bus,
    Delivery,
    Handler,
    Reject,
)
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.inbox import idempotent

pytestmark = pytest.mark.integration


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def _consume_until(
    bus: Bus,
    handler: Handler,
    done: Callable[[], Awaitable[bool]],
    timeout: float = 10,
    batches: BatchHandler | None = None,
) -> None:
    """Consume until ``done``: one at a time through ``handler``, or through ``batches``."""
    stop = asyncio.Event()
    subjects = [nats_subject(JobCancelRequested)]
    task = asyncio.create_task(
        bus.consume_batches("test-consumer", subjects, batches, stop)
        if batches
        else bus.consume("test-consumer", subjects, handler, stop)
    )
    try:
        async with asyncio.timeout(timeout):
            while not await done():
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task


async def _dead_letters(bus: Bus) -> list[tuple[str, str, bytes]]:
    info = await bus.jetstream.stream_info("TRAINYARD_DEADLETTER")
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        msg = await bus.jetstream.get_msg("TRAINYARD_DEADLETTER", seq)
        assert msg.headers is not None
        found.append((msg.headers[REASON_HEADER], msg.headers[ORIGINAL_SUBJECT_HEADER], msg.data))
    return found


async def test_redelivered_event_applied_once(pool: asyncpg.Pool, bus: Bus) -> None:
    async with pool.acquire() as conn:
        await conn.execute("CREATE TABLE effects (job_id text)")
    deliveries = 0

    async def apply(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects VALUES ($1)", envelope.subject)

    transactional = idempotent(pool, "test-consumer", apply)

    async def ack_lost_the_first_time(envelope: Envelope[Payload]) -> None:
        nonlocal deliveries
        deliveries += 1
        await transactional([Delivery(envelope)])  # committed...
        if deliveries == 1:
            raise ConnectionError("...but the ack never reached the server")

    await bus.publish(_event("job-1"))

    async def redelivered() -> bool:
        return deliveries >= 2

    await _consume_until(bus, ack_lost_the_first_time, redelivered)
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM effects") == 1


async def test_malformed_events_are_dead_lettered_and_consumption_goes_on(bus: Bus) -> None:
    subject = nats_subject(JobCancelRequested, "job-x")
    await bus.publish_raw(subject, b"{not json", "raw-1", {})
    bad_payload = _event("job-2").model_dump(mode="json")
    bad_payload["data"]["team"] = 42
    import json

    await bus.publish_raw(subject, json.dumps(bad_payload).encode(), "raw-2", {})
    await bus.publish(_event("job-3"))
    handled: list[str] = []

    async def record(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.subject)

    async def good_one_seen() -> bool:
        return handled == ["job-3"]

    await _consume_until(bus, record, good_one_seen)
    letters = await _dead_letters(bus)
    assert len(letters) == 2
    assert "must be valid JSON" in letters[0][0] and letters[0][1] == subject
    assert "data.team" in letters[1][0]


async def test_handler_that_keeps_failing_is_dead_lettered_after_max_deliver(bus: Bus) -> None:
    attempts = 0

    async def always_fails(envelope: Envelope[Payload]) -> None:
        nonlocal attempts
        attempts += 1
        raise ValueError("downstream is broken")

    await bus.publish(_event("job-4"))

    async def dead_lettered() -> bool:
        return len(await _dead_letters(bus)) == 1

    await _consume_until(bus, always_fails, dead_lettered)
    assert attempts == 3  # nats_settings.max_deliver
    reason = (await _dead_letters(bus))[0][0]
    assert "failed 3 times" in reason and "downstream is broken" in reason


async def test_the_lines_about_a_failing_event_name_its_job(bus: Bus) -> None:
    # "will retry", "giving up" and "dead-lettered" were logged after the handler's span had
    # ended: their JSON records had no job_id, though the event was about one job.
    async def always_fails(envelope: Envelope[Payload]) -> None:
        raise ValueError("downstream is broken")

    await bus.publish(_event("job-6"))

    async def dead_lettered() -> bool:
        return len(await _dead_letters(bus)) == 1

    with json_lines("trainyard_platform.shared.bus", "test", logging.WARNING) as log:
        await _consume_until(bus, always_fails, dead_lettered)
    about = [
        line
        for line in log.lines
        if any(said in line["message"] for said in ("will retry", "giving up", "dead-lettered"))
    ]
    assert len(about) == 4, log.lines  # two retries, giving up, the dead letter
    assert {line.get("job_id") for line in about} == {"job-6"}


async def test_a_batch_commits_together_and_a_bad_event_costs_only_itself(
    pool: asyncpg.Pool, bus: Bus
) -> None:
    async with pool.acquire() as conn:
        await conn.execute("CREATE TABLE effects (job_id text)")

    async def apply(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        if envelope.subject == "job-3":
            raise Reject("job-3 can never apply")
        await conn.execute("INSERT INTO effects VALUES ($1)", envelope.subject)

    transactional = idempotent(pool, "test-consumer", apply)
    batch_sizes: list[int] = []

    async def spy(deliveries: Sequence[Delivery]) -> None:
        batch_sizes.append(len(deliveries))
        await transactional(deliveries)

    for i in range(6):
        await bus.publish(_event(f"job-{i}"))

    async def settled() -> bool:
        async with pool.acquire() as conn:
            applied = await conn.fetchval("SELECT count(*) FROM effects")
        return applied == 5 and len(await _dead_letters(bus)) == 1

    async def unused(_: Envelope[Payload]) -> None:
        raise AssertionError("the batch consumer calls the batch handler")

    await _consume_until(bus, unused, settled, batches=spy)
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT job_id FROM effects ORDER BY job_id")
    assert [r["job_id"] for r in rows] == ["job-0", "job-1", "job-2", "job-4", "job-5"]
    # The six were handed over together; the rejected one rolled the batch back, and each
    # was then applied alone (none twice: the inbox of the failed batch rolled back too).
    assert batch_sizes[0] == 6 and batch_sizes[1:] == [1] * 6
    assert "job-3 can never apply" in (await _dead_letters(bus))[0][0]
