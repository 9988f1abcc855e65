"""A failed attempt is only an attempt: the scheduler restarts the job or says it failed.

The runner's ``job.failed`` records why an attempt failed; the job ends FAILED only on the
scheduler's own ``job.failed`` (docs/events.md). Late reports of older attempts change
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.submission.conftest import Submission
from tests.unit.submission import factories as ev
from trainyard_platform.services.submission.domain import SCHEDULER_SOURCE

pytestmark = pytest.mark.integration

RUNNER = "trainyard/runner"


def _history(view: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(h["status"], h["reason"]) for h in view["history"]]


async def test_a_restarted_job_runs_again_and_fails_when_the_scheduler_says_so(
    submission: Submission,
) -> None:
    # Attempts as the scheduler numbers them in its events: 0 is the first. The history says
    # "attempt 1" for it, as the scheduler's own reasons do (it said "attempt 0 on node-1"
    # and "attempt 0 failed: ..." above the scheduler's "attempt 1 failed (...); restarting").
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job, "alloc-1", attempt=0), source=SCHEDULER_SOURCE)
    await submission.publish(ev.started(job, "alloc-1", attempt=0), source=RUNNER)
    attempt_1 = ev.failed(
        job, "alloc-1", exit_code=1, reason="exited with status 1", log_tail="boom 1"
    )
    await submission.publish(attempt_1, source=RUNNER)
    await submission.publish(ev.checkpoint(job, 1))  # a marker: all of the above was seen
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    # The attempt failed; the job has not (the scheduler has not decided yet).
    assert view["status"] == "RUNNING" and view["terminal"] is False
    assert view["finished_at"] is None
    assert view["failure"] == {
        "reason": "attempt 1 failed: user_error: exited with status 1",
        "exit_code": 1,
        "log_tail": "boom 1",
        "failure_kind": "user_error",
        "attempt": 0,
    }
    assert view["failed_attempts"] == 1

    restart = "attempt 1 failed (user_error: exited with status 1); restarting in 5 s"
    await submission.publish(
        ev.preempted_by_scheduler(job, "alloc-1", restart), source=SCHEDULER_SOURCE
    )
    # Restarted after its failure: QUEUED again (it was not preempted).
    view = await submission.wait_for(job, lambda v: v["status"] == "QUEUED")
    assert view["failure"]["attempt"] == 0  # why the job is being restarted
    assert view["node"] is None
    await submission.publish(ev.pending(job, "restarting in 5 s"), source=SCHEDULER_SOURCE)
    await submission.publish(ev.granted(job, "alloc-2", attempt=1), source=SCHEDULER_SOURCE)
    await submission.publish(ev.started(job, "alloc-2", attempt=1), source=RUNNER)
    view = await submission.wait_for(job, lambda v: v["status"] == "RUNNING")
    assert view["attempt"] == 1 and view["failure"]["attempt"] == 0

    attempt_2 = ev.failed(
        job,
        "alloc-2",
        exit_code=2,
        reason="exited with status 2",
        log_tail="boom 2",
        finished_at=500,
    )
    await submission.publish(attempt_2, source=RUNNER)
    final_reason = "user_error: exited with status 2; max restarts (1) reached after 2 attempts"
    said = ev.failed(
        job,
        "alloc-2",
        exit_code=2,
        reason=final_reason,
        log_tail="boom 2",
        finished_at=500,
    )
    await submission.publish(said, source=SCHEDULER_SOURCE)
    view = await submission.wait_for(job, lambda v: v["terminal"])

    assert view["status"] == "FAILED"
    assert view["finished_at"].startswith("2024-06-01T12:08:20")
    assert view["failure"] == {
        "reason": final_reason,
        "exit_code": 2,
        "log_tail": "boom 2",
        "failure_kind": "user_error",
        "attempt": 1,
    }
    assert view["failed_attempts"] == 2
    assert _history(view) == [
        ("QUEUED", "submitted"),
        ("SCHEDULED", "attempt 1 on node-1 (GPUs 0,1)"),
        ("RUNNING", None),
        ("FAILED", "attempt 1 failed: user_error: exited with status 1 (exit code 1)"),
        ("QUEUED", restart),
        ("PENDING", "restarting in 5 s"),
        ("SCHEDULED", "attempt 2 on node-1 (GPUs 0,1)"),
        ("RUNNING", None),
        ("FAILED", "attempt 2 failed: user_error: exited with status 2 (exit code 2)"),
        ("FAILED", f"{final_reason} (exit code 2)"),
    ]


async def test_a_platform_error_is_not_restarted_and_the_job_fails(
    submission: Submission,
) -> None:
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job, "alloc-1", attempt=1), source=SCHEDULER_SOURCE)
    runner = ev.failed(
        job,
        "alloc-1",
        exit_code=None,
        reason="bundle abc not found",
        failure_kind="platform_error",
        log_tail="",
    )
    await submission.publish(runner, source=RUNNER)
    await submission.publish(ev.checkpoint(job, 1))  # marker
    view = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert view["status"] == "SCHEDULED"  # the process never ran; the scheduler decides
    assert view["failure"]["failure_kind"] == "platform_error"

    reason = "platform_error: bundle abc not found; platform_error is not restarted (attempt 1)"
    said = ev.failed(
        job, "alloc-1", exit_code=None, reason=reason, failure_kind="platform_error", log_tail=""
    )
    await submission.publish(said, source=SCHEDULER_SOURCE)
    view = await submission.wait_for(job, lambda v: v["terminal"])
    assert view["status"] == "FAILED"
    assert view["started_at"] is None
    assert view["failure"] == {
        "reason": reason,
        "exit_code": None,
        "log_tail": "",
        "failure_kind": "platform_error",
        "attempt": 1,
    }
    assert view["failed_attempts"] == 1
    assert [s for s, _ in _history(view)] == ["QUEUED", "SCHEDULED", "FAILED", "FAILED"]
    assert _history(view)[-1] == ("FAILED", reason)


async def test_a_platform_retry_shows_in_the_view_and_the_job_runs_again(
    submission: Submission,
) -> None:
    # The scheduler retries a platform_error (its own budget, not max_restarts): the view
    # must show why the job went back to the queue, and run it again.
    job = (await submission.submit())["id"]
    await submission.publish(ev.granted(job, "alloc-1", attempt=0), source=SCHEDULER_SOURCE)
    runner = ev.failed(
        job,
        "alloc-1",
        exit_code=None,
        reason="the runner could not record the job's process: No space left on device",
        failure_kind="platform_error",
        log_tail="",
    )
    await submission.publish(runner, source=RUNNER)
    retry = (
        "attempt 1 failed (platform_error: the runner could not record the job's process: "
        "No space left on device); retrying in 5 s (platform retry 1 of 3; max_restarts not "
        "used)"
    )
    await submission.publish(
        ev.preempted_by_scheduler(job, "alloc-1", retry), source=SCHEDULER_SOURCE
    )
    view = await submission.wait_for(job, lambda v: ("QUEUED", retry) in _history(v))
    assert view["status"] == "QUEUED"
    assert view["failure"]["failure_kind"] == "platform_error"
    assert view["failure"]["attempt"] == 0
    assert _history(view)[-1] == ("QUEUED", retry)
    await submission.publish(ev.granted(job, "alloc-2", attempt=1), source=SCHEDULER_SOURCE)
    await submission.publish(ev.started(job, "alloc-2", attempt=1), source=RUNNER)
    await submission.publish(ev.succeeded(job, "alloc-2"), source=RUNNER)
    view = await submission.wait_for(job, lambda v: v["terminal"])
    assert view["status"] == "SUCCEEDED" and view["attempt"] == 1
    assert ("QUEUED", retry) in _history(view)


async def test_late_and_repeated_reports_of_an_older_attempt_change_nothing(
    submission: Submission,
) -> None:
    job = (await submission.submit())["id"]
    attempt_1 = ev.failed(job, "alloc-1", exit_code=1, log_tail="boom 1")
    for payload, source in (
        (ev.granted(job, "alloc-1", attempt=1), SCHEDULER_SOURCE),
        (ev.started(job, "alloc-1", attempt=1), RUNNER),
        (attempt_1, RUNNER),
        (ev.failed(job, "alloc-1", exit_code=1), RUNNER),  # repeated (another event id)
        (ev.preempted_by_scheduler(job, "alloc-1"), SCHEDULER_SOURCE),
        (ev.failed(job, "alloc-1", exit_code=1), RUNNER),  # after the requeue
        (ev.granted(job, "alloc-2", attempt=2), SCHEDULER_SOURCE),
        (ev.started(job, "alloc-2", attempt=2), RUNNER),
    ):
        await submission.publish(payload, source=source)
    await submission.publish(ev.checkpoint(job, 1))  # marker
    before = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 1)
    assert before["status"] == "RUNNING" and before["attempt"] == 2

    # Attempt 1's report once more, after attempt 2 started: from the runner, and a stray
    # copy with the scheduler's source.
    await submission.publish(attempt_1, source=RUNNER)
    await submission.publish(ev.failed(job, "alloc-1", exit_code=9), source=SCHEDULER_SOURCE)
    await submission.publish(ev.checkpoint(job, 2))  # marker
    after = await submission.wait_for(job, lambda v: len(v["checkpoints"]) == 2)

    assert after["status"] == "RUNNING" and after["terminal"] is False
    assert after["finished_at"] is None
    assert after["history"] == before["history"]
    assert after["failure"] == before["failure"]
    assert after["failure"]["attempt"] == 1 and after["failure"]["exit_code"] == 1
    assert after["failed_attempts"] == 1
    assert [s for s, _ in _history(after)] == [
        "QUEUED",
        "SCHEDULED",
        "RUNNING",
        "FAILED",  # attempt 1, once
        "QUEUED",  # restarted after it
        "SCHEDULED",
        "RUNNING",
    ]

    # The job still ends as the scheduler says.
    await submission.publish(ev.succeeded(job, "alloc-2"), source=RUNNER)
    done = await submission.wait_for(job, lambda v: v["terminal"])
    assert done["status"] == "SUCCEEDED"
    assert done["failure"] is None and done["failed_attempts"] == 1
