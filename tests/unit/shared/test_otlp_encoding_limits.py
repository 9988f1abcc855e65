"""``shared.otlp_encoding.encode_request`` against the OTLP exporter's own encoder where
the SDK's limits dropped attributes, events and links (the counts read from the span's own
lists), and for long string attributes encoded again from what was kept of them."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from trainyard_platform.shared import otlp_encoding
from trainyard_platform.shared.otlp_encoding import encode_request

OTHER = SpanContext(0x1F, 0x2F, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _spans(limits: SpanLimits) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span(
        "crowded",
        attributes={"a": "1", "b": 2, "c": 3.0},
        links=[Link(OTHER, {"x": "1", "y": "2"}), Link(OTHER), Link(OTHER)],
    ) as span:
        for n in range(3):
            span.add_event(f"event {n}", {"k": "v", "n": n})
    with tracer.start_as_current_span("bare"):
        pass
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(SpanLimits(), id="no-limits"),
        pytest.param(
            SpanLimits(
                max_span_attributes=2,
                max_events=1,
                max_links=1,
                max_event_attributes=1,
                max_link_attributes=1,
            ),
            id="some-dropped",
        ),
        pytest.param(
            SpanLimits(max_span_attributes=0, max_events=0, max_links=0), id="all-dropped"
        ),
    ],
)
def test_dropped_counts_are_the_exporters(limits: SpanLimits) -> None:
    spans = _spans(limits)
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    assert ours == encode_spans(spans)


def test_long_strings_encode_the_same_every_time() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("opentelemetry.instrumentation.asyncpg")
    statement = "SELECT " + ", ".join(f"column_{n}" for n in range(40)) + " FROM jobs"
    for text in (statement, statement, "ü" * 70, "ü" * 70, statement + " "):
        with tracer.start_as_current_span(
            "SELECT", kind=SpanKind.CLIENT, attributes={"db.statement": text, "other": text}
        ):
            pass
    spans = list(exporter.get_finished_spans())
    for _ in range(2):
        ours = ExportTraceServiceRequest.FromString(encode_request(spans))
        assert ours == encode_spans(spans)
    texts = [
        kv.value.string_value
        for r in ours.resource_spans
        for s in r.scope_spans
        for span in s.spans
        for kv in span.attributes
        if kv.key == "db.statement"
    ]
    assert texts == [statement, statement, "ü" * 70, "ü" * 70, statement + " "]


def test_only_statements_are_kept_encoded() -> None:
    """A long string of any other attribute (a caller's ``url.path``, an exception's
    message) is encoded where it is: none is kept in the process after its export, and a
    stream of them never pushes the statements out."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    statement = "SELECT " + ", ".join(f"kept_{n}" for n in range(40)) + " FROM jobs"
    with tracer.start_as_current_span("SELECT", attributes={"db.statement": statement}):
        pass
    for n in range(300):
        with tracer.start_as_current_span("GET", attributes={"url.path": f"/v1/{n}/" + "a" * 200}):
            pass
    with tracer.start_as_current_span("SELECT", attributes={"db.query.text": statement}):
        pass
    with tracer.start_as_current_span("SELECT", attributes={"db.statement": statement}):
        pass
    spans = list(exporter.get_finished_spans())
    before = otlp_encoding._long_text.cache_info()
    for span in spans:
        assert ExportTraceServiceRequest.FromString(encode_request([span])) == encode_spans([span])
    after = otlp_encoding._long_text.cache_info()
    assert after.currsize - before.currsize <= 2  # the statement, under each of its keys
    assert after.hits - before.hits >= 1  # the statement's second span: pushed out by none
