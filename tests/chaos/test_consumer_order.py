"""Events stay in stream order when a consumer dies with a batch in hand (found by the chaos
suite: a submission service killed while it held a job's grant saw the job's start and end
first, redelivered later, and its view of the job stuck). At most the batch in hand is
unacknowledged (``max_ack_pending``), so what the dead consumer held comes back, after
``ack_wait``, before anything newer."""

from __future__ import annotations

import asyncio

import pytest

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SUBJECTS = ["trainyard.job.cancel_requested.v1.>"]


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def test_a_batch_held_by_a_dead_consumer_comes_back_before_newer_events(bus: Bus) -> None:
    older = [_event(f"older-{i}") for i in range(3)]
    for event in older:
        await bus.publish(event)

    held = asyncio.Event()

    async def dies_holding(deliveries: object) -> None:
        held.set()
        await asyncio.Event().wait()  # hangs until it is killed

    dying = asyncio.create_task(
        bus.consume_batches("ordered", SUBJECTS, dies_holding, asyncio.Event())
    )
    await asyncio.wait_for(held.wait(), 10)
    dying.cancel()  # killed with the batch in hand: nothing acknowledged, nothing handed back
    with pytest.raises(asyncio.CancelledError):
        await dying

    newer = [_event(f"newer-{i}") for i in range(3)]
    for event in newer:
        await bus.publish(event)
    handled: list[str] = []

    async def records(deliveries: list) -> None:  # type: ignore[type-arg]
        handled.extend(d.envelope.id for d in deliveries)

    stop = asyncio.Event()
    consumer = asyncio.create_task(bus.consume_batches("ordered", SUBJECTS, records, stop))
    try:
        async with asyncio.timeout(3 * bus.settings.ack_wait_seconds + 10):
            while len(handled) < 6:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 10)
    assert handled == [e.id for e in [*older, *newer]]
