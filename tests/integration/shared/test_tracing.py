"""Trace context travels in NATS headers: the consumer's span joins the producer's trace."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION

pytestmark = pytest.mark.integration


async def test_consumer_span_continues_the_publishers_trace(
    bus: Bus, spans: InMemorySpanExporter
) -> None:
    event = Envelope.wrap(
        JobCancelRequested(job_id="j", team="t", user="u"), source=SUBMISSION, subject="j"
    )
    with trace.get_tracer("test").start_as_current_span("client request") as root:
        await bus.publish(event)
    trace_id = root.get_span_context().trace_id

    seen = asyncio.Event()
    in_handler: list[int] = []

    async def handler(envelope: Envelope[Payload]) -> None:
        in_handler.append(trace.get_current_span().get_span_context().trace_id)
        seen.set()

    stop = asyncio.Event()
    task = asyncio.create_task(
        bus.consume("trace-test", [nats_subject(JobCancelRequested)], handler, stop)
    )
    await asyncio.wait_for(seen.wait(), 10)
    stop.set()
    await task

    assert in_handler == [trace_id]
    names = {s.name: s for s in spans.get_finished_spans() if s.context.trace_id == trace_id}
    assert f"{event.type} publish" in names and f"{event.type} process" in names
    assert names[f"{event.type} process"].kind == trace.SpanKind.CONSUMER
