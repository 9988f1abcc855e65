"""OpenTelemetry set-up and W3C trace-context propagation over NATS and HTTP headers.

Contract:
- ``setup_tracing`` installs a tracer provider named after the service; spans go to an
  OTLP/HTTP collector when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, to a JSON-lines file
  when ``TRAINYARD_TELEMETRY_SPAN_FILE`` is set, and nowhere otherwise.
- ``inject``/``extract`` carry the current context in a plain ``dict[str, str]`` of headers
  (``traceparent``/``tracestate``), the same for NATS messages and HTTP requests, so one job
  is one trace across every service it touches.
- ``setup_metrics`` installs a meter provider that exports to the same OTLP collector
  (``/v1/metrics``, every ``METRICS_EXPORT_SECONDS``) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
  set; ``meter(name)`` is where code gets its instruments (no-ops without a provider). The
  alert metrics are the bus's (``shared.bus``): ``trainyard.consumer.paused`` (a consumer
  waiting out an outage), ``trainyard.consumer.outage_retries`` and
  ``trainyard.consumer.dead_letters``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from shared.settings import TelemetrySettings
from trainyard.tracing import PROPAGATOR
from trainyard.tracing import inject as inject

# Injecting is the client distribution's (its HTTP client sends the context too); one
# propagator and one ``inject`` for both.
_PROPAGATOR = PROPAGATOR
METRICS_EXPORT_SECONDS = 15.0


def setup_tracing(service_name: str, settings: TelemetrySettings) -> TracerProvider:
    """Install and return the process's tracer provider; call ``shutdown()`` on exit.

    When an SDK provider is already installed (several services in one test process), the
    exporters are added to it instead: OpenTelemetry allows one global provider per process.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        add_exporters(current, settings)
        return current
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    add_exporters(provider, settings)
    trace.set_tracer_provider(provider)
    return provider


def add_exporters(provider: TracerProvider, settings: TelemetrySettings) -> None:
    """Attach the exporters ``settings`` ask for (OTLP/HTTP, JSON-lines file) to ``provider``."""
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if settings.span_file:
        # Simple (synchronous) processor: a span is on disk as soon as it ends, so tests
        # can read it without waiting for a batch flush.
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(settings.span_file)))


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def setup_metrics(service_name: str, settings: TelemetrySettings) -> MeterProvider | None:
    """Install a meter provider exporting over OTLP/HTTP when the collector is configured;
    return it (call ``shutdown()`` on exit), or None when metrics stay in-process no-ops or a
    provider is installed already (one per process)."""
    if not settings.otlp_endpoint or isinstance(metrics.get_meter_provider(), MeterProvider):
        return None
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    endpoint = settings.otlp_endpoint.rstrip("/") + "/v1/metrics"
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=endpoint),
        export_interval_millis=METRICS_EXPORT_SECONDS * 1000,
    )
    provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": service_name})
    )
    metrics.set_meter_provider(provider)
    return provider


def meter(name: str) -> metrics.Meter:
    """The meter instruments of module ``name`` come from (the process's provider)."""
    return metrics.get_meter(name)


def extract(headers: dict[str, str] | None) -> otel_context.Context:
    """The trace context carried by ``headers`` (an empty context when there is none)."""
    return _PROPAGATOR.extract(dict(headers or {}))


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one JSON object per line (several processes may share
    the file: each line is written with a single ``write`` call in append mode)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The fields of a span that tests and humans read."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "service": span.resource.attributes.get("service.name"),
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "kind": span.kind.name,
        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
        "start_ns": span.start_time,
        "end_ns": span.end_time,
    }


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
