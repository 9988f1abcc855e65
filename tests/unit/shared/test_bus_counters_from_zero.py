"""A consumer's dead-letter and outage-retry counters exist from its start at 0 (they
appeared only with the first dead letter of a kind: Prometheus read them as unknown and
``increase`` missed that first one)."""

from __future__ import annotations

import re
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.shared import bus as bus_module
from trainyard_platform.shared.bus import DEAD_LETTER_KINDS, Bus
from trainyard_platform.shared.settings import NatsSettings


class FakeNats:
    is_connected = True
    stats: dict[str, int] = {"reconnects": 0}

    def jetstream(self) -> None:
        return None


def test_a_consumer_reports_every_kind_of_dead_letter_and_its_retries_from_zero() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    bus = Bus(FakeNats(), NatsSettings(), meter=meter)  # type: ignore[arg-type]
    bus._counters_from_zero("billing")
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (metric.name, tuple(sorted((point.attributes or {}).items())), point.value)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points  # type: ignore[union-attr]
    }
    assert points == {
        ("trainyard.consumer.outage_retries", (("consumer", "billing"),), 0),
        # Absent until the first outage, the series read as unknown: a dashboard showed no
        # data and a rule over it could not tell a consumer that never paused from none.
        ("trainyard.consumer.paused", (("consumer", "billing"),), 0),
        *(
            ("trainyard.consumer.dead_letters", (("consumer", "billing"), ("kind", k)), 0)
            for k in DEAD_LETTER_KINDS
        ),
    }


def test_every_dead_letter_reason_begins_with_a_listed_kind() -> None:
    source = Path(bus_module.__file__).read_text()
    kinds = re.findall(r'_dead_letter\(\s*consumer,\s*msg,\s*f?"(\w+)', source)
    assert len(kinds) >= 5
    assert set(kinds) == set(DEAD_LETTER_KINDS)
