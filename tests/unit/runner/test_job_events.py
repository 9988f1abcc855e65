"""A job's event queue: in order, and metric batches bounded while NATS does not answer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from trainyard_platform.services.runner.publishing import JobEvents
from trainyard_platform.shared.bus import nats_dependency
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobMetrics, JobProgress, MetricPoint

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class StuckBus:
    """A bus whose publishes wait until ``flowing`` is set, recording what went out."""

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.sent: list[Envelope[Payload]] = []
        self.nats_away = nats_dependency()

    async def publish(self, envelope: Envelope[Payload], headers: Any = None) -> None:
        await self.flowing.wait()
        self.sent.append(envelope)


def metrics(seq: int) -> Envelope[Payload]:
    points = [MetricPoint(key="loss", step=seq, time=NOW, value=1.0)] * 10
    payload = JobMetrics(job_id="j", allocation_id="a", node_id="n", seq=seq, points=points)
    return Envelope.wrap(payload, source="trainyard/runner", subject="n")


def progress(step: int) -> Envelope[Payload]:
    payload = JobProgress(job_id="j", allocation_id="a", step=step, metrics={"loss": 1.0})
    return Envelope.wrap(payload, source="trainyard/runner", subject="j")


async def test_metric_batches_beyond_the_bound_are_dropped_and_the_rest_kept_in_order() -> None:
    bus = StuckBus()
    events = JobEvents(bus, None, "j", max_pending_metrics=3)  # type: ignore[arg-type]
    for seq in range(6):
        events.emit(metrics(seq))
        events.emit(progress(seq))
    assert events.dropped_points == 30
    bus.flowing.set()
    await events.close()
    said = [
        (e.data.seq if isinstance(e.data, JobMetrics) else f"p{e.data.step}")  # type: ignore[attr-defined]
        for e in bus.sent
    ]
    assert said == [0, "p0", 1, "p1", 2, "p2", "p3", "p4", "p5"]


async def test_published_batches_make_room_again() -> None:
    bus = StuckBus()
    bus.flowing.set()
    events = JobEvents(bus, None, "j", max_pending_metrics=2)  # type: ignore[arg-type]
    for seq in range(10):
        events.emit(metrics(seq))
        await asyncio.sleep(0)  # the pump publishes as fast as they come
        await asyncio.sleep(0)
    await events.close()
    assert events.dropped_points == 0
    assert [e.data.seq for e in bus.sent] == list(range(10))  # type: ignore[attr-defined]
