"""A job the scheduler refuses on arrival (``job.failed``, kind ``rejected``, no allocation)
ends FAILED in its team's view, with the reason; it never ran and costs nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.integration.submission.conftest import Submission
from tests.unit.submission import factories as ev
from trainyard_platform.services.submission.domain import SCHEDULER_SOURCE
from trainyard_platform.shared.events.payloads import JobFailed

pytestmark = pytest.mark.integration

REASON = "refused: priority class 'urgent' does not exist; existing: high, low, normal"


def refused(job_id: str) -> JobFailed:
    """What ``services.scheduler.admission.refused`` says."""
    return JobFailed(
        job_id=job_id,
        allocation_id="",
        node_id="",
        epoch=0,
        finished_at=datetime(2025, 1, 1, tzinfo=UTC),
        exit_code=None,
        reason=REASON,
        failure_kind="rejected",
    )


@pytest.mark.parametrize("noted", [False, True], ids=["queued", "pending"])
async def test_a_refused_job_is_failed_with_the_reason(submission: Submission, noted: bool) -> None:
    job = (await submission.submit())["id"]
    if noted:
        await submission.publish(ev.pending(job), source=SCHEDULER_SOURCE)
        await submission.wait_for(job, lambda v: v["status"] == "PENDING")
    await submission.publish(refused(job), source=SCHEDULER_SOURCE)
    view = await submission.wait_for(job, lambda v: v["status"] == "FAILED")
    assert view["terminal"] is True and view["pending"] is None
    assert view["failure"] == {
        "reason": REASON,
        "exit_code": None,
        "log_tail": "",
        "failure_kind": "rejected",
        "attempt": None,
    }
    assert view["failed_attempts"] == 0  # nothing ran
    assert view["finished_at"] is not None and view["attempt"] is None
    assert (view["cost"]["gpu_seconds"], view["cost"]["final"]) == (0, True)
    assert view["history"][-1]["status"] == "FAILED"
    assert view["history"][-1]["reason"] == REASON


async def test_only_the_schedulers_refusal_counts(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    # A runner's report travels on its own node's subject, naming that node.
    by_a_node = refused(job).model_copy(update={"node_id": "n1"})
    await submission.publish(by_a_node, source="trainyard/runner")
    # A marker: the refusal was seen (a scheduler's note, applied to a queued job).
    await submission.publish(ev.pending(job, reason="marker"))
    view = await submission.wait_for(job, lambda v: (v["pending"] or {}).get("reason") == "marker")
    # Still waiting (the marker made it PENDING), not failed by the runner's refusal.
    assert view["status"] == "PENDING" and view["failure"] is None
