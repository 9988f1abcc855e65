"""With OTEL_EXPORTER_OTLP_ENDPOINT set, spans leave over OTLP/HTTP (what Jaeger receives)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from trainyard_platform.shared.settings import TelemetrySettings
from trainyard_platform.shared.telemetry import add_exporters

pytestmark = pytest.mark.integration


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_spans_are_exported_to_the_otlp_endpoint(
    collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
    settings = TelemetrySettings()
    assert settings.otlp_endpoint == collector

    provider = TracerProvider(resource=Resource.create({"service.name": "otlp-test-service"}))
    add_exporters(provider, settings)
    with provider.get_tracer("test").start_as_current_span("exported span"):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()

    assert _Collector.received, "the collector received nothing"
    path, content_type, body = _Collector.received[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    assert b"otlp-test-service" in body and b"exported span" in body
