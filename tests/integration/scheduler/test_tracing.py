"""Events a pass says about a job continue the job's trace, whatever triggered the pass."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.scheduler.conftest import Scheduler, make_spec, until
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobPending,
    JobSubmitted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import owner

pytestmark = pytest.mark.integration


@pytest.fixture
def tracing() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the provider is the process's: this processor stays, idle


def trace_id_of(headers: dict[str, str] | None) -> int | None:
    parent = (headers or {}).get("traceparent")
    return int(parent.split("-")[1], 16) if parent else None


async def test_grants_and_pending_notes_join_the_jobs_trace(
    tracing: InMemorySpanExporter, scheduler: Scheduler
) -> None:
    received: dict[str, dict[str, str] | None] = {}

    async def on_message(msg: Any) -> None:
        received[msg.subject] = msg.headers

    await scheduler.bus.nats.subscribe("trainyard.allocation.granted.v1.>", cb=on_message)
    await scheduler.bus.nats.subscribe("trainyard.job.pending.v1.>", cb=on_message)
    await scheduler.heartbeat("n1", gpus=1)
    roots: dict[str, int] = {}
    for job_id in ("first", "second"):
        submitted = JobSubmitted(
            job_id=job_id, spec=make_spec(gpus=1), submitted_at=datetime.now(UTC)
        )
        with trace.get_tracer("test").start_as_current_span(f"submit {job_id}") as root:
            await scheduler.bus.publish(
                Envelope.wrap(submitted, source=owner(submitted), subject=job_id)
            )
        roots[job_id] = root.get_span_context().trace_id

    await scheduler.wait_for(AllocationGranted)
    (note, *_) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "second")
    granted = "trainyard.allocation.granted.v1.n1"
    pending = "trainyard.job.pending.v1.second"
    await until(lambda: granted in received and pending in received)
    assert trace_id_of(received[granted]) == roots["first"]
    assert trace_id_of(received[pending]) == roots["second"]

    # The wait's reason is an event of the scheduler's span in the job's trace.
    (waiting,) = [
        s
        for s in tracing.get_finished_spans()
        if s.name == "scheduler pending"
        and (s.attributes or {}).get("trainyard.job_id") == "second"
    ]
    assert waiting.context is not None and waiting.context.trace_id == roots["second"]
    events = [(e.name, dict(e.attributes or {})) for e in waiting.events]
    assert (
        "job.pending",
        {
            "trainyard.pending.reason": note.reason,
            "trainyard.pending.position": note.position,
            **({"trainyard.pending.blocking": note.blocking} if note.blocking else {}),
        },
    ) in events, events

    # Once the first job ends, the second is granted: its wait is one span of its own trace,
    # from entering the queue to its grant, with the reason it was told; the first, granted
    # by the pass after it arrived, has none.
    (first,) = scheduler.events(AllocationGranted, lambda g: g.job_id == "first")
    ended = JobSucceeded(
        job_id="first",
        allocation_id=first.allocation_id,
        node_id=first.node_id,
        epoch=first.epoch,
        finished_at=datetime.now(UTC),
    )
    await scheduler.send(ended, "first")
    (second,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "second")
    waits = [s for s in tracing.get_finished_spans() if s.name == "scheduler queue wait"]
    assert [(s.attributes or {}).get("trainyard.job_id") for s in waits] == ["second"]
    (wait,) = waits
    assert wait.context is not None and wait.context.trace_id == roots["second"]
    assert wait.start_time is not None and wait.end_time is not None
    assert wait.end_time == int(second.granted_at.timestamp() * 1_000_000_000)
    assert wait.start_time < wait.end_time
    assert (wait.attributes or {})["trainyard.queue.wait_s"] == pytest.approx(
        (wait.end_time - wait.start_time) / 1e9, abs=1e-3
    )
    last = scheduler.events(JobPending, lambda p: p.job_id == "second")[-1]
    told = [(e.name, dict(e.attributes or {})) for e in wait.events]
    assert told == [
        (
            "job.pending",
            {"trainyard.pending.reason": last.reason, "trainyard.pending.position": last.position},
        )
    ]
