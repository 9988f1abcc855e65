"""``OTEL_METRIC_EXPORT_INTERVAL`` (ms) is the standard variable for how often metrics are
pushed, but the services passed their own 15 s to the SDK, which then never read it: an
operator who set 60000 to push less still got a push every 15 s. It is honoured now (15 s
stays the default), and a value that is not a positive number is refused at start."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from trainyard_platform.shared.metrics import metric_readers
from trainyard_platform.shared.telemetry import OtelExportSettings

_VARIABLES = ("OTEL_METRICS_EXPORTER", "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_SDK_DISABLED")


@pytest.fixture(autouse=True)
def console_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")


def _interval_ms() -> float:
    readers = metric_readers()
    try:
        (pushed,) = [r for r in readers if isinstance(r, PeriodicExportingMetricReader)]
        return pushed._export_interval_millis
    finally:
        for reader in readers:
            reader.shutdown()


def test_the_default_push_is_every_15_s() -> None:
    assert _interval_ms() == 15_000


def test_the_standard_interval_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")
    assert _interval_ms() == 60_000


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_a_bad_interval_is_refused_naming_it(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", value)
    with pytest.raises(ValueError, match="metric_export_interval"):
        OtelExportSettings()
