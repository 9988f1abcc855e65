"""The OTLP/HTTP exporter the standard variables give (``shared.otlp_http``) delivers, to a
real OTLP receiver, the spans a tracer made: names, parents, attributes and events, through
its own request encoding, with the exporter's options (here gzip) read from the environment;
and the SDK's own exporter, in the same process, still encodes the SDK's way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.fixtures.otlp import OtlpReceiver, ReceivedSpan
from trainyard_platform.shared.otlp_http import HttpSpanExporter
from trainyard_platform.shared.telemetry import span_exporters

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def _trace(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("trainyard_platform.shared.bus")
    with tracer.start_as_current_span(
        "trainyard.job.submitted.v1 process",
        kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "nats", "trainyard.gpus": 8, "long": "x" * 500},
    ) as span:
        span.add_event("job.pending", {"reason": "no GPUs free", "position": 2})
        with tracer.start_as_current_span("scheduler grant"):
            pass


def _as_sent(receiver: OtlpReceiver) -> list[tuple[str, str | None, dict, list]]:
    by_id: dict[str, ReceivedSpan] = {s.span_id: s for s in receiver.spans()}
    return sorted(
        (s.name, by_id[s.parent_id].name if s.parent_id else None, s.attributes, s.events)
        for s in by_id.values()
    )


def test_the_spans_made_are_the_spans_received(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    (exporter,) = span_exporters()
    assert isinstance(exporter, HttpSpanExporter) and exporter.fast

    kept = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "scheduler"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))  # one request, both spans
    provider.add_span_processor(SimpleSpanProcessor(kept))
    _trace(provider)
    provider.shutdown()

    received = _as_sent(receiver)
    assert {s.service for s in receiver.spans()} == {"scheduler"}
    assert received == [
        ("scheduler grant", "trainyard.job.submitted.v1 process", {}, []),
        (
            "trainyard.job.submitted.v1 process",
            None,
            {"messaging.system": "nats", "trainyard.gpus": 8, "long": "x" * 500},
            [("job.pending", {"reason": "no GPUs free", "position": 2})],
        ),
    ]
    assert len(kept.get_finished_spans()) == 2


def test_the_sdks_exporter_beside_it_is_unchanged(receiver: OtlpReceiver) -> None:
    HttpSpanExporter(endpoint=receiver.endpoint)  # installs the routing
    provider = TracerProvider(resource=Resource.create({"service.name": "billing"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint)))
    _trace(provider)
    provider.shutdown()
    assert [name for name, *_ in _as_sent(receiver)] == [
        "scheduler grant",
        "trainyard.job.submitted.v1 process",
    ]
