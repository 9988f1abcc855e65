"""``shared.telemetry.extract`` answers as the W3C propagator does, for every header it may
meet: the plain ``traceparent`` it reads itself and everything it hands to the propagator."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from trainyard_platform.shared import telemetry

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"

HEADERS: list[Any] = [
    None,
    {},
    {"other": "x"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-00"},
    {"traceparent": f"00-{TRACE}-{SPAN}-ff"},
    {"traceparent": f"00-{TRACE}-{SPAN}-03", "Nats-Msg-Id": "event-1"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=a,other=b"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "not a tracestate"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": ""},
    {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},
    {"traceparent": f"00-{TRACE.upper()}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01-extra"},
    {"traceparent": f"01-{TRACE}-{SPAN}-01-extra"},
    {"traceparent": f"01-{TRACE}-{SPAN}-01"},
    {"traceparent": f"ff-{TRACE}-{SPAN}-01"},
    {"traceparent": f" \t00-{TRACE}-{SPAN}-01\t "},
    {"traceparent": f"00-{TRACE}-{SPAN}-01\n"},
    {"traceparent": f"00-{TRACE[:-1]}-{SPAN}-01"},
    {"traceparent": f"00_{TRACE}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-1"},
    {"traceparent": ""},
    {"traceparent": [f"00-{TRACE}-{SPAN}-01"]},
    {"Traceparent": f"00-{TRACE}-{SPAN}-01"},
]


def _seen(context: otel_context.Context) -> tuple[Any, ...]:
    """Everything a context from a propagator holds: its keys, and the span's context and
    type (``SpanContext`` compares ids, remoteness, flags and the trace state)."""
    span = trace.get_current_span(context)
    return (sorted(context), type(span), span.get_span_context(), type(context))


@pytest.mark.parametrize("headers", HEADERS, ids=[repr(h) for h in HEADERS])
def test_extract_answers_as_the_propagator(headers: Any) -> None:
    expected = TraceContextTextMapPropagator().extract(headers or {})
    assert _seen(telemetry.extract(headers)) == _seen(expected)


def test_a_plain_traceparent_is_a_remote_parent_made_current() -> None:
    context = telemetry.extract({"traceparent": f"00-{TRACE}-{SPAN}-01"})
    parent = trace.get_current_span(context).get_span_context()
    assert (parent.trace_id, parent.span_id) == (int(TRACE, 16), int(SPAN, 16))
    assert parent.is_remote and parent.trace_flags.sampled and not parent.trace_state
    token = otel_context.attach(context)
    try:
        assert telemetry.inject() == {"traceparent": f"00-{TRACE}-{SPAN}-01"}
    finally:
        otel_context.detach(token)


def test_extract_leaves_the_current_context_out() -> None:
    """As the propagator: the extracted context holds the remote parent alone, never what is
    current where it is called."""
    key = otel_context.create_key("unrelated")
    token = otel_context.attach(otel_context.set_value(key, "here"))
    try:
        context = telemetry.extract({"traceparent": f"00-{TRACE}-{SPAN}-01"})
        assert otel_context.get_value(key, context) is None
        assert otel_context.get_value(key, telemetry.extract({})) is None
    finally:
        otel_context.detach(token)


@pytest.mark.parametrize(
    "stored",
    [
        {"traceparent": 5},
        {"traceparent": [5]},
        {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": 7},
    ],
    ids=["a number", "a list of numbers", "a number for tracestate"],
)
def test_a_stored_context_with_values_that_are_not_strings_is_no_error(stored: Any) -> None:
    # A job's stored context is JSON: a value there that is not a string is read as absent
    # (its trace starts afresh, or keeps the valid traceparent), never a TypeError that
    # would fail every pass that grants the job.
    parent = trace.get_current_span(telemetry.extract(stored)).get_span_context()
    if isinstance(stored["traceparent"], str):
        assert (parent.trace_id, parent.span_id) == (int(TRACE, 16), int(SPAN, 16))
    else:
        assert not parent.is_valid
