"""Restarts after failures, through NATS and Postgres: a failing job backs off and is placed
again until its restarts are used up; a failure that retrying cannot fix ends it at once."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from tests.integration.scheduler.conftest import Scheduler, Tuned
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    FailureKind,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPending,
    JobPreempted,
)

pytestmark = pytest.mark.integration

BACKOFF_S = 0.5


def failed(grant: AllocationGranted, kind: FailureKind = "user_error") -> JobFailed:
    return JobFailed(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        exit_code=1,
        reason="exit code 1",
        log_tail="Traceback ...",
        failure_kind=kind,
    )


async def job_row(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, status_reason, attempt, restarts, eligible_at, updated_at FROM jobs "
        "WHERE job_id = $1",
        job_id,
    )


async def test_a_failing_job_backs_off_and_restarts_until_max_restarts(
    scheduler_with: Tuned,
) -> None:
    # Passes on a long timer: the loop must wake by itself when the back-off ends.
    scheduler = await scheduler_with(restart_backoff_s=BACKOFF_S, pass_interval_s=60)
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1, max_restarts=2)
    (grant,) = await scheduler.wait_for(AllocationGranted)

    for attempt, backoff in ((1, BACKOFF_S), (2, 2 * BACKOFF_S)):
        await scheduler.send(failed(grant), "job-1")
        row = await job_row(scheduler.pool, "job-1")
        assert (row["status"], row["attempt"], row["restarts"]) == ("QUEUED", attempt, attempt)
        # Backing off: eligible one back-off after the failure was handled.
        waited = (row["eligible_at"] - row["updated_at"]).total_seconds()
        assert waited == pytest.approx(backoff)
        shown = "0.5 s" if attempt == 1 else "1 s"
        expected = f"attempt {attempt} failed (user_error: exit code 1); restarting in {shown}"
        assert row["status_reason"] == expected
        # The job's view leaves RUNNING at once, said for the runner...
        (said,) = await scheduler.wait_for(
            JobPreempted, lambda p, a=grant.allocation_id: p.allocation_id == a
        )
        assert said.reason == expected
        # ... and while it waits, its note says why and until when.
        (note,) = await scheduler.wait_for(
            JobPending, lambda p, n=attempt: f"(attempt {n + 1}, restart {n} of 2)" in p.reason
        )
        assert note.reason.startswith(
            f"restarting after a failure (attempt {attempt + 1}, restart {attempt} of 2)"
        )
        assert note.reason.endswith(f"eligible at {row['eligible_at']:%H:%M:%S} UTC")
        assert note.estimated_start == row["eligible_at"]
        assert note.blocking == "restart back-off"
        # Placed again once eligible, not before, with a new epoch.
        grants = await scheduler.wait_for(AllocationGranted, count=attempt + 1)
        regrant = grants[-1]
        assert regrant.attempt == attempt and regrant.epoch > grant.epoch
        assert regrant.granted_at >= row["eligible_at"]
        late = (regrant.granted_at - row["eligible_at"]).total_seconds()
        assert late < 5, f"placed {late:.1f} s after it became eligible"
        assert (await job_row(scheduler.pool, "job-1"))["eligible_at"] is None
        grant = regrant

    # The third attempt's failure uses up the restarts: FAILED, said by the scheduler.
    await scheduler.send(failed(grant), "job-1")
    row = await job_row(scheduler.pool, "job-1")
    final = "user_error: exit code 1; max restarts (2) reached after 3 attempts"
    assert (row["status"], row["status_reason"], row["restarts"]) == ("FAILED", final, 2)
    (said_failed,) = await scheduler.wait_for(JobFailed, lambda f: f.reason == final)
    assert (said_failed.allocation_id, said_failed.failure_kind) == (
        grant.allocation_id,
        "user_error",
    )
    assert (said_failed.exit_code, said_failed.log_tail) == (1, "Traceback ...")
    # Every attempt was billed, each as a failure.
    released = await scheduler.wait_for(AllocationReleased, count=3)
    assert [r.outcome for r in released] == ["failed"] * 3
    assert len({r.allocation_id for r in released}) == 3
    assert len(scheduler.events(AllocationGranted)) == 3


async def test_a_restart_after_a_preemption_names_the_attempt_the_history_shows(
    scheduler_with: Tuned,
) -> None:
    # The reasons counted restarts used, not attempts: a job preempted once, then failing on
    # its second attempt, was said "attempt 1 failed (...)" and "restarting after a failure
    # (attempt 2 of 3)" while its history showed attempt 2 placed and failed.
    scheduler = await scheduler_with(restart_backoff_s=BACKOFF_S)
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1, max_restarts=2)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    preempted = JobPreempted(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        reason="preempted for job j-high",
    )
    await scheduler.send(preempted, "job-1")
    second = (await scheduler.wait_for(AllocationGranted, count=2))[-1]
    assert second.attempt == 1
    await scheduler.send(failed(second), "job-1")
    row = await job_row(scheduler.pool, "job-1")
    expected = "attempt 2 failed (user_error: exit code 1); restarting in 0.5 s"
    assert (row["status"], row["status_reason"], row["restarts"]) == ("QUEUED", expected, 1)
    (note,) = await scheduler.wait_for(
        JobPending, lambda p: p.reason.startswith("restarting after a failure")
    )
    assert note.reason.startswith("restarting after a failure (attempt 3, restart 1 of 2)")


async def test_a_platform_failure_is_retried_apart_from_max_restarts_then_fails_saying_so(
    scheduler_with: Tuned,
) -> None:
    # Before: a platform_error failed the job at once ("platform_error is not restarted"),
    # even with max_restarts left, so a node's full disk failed the tenant's job for good.
    scheduler = await scheduler_with(restart_backoff_s=BACKOFF_S, platform_retries=2)
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1, max_restarts=0)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    for retry in (1, 2):
        await scheduler.send(failed(grant, "platform_error"), "job-1")
        row = await job_row(scheduler.pool, "job-1")
        shown = "0.5 s" if retry == 1 else "1 s"
        expected = (
            f"attempt {retry} failed (platform_error: exit code 1); retrying in {shown} "
            f"(platform retry {retry} of 2; max_restarts not used)"
        )
        assert (row["status"], row["status_reason"], row["restarts"]) == ("QUEUED", expected, 0)
        assert row["eligible_at"] is not None  # it backs off, as a restart does
        platform_retries = await scheduler.pool.fetchval(
            "SELECT platform_retries FROM jobs WHERE job_id = 'job-1'"
        )
        assert platform_retries == retry
        (said,) = await scheduler.wait_for(
            JobPreempted, lambda p, a=grant.allocation_id: p.allocation_id == a
        )
        assert said.reason == expected
        (note,) = await scheduler.wait_for(
            JobPending, lambda p, n=retry: f"platform retries {n})" in p.reason
        )
        assert note.reason.startswith(
            f"restarting after a failure (attempt {retry + 1}, restart 0 of 0, "
            f"platform retries {retry})"
        )
        grant = (await scheduler.wait_for(AllocationGranted, count=retry + 1))[-1]
        assert grant.attempt == retry
    await scheduler.send(failed(grant, "platform_error"), "job-1")
    final = (
        "platform_error: exit code 1; failed through the platform 3 times "
        "(platform retries: 2, all used; attempt 3)"
    )
    row = await job_row(scheduler.pool, "job-1")
    assert (row["status"], row["status_reason"], row["restarts"]) == ("FAILED", final, 0)
    (said_failed,) = await scheduler.wait_for(JobFailed, lambda f: f.reason == final)
    assert said_failed.failure_kind == "platform_error"
    released = await scheduler.wait_for(AllocationReleased, count=3)
    assert [r.outcome for r in released] == ["failed"] * 3


@pytest.mark.parametrize("kind", ["max_runtime"])
async def test_a_failure_retrying_cannot_fix_fails_at_once(
    scheduler: Scheduler, kind: FailureKind
) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1, max_restarts=3)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.send(failed(grant, kind), "job-1")
    row = await job_row(scheduler.pool, "job-1")
    reason = f"{kind}: exit code 1; {kind} is not restarted (attempt 1)"
    assert (row["status"], row["status_reason"], row["restarts"]) == ("FAILED", reason, 0)
    assert row["eligible_at"] is None
    (said,) = await scheduler.wait_for(JobFailed, lambda f: f.reason == reason)
    assert said.failure_kind == kind
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert released.outcome == "failed"
    assert scheduler.events(JobPreempted) == []
    assert len(scheduler.events(AllocationGranted)) == 1


async def test_a_job_whose_requirements_cannot_be_met_fails_at_once(
    scheduler: Scheduler,
) -> None:
    # The runner's job.failed for requirements that cannot be met (user_error, exit code
    # null: the job never ran) requeued it to fail the same way, max_restarts times.
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1, max_restarts=3)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    unmet = failed(grant).model_copy(
        update={"exit_code": None, "reason": "could not build the job's environment"}
    )
    await scheduler.send(unmet, "job-1")
    reason = (
        "user_error: could not build the job's environment; user_error of a job that never "
        "ran is not restarted (attempt 1)"
    )
    (said,) = await scheduler.wait_for(JobFailed, lambda f: f.reason == reason)
    assert said.failure_kind == "user_error"
    row = await job_row(scheduler.pool, "job-1")
    assert (row["status"], row["restarts"]) == ("FAILED", 0)
    assert scheduler.events(JobPreempted) == []
    assert len(scheduler.events(AllocationGranted)) == 1


async def test_a_failure_while_cancelling_ends_cancelled(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1, max_restarts=3)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.send(JobCancelRequested(job_id="job-1", team="vision", user="ada"), "job-1")
    await scheduler.send(failed(grant), "job-1")
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "CANCELLED"
    await scheduler.wait_for(JobCancelled)
    assert len(scheduler.events(AllocationGranted)) == 1
