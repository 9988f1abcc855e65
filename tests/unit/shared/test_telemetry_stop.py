"""A service's stop waits a bounded time for its last spans: an unreachable collector made
each stop about 20 s longer (the exporters' retries), after a drain of up to 20 s, past the
30 s before a kill."""

from __future__ import annotations

import asyncio
import http.server
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from trainyard_platform.shared import runtime as runtime_module
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


class StuckExporter(SpanExporter):
    """An export that does not return until released (a collector that never answers, as
    an exporter retrying for its timeout looks from outside)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exporting = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.release.wait()
        return SpanExportResult.FAILURE


@pytest.mark.timeout(60)
def test_a_stop_drops_spans_that_cannot_leave_in_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runtime_module, "TELEMETRY_STOP_SECONDS", 0.2)
    exporter = StuckExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=10))
    provider.get_tracer("test").start_span("last work").end()
    assert exporter.exporting.wait(10)
    # Not entered: entering installs the process's tracer and meter providers.
    service = ServiceRuntime("billing", ServiceSettings())
    service._provider = provider
    try:
        with caplog.at_level(logging.WARNING, logger=runtime_module.__name__):
            asyncio.run(service.__aexit__(None, None, None))
        # It returned while the export was still stuck (the SDK would have waited 30 s for
        # the batch worker, then for the exporter), and said what it dropped.
        assert not exporter.release.is_set()
        assert "billing: telemetry not exported within 0.2 s of the stop" in caplog.text
    finally:
        exporter.release.set()


def test_a_stop_that_flushes_in_time_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exported: list[str] = []

    class Recording(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            exported.extend(span.name for span in spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Recording()))
    provider.get_tracer("test").start_span("last work").end()
    service = ServiceRuntime("billing", ServiceSettings())
    service._provider = provider
    with caplog.at_level(logging.WARNING, logger=runtime_module.__name__):
        asyncio.run(service.__aexit__(None, None, None))
    assert exported == ["last work"]  # flushed by the stop (its batch was not due yet)
    assert "telemetry not exported" not in caplog.text


def test_a_stop_flushes_the_meter_provider_and_leaves_it_working() -> None:
    """OpenTelemetry lets a process install one meter provider, once, and a shut-down one
    hands out no-op meters and collects nothing. A stop that shut it down left every later
    runtime of the process (tests run several) without metrics: its ``/metrics`` lacked
    ``trainyard_http_server_duration_seconds``, depending on which test ran first."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    service = ServiceRuntime("billing", ServiceSettings())
    service._meter_provider = provider
    asyncio.run(service.__aexit__(None, None, None))

    provider.get_meter("test").create_counter("stops").add(1)
    data = reader.get_metrics_data()
    assert data is not None
    names = [m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics]
    assert names == ["stops"]


EXIT_AFTER_A_STOP = """
from opentelemetry import metrics
from trainyard_platform.shared.metrics import setup_metrics

provider = setup_metrics("billing")
metrics.get_meter("test").create_counter("stops").add(1)
provider.force_flush(5_000)  # what ServiceRuntime's stop does
print("stopped", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_process_that_ends_after_its_stop_exports_its_metrics_no_more() -> None:
    """The stop's flush is the last export: the process's exit adds none. Left to the SDK's
    exit handler (``MeterProvider(shutdown_on_exit=True)``), the exit made one more export,
    which against a collector that does not answer held the process for the exporter's
    timeout, past the stop's bound (``TELEMETRY_STOP_SECONDS``)."""
    exports: list[str] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            exports.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            **os.environ,
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{server.server_port}/v1/metrics",
        }
        done = subprocess.run(
            [sys.executable, "-c", EXIT_AFTER_A_STOP],
            env=env,
            capture_output=True,
            text=True,
            timeout=50,
            check=False,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert "stopped" in done.stdout
    assert exports == ["/v1/metrics"], exports
