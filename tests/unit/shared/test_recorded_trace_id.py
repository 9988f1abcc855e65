"""``recorded_trace_id``: the id of the current trace only when it is recorded.

A job view handed out the id of a trace its sampler dropped (``always_off``, a ratio), and an
operator looked for a trace that no store held."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, TraceIdRatioBased

from trainyard_platform.shared.telemetry import recorded_trace_id


def _inside(sampler: Sampler) -> tuple[str | None, trace.SpanContext]:
    tracer = TracerProvider(sampler=sampler).get_tracer("test")
    with tracer.start_as_current_span("POST /v1/jobs") as span:
        return recorded_trace_id(), span.get_span_context()


def test_a_recorded_trace_is_named() -> None:
    named, context = _inside(ALWAYS_ON)
    assert named == format(context.trace_id, "032x")


@pytest.mark.parametrize("sampler", [ALWAYS_OFF, TraceIdRatioBased(0.0)], ids=["off", "ratio"])
def test_a_dropped_trace_is_none_though_its_context_has_an_id(sampler: Sampler) -> None:
    named, context = _inside(sampler)
    assert context.is_valid and not context.trace_flags.sampled
    assert named is None


def test_outside_a_span_is_none() -> None:
    assert recorded_trace_id() is None
