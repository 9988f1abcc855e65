"""The runner's metric batches: no point lost, report order kept, full or old batches go."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from trainyard_platform.services.runner import domain
from trainyard_platform.services.runner.domain import JobIdentity, MetricBatcher
from trainyard_platform.services.runner.metric_limits import MetricLimits
from trainyard_platform.shared.control import MetricsMessage
from trainyard_platform.shared.events import Envelope, parse_envelope
from trainyard_platform.shared.events.payloads import MAX_METRIC_POINTS, MetricPoint

JOB = JobIdentity("job-1", "alloc-1", "node-a", epoch=4, attempt=2)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def point(step: int, value: float = 1.0, key: str = "loss") -> MetricPoint:
    return MetricPoint(key=key, step=step, time=NOW, value=value)


def test_a_full_batch_goes_at_once_and_the_rest_waits() -> None:
    b = MetricBatcher(max_points=3, max_age=1.0)
    ready = b.add([point(i) for i in range(7)], now=0.0)
    assert [(seq, [p.step for p in pts]) for seq, pts in ready] == [(0, [0, 1, 2]), (1, [3, 4, 5])]
    assert b.next_due() == 1.0
    assert b.due(0.5) is None
    due = b.due(1.0)
    assert due is not None and due[0] == 2 and [p.step for p in due[1]] == [6]
    assert b.next_due() is None and b.flush() is None


def test_an_old_batch_goes_with_the_next_point() -> None:
    b = MetricBatcher(max_points=100, max_age=1.0)
    assert b.add([point(0)], now=0.0) == []
    ready = b.add([point(1)], now=1.5)
    assert [[p.step for p in pts] for _, pts in ready] == [[0, 1]]


def test_flush_takes_what_is_held_and_numbers_go_on() -> None:
    b = MetricBatcher(max_points=100, max_age=10.0)
    b.add([point(0), point(1)], now=0.0)
    assert b.flush() == (0, [point(0), point(1)])
    b.add([point(2)], now=20.0)
    assert b.flush() == (1, [point(2)])


def test_every_point_in_order_whatever_the_batch_size() -> None:
    b = MetricBatcher(max_points=7, max_age=5.0)
    sent: list[MetricPoint] = []
    seqs: list[int] = []
    for i in range(100):
        for seq, pts in b.add([point(i, key="a"), point(i, key="b")], now=float(i)):
            seqs.append(seq)
            sent += pts
    held = b.flush()
    assert held is not None
    seqs.append(held[0])
    sent += held[1]
    assert [(p.step, p.key) for p in sent] == [(i, k) for i in range(100) for k in "ab"]
    assert seqs == list(range(len(seqs)))


@pytest.mark.parametrize("size", [0, MAX_METRIC_POINTS + 1])
def test_batch_size_is_bounded(size: int) -> None:
    with pytest.raises(ValueError, match="points"):
        MetricBatcher(max_points=size)


def test_points_keep_nan_and_infinities_and_overlong_keys_never_reach_them() -> None:
    # An over-long key is refused in one place, the job's limits (said in its log); the
    # runner's warning about such keys in its points could no longer fire, and said they
    # were "in its metric log", which they never were.
    message = MetricsMessage(
        step=3, metrics={"loss": math.nan, "grad": math.inf, "x" * 201: 1.0, "lr": 0.1}
    )
    limits = MetricLimits(points_per_second=10, max_keys=10)
    kept = message.model_copy(update={"metrics": limits.keys(message.metrics)})
    points = domain.metric_points(kept, NOW)
    assert [p.key for p in points] == ["loss", "grad", "lr"]
    assert math.isnan(points[0].value) and points[1].value == math.inf
    assert limits.values_dropped_total == 1


def test_a_full_event_fits_the_bus_and_round_trips() -> None:
    points = [
        MetricPoint(key="k" * 200, step=2**62 + i, time=NOW, value=-math.inf)
        for i in range(MAX_METRIC_POINTS)
    ]
    event = domain.metrics_event(JOB, 5, points)
    raw = Envelope.wrap(event, source=domain.SOURCE, subject=JOB.job_id).to_json()
    assert len(raw) < 1024 * 1024
    assert parse_envelope(raw).data == event
    assert domain.metrics_event_id(JOB, 5) == domain.metrics_event_id(JOB, 5)
    assert domain.metrics_event_id(JOB, 5) != domain.metrics_event_id(JOB, 6)
