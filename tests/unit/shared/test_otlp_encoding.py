"""``shared.otlp_encoding.encode_request`` against the OTLP exporter's own encoder: the same
spans (every kind of attribute value, events, links, status, trace state, remote and local
parents, two resources and several scopes interleaved) must give the same request."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from trainyard_platform.shared.otlp_encoding import encode_request

VALUES: dict[str, object] = {
    "text": "nats",
    "empty": "",
    "unicode": "grüße ✓",
    "long": "x" * 300,  # lengths past one varint byte
    "almost": "y" * 0x7D,
    "edge": "z" * 0x7E,  # the AnyValue then needs a two-byte length
    "true": True,
    "false": False,
    "zero": 0,
    "int": 123456789012,
    "negative": -5,
    "float": 0.25,
    "strings": ("a", "b"),
    "ints": (1, -2, 3),
    "floats": (1.5,),
    "bools": (True, False),
    "no strings": (),
}


def _spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    providers = []
    for name in ("scheduler", "billing"):
        provider = TracerProvider(resource=Resource.create({"service.name": name, "n": 1}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        providers.append(provider)
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
    )
    for provider in providers:
        bus = provider.get_tracer(
            "trainyard_platform.shared.bus", "1.0", schema_url="https://example/schema"
        )
        db = provider.get_tracer("opentelemetry.instrumentation.asyncpg")
        parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        with bus.start_as_current_span(
            "trainyard.job.submitted.v1 process",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=VALUES,
        ) as consumer:
            consumer.add_event("job.pending", {"reason": "no GPUs", "position": 3})
            consumer.add_event("bare")
            with db.start_as_current_span("INSERT", kind=SpanKind.CLIENT) as query:
                query.set_status(Status(StatusCode.ERROR, "duplicate key"))
            with bus.start_as_current_span(
                "scheduler grant",
                links=[Link(remote, {"why": "batch"}), Link(consumer.get_span_context())],
            ) as grant:
                grant.set_status(Status(StatusCode.OK))
        with bus.start_as_current_span("root", kind=SpanKind.SERVER):
            pass
    return list(exporter.get_finished_spans())


def _interleaved(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    """Resources and scopes alternating span by span, as a busy process ends them."""
    half = len(spans) // 2
    return [s for pair in zip(spans[:half], spans[half:], strict=True) for s in pair]


@pytest.mark.parametrize("order", ["as ended", "interleaved"])
def test_the_request_is_the_exporters_request(order: str) -> None:
    spans = _spans()
    if order == "interleaved":
        spans = _interleaved(spans)
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    assert ours == encode_spans(spans)
    assert len(ours.resource_spans) == 2
    assert sum(len(s.spans) for r in ours.resource_spans for s in r.scope_spans) == len(spans)


def test_a_value_otlp_cannot_carry_is_left_out_with_its_key() -> None:
    (span, _) = [s for s in _spans() if s.name == "trainyard.job.submitted.v1 process"]
    # Past the SDK's own checks (which keep such values out of spans made the usual way).
    assert span.attributes is not None
    span._attributes = {**span.attributes, "object": object(), "mixed": ("a", object())}  # type: ignore[misc]
    ours = ExportTraceServiceRequest.FromString(encode_request([span]))
    assert ours == encode_spans([span])
    (kept,) = [s for r in ours.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert {a.key for a in kept.attributes} == set(VALUES)


def test_an_empty_batch_is_an_empty_request() -> None:
    assert encode_request([]) == encode_spans([]).SerializePartialToString() == b""
