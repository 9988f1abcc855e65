"""Sampled gauges report the last reading, and nothing (unknown) once a reading fails."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.shared.metrics import CATALOGUE, MetricSpec
from trainyard_platform.shared.metrics_sampler import Readings, Sampler


def _points(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    data = reader.get_metrics_data()
    points: dict[tuple[tuple[str, str], ...], float] = {}
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for p in metric.data.data_points:
                        points[tuple(sorted((p.attributes or {}).items()))] = p.value  # type: ignore[union-attr]
    return points


async def test_the_last_reading_is_reported_and_a_failed_one_is_unknown() -> None:
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    depth = {"fail": False, "value": 3.0}

    async def read() -> Readings:
        if depth["fail"]:
            raise ConnectionError("database down")
        return [(depth["value"], {"queue": "q1"})]

    sampler.gauge("trainyard.scheduler.queue.depth", read)
    assert _points(reader, "trainyard.scheduler.queue.depth") == {}  # not read yet
    await sampler.sample_once()
    assert _points(reader, "trainyard.scheduler.queue.depth") == {(("queue", "q1"),): 3.0}
    depth["value"] = 5.0
    await sampler.sample_once()
    assert _points(reader, "trainyard.scheduler.queue.depth") == {(("queue", "q1"),): 5.0}
    depth["fail"] = True
    await sampler.sample_once()
    assert _points(reader, "trainyard.scheduler.queue.depth") == {}


def test_a_histogram_cannot_be_sampled() -> None:
    with pytest.raises(ValueError, match="record it where it happens"):
        Sampler(meter=MeterProvider().get_meter("t")).gauge(
            "trainyard.http.server.duration",
            lambda: None,  # type: ignore[arg-type,return-value]
        )


def test_prometheus_names_follow_the_exporter_s_rules() -> None:
    assert CATALOGUE["trainyard.events.handled"].prometheus == "trainyard_events_handled_total"
    assert CATALOGUE["trainyard.outbox.lag"].prometheus == "trainyard_outbox_lag_seconds"
    assert CATALOGUE["trainyard.http.server.duration"].series == {
        "trainyard_http_server_duration_seconds_bucket",
        "trainyard_http_server_duration_seconds_sum",
        "trainyard_http_server_duration_seconds_count",
    }
    spec = MetricSpec("trainyard.x.bytes", "histogram", "By", "size")
    assert spec.prometheus == "trainyard_x_bytes"
