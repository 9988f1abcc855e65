"""The job view names the trace the job's events travel in: the submitting request's."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.submission.conftest import SPEC, Submission

pytestmark = pytest.mark.integration

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def _outbox_traceparents(submission: Submission) -> list[str]:
    async with submission.pool.acquire() as conn:
        rows = await conn.fetch("SELECT headers ->> 'traceparent' AS tp FROM outbox ORDER BY seq")
    return [row["tp"] for row in rows]


async def test_the_view_carries_the_callers_trace_id(
    submission: Submission, spans: InMemorySpanExporter
) -> None:
    headers = {**submission.auth(), "traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"}
    created = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
    assert created.status_code == 201, created.text
    assert created.json()["trace_id"] == CALLER_TRACE
    read = await submission.client.get(created.headers["Location"], headers=submission.auth())
    assert read.json()["trace_id"] == CALLER_TRACE
    # The id the view gives is the one the job.submitted event is published in.
    [traceparent] = await _outbox_traceparents(submission)
    assert traceparent.split("-")[1] == CALLER_TRACE


async def test_a_request_without_a_trace_starts_one_and_the_view_names_it(
    submission: Submission, spans: InMemorySpanExporter
) -> None:
    created = await submission.client.post("/v1/jobs", json=SPEC, headers=submission.auth())
    assert created.status_code == 201, created.text
    trace_id = created.json()["trace_id"]
    assert len(trace_id) == 32 and int(trace_id, 16) != 0
    [server_span] = [s for s in spans.get_finished_spans() if s.name == "POST /v1/jobs"]
    assert server_span.context is not None
    assert format(server_span.context.trace_id, "032x") == trace_id
    [traceparent] = await _outbox_traceparents(submission)
    assert traceparent.split("-")[1] == trace_id
