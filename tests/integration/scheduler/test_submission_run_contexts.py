"""A run of submissions keeps each job's carried trace context as one handled alone does,
with the scheduler's own tracing off too."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.scheduler.conftest import Scheduler, make_spec
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.handlers import SchedulerHandlers
from trainyard_platform.shared import bus as bus_module
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobSubmitted
from trainyard_platform.shared.events.trust import owner

pytestmark = pytest.mark.integration


def _traced_submission(job_id: str, now: datetime) -> tuple[Delivery, str]:
    payload = JobSubmitted(job_id=job_id, spec=make_spec(), submitted_at=now)
    envelope = Envelope.wrap(payload, source=owner(payload), subject=job_id)
    traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    return Delivery(envelope, {"traceparent": traceparent}), traceparent


async def test_with_tracing_off_a_run_keeps_each_jobs_context_as_one_alone_does(
    scheduler: Scheduler, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OTEL_SDK_DISABLED gives the scheduler a no-op tracer, which still propagates the
    # context an event came with: a submission handled alone keeps its submission's context,
    # so the job's grant and run join the submission's trace in the services that trace.
    # A run of submissions must keep it too (it stored none when the batch span came in).
    monkeypatch.setattr(bus_module, "_tracer", trace.NoOpTracer())
    now = datetime.now(UTC)
    alone, alone_parent = _traced_submission("alone", now)
    a, a_parent = _traced_submission("a", now)
    b, b_parent = _traced_submission("b", now)
    handlers = SchedulerHandlers()
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await handlers.apply([alone], conn)
        await handlers.apply([a, b], conn)

    stored = dict(await scheduler.pool.fetch("SELECT job_id, trace_context FROM jobs"))
    assert stored["alone"] == {"traceparent": alone_parent}
    assert stored["a"] == {"traceparent": a_parent}
    assert stored["b"] == {"traceparent": b_parent}
