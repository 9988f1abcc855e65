"""What a consumer has heard (``Bus.hearing``) on a real NATS JetStream: an idle consumer is
caught up after each empty fetch, though the expired pull request's status reply often
lands in the client's buffer after it; and with a steady flow and an event loop held half
a second at a time (as a scheduling pass holds it), fetches that come back short or empty
while messages wait never pass for caught up, yet the consumer is caught up between
bursts (each burst is published once the one before was handled, so a slow machine only
makes the test longer)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from tests.integration.shared import test_bus_consumers as consumers
from tests.integration.shared.test_bus_consumers import SUBJECT, event
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload

pytestmark = pytest.mark.integration

own_settings = consumers.own_settings  # streams of this test's own
own_bus = consumers.own_bus


@pytest.fixture
async def drained(own_bus: Bus, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[bool]]:
    """Whether each fetch of the bus's consumers left nothing waiting, as the bus judged."""
    judged: list[bool] = []
    fetched = own_bus._fetched

    def spy(consumer: str, asked_at: datetime, drained: bool) -> None:
        judged.append(drained)
        fetched(consumer, asked_at, drained)

    monkeypatch.setattr(own_bus, "_fetched", spy)
    yield judged


async def _noop(envelope: Envelope[Payload]) -> None:
    return None


async def test_an_idle_consumer_is_caught_up_after_each_empty_fetch(
    own_bus: Bus, drained: list[bool]
) -> None:
    stop = asyncio.Event()
    assert own_bus.hearing("idle") is None  # asked: its fetches are judged
    task = asyncio.create_task(own_bus.consume("idle", [SUBJECT], _noop, stop))
    try:
        async with asyncio.timeout(10):
            while len(drained) < 8:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert drained[:8] == [True] * 8


async def test_a_held_event_loop_never_passes_a_backlog_for_caught_up(
    own_bus: Bus, drained: list[bool]
) -> None:
    bus = own_bus
    consumer = "held"
    published: list[tuple[datetime, str]] = []  # when its publish was acknowledged
    handled: set[str] = set()
    wrong: list[str] = []
    stop = asyncio.Event()

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.add(envelope.subject)

    fetched = bus._fetched

    def check(consumer: str, asked_at: datetime, drained: bool) -> None:
        fetched(consumer, asked_at, drained)
        heard = bus.hearing(consumer)
        if heard is None:
            return
        missed = [job for at, job in published if at < heard.through and job not in handled]
        if missed:
            wrong.append(f"through {heard.through}: {len(missed)} published before unhandled")

    bus._fetched = check  # type: ignore[method-assign]

    async def publish() -> None:
        n = 0
        while not stop.is_set():
            burst = [event(f"j{n + i}") for i in range(1500)]
            n += len(burst)
            await bus.publish_many((e.nats_subject, e.to_json(), e.id, {}) for e in burst)
            at = datetime.now(UTC)  # all of the burst was stored by now
            published.extend((at, e.subject) for e in burst)
            # The next burst waits until this one is handled: what is tested is the
            # judgement, not the throughput (a slow machine never caught up in a set time).
            while not stop.is_set() and not handled.issuperset(job for _, job in published):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)

    async def hold_the_loop() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.2)
            time.sleep(0.55)  # noqa: ASYNC251 - a pass holding the event loop, on purpose

    tasks = [
        asyncio.create_task(bus.consume(consumer, [SUBJECT], handle, stop, batch=1024)),
        asyncio.create_task(publish()),
        asyncio.create_task(hold_the_loop()),
    ]
    try:
        async with asyncio.timeout(120):  # three bursts, each handled, however slowly
            while len(published) < 4500 or not handled.issuperset(j for _, j in published):
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # fetches of a caught-up consumer, the loop still held
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*tasks)
    assert wrong == []
    assert len(published) >= 3000
    assert drained.count(True) >= 2, drained  # caught up between bursts
    assert drained.count(False) >= 1, drained  # and not while a burst waited
