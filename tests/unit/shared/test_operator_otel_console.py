"""``OTEL_TRACES_EXPORTER=console`` and ``OTEL_METRICS_EXPORTER=console`` are standard
values (the SDK's own exporters, for a quick look without a collector), but the services
ignored them with a warning: the operator who asked saw nothing. Now spans and metrics go
to standard output (the services' logs are on standard error), alongside OTLP when that is
on too."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from trainyard_platform.shared.metrics import metric_readers
from trainyard_platform.shared.otlp_http import HttpSpanExporter
from trainyard_platform.shared.telemetry import OtelExportSettings, span_exporters

_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_console_spans_are_exported_and_not_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    assert [type(e) for e in span_exporters()] == [ConsoleSpanExporter]
    assert OtelExportSettings().unknown_exporters() == []


def test_console_and_otlp_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp, console")
    assert sorted(type(e).__name__ for e in span_exporters()) == sorted(
        [HttpSpanExporter.__name__, ConsoleSpanExporter.__name__]
    )


@pytest.mark.parametrize("value", ["none,console", "console"])
def test_none_or_a_disabled_sdk_exports_nothing(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    if value == "console":
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert span_exporters() == []


def test_a_console_span_is_one_json_document_on_standard_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    (exporter,) = span_exporters()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("GET /v1/jobs/{job_id}"):
        pass
    out, err = capsys.readouterr()
    assert '"name": "GET /v1/jobs/{job_id}"' in out
    assert err == ""


def test_console_metrics_get_a_reader_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus,console")
    readers = metric_readers()
    consoles = [
        r
        for r in readers
        if isinstance(r, PeriodicExportingMetricReader)
        and isinstance(r._exporter, ConsoleMetricExporter)
    ]
    assert len(consoles) == 1
    assert len(readers) == 2  # Prometheus' and the console's; no OTLP push
    for reader in readers:
        reader.shutdown()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none,console")
    readers = metric_readers()
    assert len(readers) == 1  # the Prometheus scrape is always served
    readers[0].shutdown()
