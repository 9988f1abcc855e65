"""``shared.outages``: one line when a dependency goes, one a minute while it stays away,
one when it is back, and the gauge ``trainyard.dependency.away`` that says it to
Prometheus (an idle service with PostgreSQL away showed nothing in its metrics: no
consumer had an event in hand, no loop ran)."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.shared import outages
from trainyard_platform.shared.metrics import instrument


def _away(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        str(dict(point.attributes or {})["dependency"]): point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "trainyard.dependency.away"
        for point in metric.data.data_points
    }


def test_an_outage_is_three_lines_and_a_gauge(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(outages, "_away", instrument("trainyard.dependency.away", meter))
    now = [0.0]
    db = outages.Dependency(
        "PostgreSQL", "TRAINYARD_DATABASE_URL", "postgresql", clock=lambda: now[0]
    )
    db.watched()
    assert _away(reader) == {"postgresql": 0}
    with caplog.at_level(logging.WARNING):
        for second in range(0, 90, 5):  # a try every 5 s for 90 s
            now[0] = float(second)
            db.failed(ConnectionRefusedError(111, "Connection refused"))
            assert _away(reader) == {"postgresql": 1}
        now[0] = 95.0
        db.answered()
        db.answered()
    assert _away(reader) == {"postgresql": 0}
    assert caplog.messages == [
        "PostgreSQL (TRAINYARD_DATABASE_URL) unavailable: [Errno 111] Connection refused; "
        "waiting for it",
        "PostgreSQL (TRAINYARD_DATABASE_URL) still unavailable after 60 s: [Errno 111] "
        "Connection refused (11 more failures since the last line)",
        "PostgreSQL (TRAINYARD_DATABASE_URL) answers again after 95 s (18 failures)",
    ]


def test_forget_puts_the_gauge_back_as_well(monkeypatch: pytest.MonkeyPatch) -> None:
    """``forget`` put a dependency back to answering, but the gauge still said away (1):
    the next process in the same interpreter showed an outage it never had, and its own
    failure and answer made the gauge 2, then 1, never 0."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(outages, "_away", instrument("trainyard.dependency.away", meter))
    db = outages.Dependency("PostgreSQL", "TRAINYARD_DATABASE_URL", "postgresql")
    db.watched()
    db.failed(ConnectionRefusedError(111, "Connection refused"))
    assert _away(reader) == {"postgresql": 1}
    db.forget()
    db.forget()  # forgetting what is not away changes nothing
    assert not db.away and _away(reader) == {"postgresql": 0}
    db.failed(ConnectionRefusedError(111, "Connection refused"))
    db.answered()
    assert _away(reader) == {"postgresql": 0}
