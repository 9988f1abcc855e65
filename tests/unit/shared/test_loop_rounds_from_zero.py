"""A service's own loop reports its failed rounds of both causes from its start, at 0.

The series appeared with the first failure, at 1: Prometheus's ``increase`` reads no
increase in a series' first sample, so ``TrainyardLoopFailing`` missed every loop's first
failure, and a loop that failed once (retention, the collector: one round an hour) was
never alerted on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.shared import db
from trainyard_platform.shared.db import failed_rounds_from_zero
from trainyard_platform.shared.metrics import instrument

ROOT = Path(__file__).resolve().parents[3]


def test_both_causes_are_reported_at_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(db, "_failed_rounds", instrument("trainyard.loop.failed_rounds", meter))

    failed_rounds_from_zero("retention")

    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (tuple(sorted((point.attributes or {}).items())), point.value)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points  # type: ignore[union-attr]
    }
    assert points == {
        ((("cause", "error"), ("loop", "retention")), 0),
        ((("cause", "outage"), ("loop", "retention")), 0),
    }


def test_every_loop_that_counts_failed_rounds_reports_them_from_its_start() -> None:
    counted: set[str] = set()
    from_zero: set[str] = set()
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]:
        source = path.read_text()
        counted |= set(re.findall(r'log_failed_round\(\s*\w+,\s*"([a-z-]+)"', source))
        from_zero |= set(re.findall(r'failed_rounds_from_zero\(\s*"([a-z-]+)"', source))
    assert len(counted) >= 6
    assert counted == from_zero
