"""The job view names the trace the job's events travel in: the submitting request's."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.submission.conftest import SPEC, Submission
from tests.integration.submission.test_dry_run import _member

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


@pytest.mark.parametrize("who", ["admin", "member"])
async def test_a_trace_the_sampler_dropped_is_no_trace_id_of_the_view(
    submission: Submission, spans: InMemorySpanExporter, who: str
) -> None:
    """A caller's ``traceparent`` flagged not sampled: the parent-based sampler drops the
    submission's trace, so no span of it is recorded and the view names no id to look up;
    the job's events carry the decision onwards. Every way a submission is stored (an
    audited admin's; a member's first, then its remembered one-statement way) and a dry run."""
    auth = submission.auth() if who == "admin" else await _member(submission)
    headers = {**auth, "traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-00"}
    for _ in range(2):
        created = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
        assert created.status_code == 201, created.text
        assert created.json()["trace_id"] is None
        read = await submission.client.get(created.headers["Location"], headers=auth)
        assert read.json()["trace_id"] is None
    dry = await submission.client.post("/v1/jobs?dry_run=true", json=SPEC, headers=headers)
    assert dry.status_code == 200, dry.text
    assert dry.json()["trace_id"] is None
    assert not [s for s in spans.get_finished_spans() if s.name == "POST /v1/jobs"]
    traceparents = await _outbox_traceparents(submission)
    assert len(traceparents) == 2
    assert all(tp.endswith("-00") for tp in traceparents)
