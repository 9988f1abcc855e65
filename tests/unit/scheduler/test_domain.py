"""Scheduler state machines, fencing and what an ended allocation does to its job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainyard_platform.services.scheduler.domain import (
    AllocationStatus,
    EndDecision,
    Failure,
    IllegalTransition,
    JobStatus,
    LiveAllocation,
    allocation_ended,
    end_time,
    fence,
    format_seconds,
    late_release_time,
    release_time,
    restart_backoff,
)
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

LIVE = LiveAllocation("alloc-1", "node-1", epoch=7)


def test_fence_applies_only_to_the_live_allocation_and_epoch() -> None:
    assert fence(LIVE, "alloc-1", 7) is None
    assert fence(LIVE, "alloc-1", 6) == "epoch 6 is stale (live epoch 7)"
    assert fence(LIVE, "alloc-0", 7) == "allocation alloc-0 is not the live one (alloc-1)"
    assert fence(None, "alloc-1", 7) == "the job holds no live allocation"
    assert fence([], "alloc-1", 7) == "the job holds no live allocation"


def test_fence_of_a_gang_applies_to_each_member_with_its_own_epoch() -> None:
    gang = [LIVE, LiveAllocation("alloc-2", "node-2", epoch=8)]
    assert fence(gang, "alloc-1", 7) is None
    assert fence(gang, "alloc-2", 8) is None
    assert fence(gang, "alloc-2", 7) == "epoch 7 is stale (live epoch 8)"
    assert fence(gang, "alloc-3", 8) == "allocation alloc-3 is not the live one (alloc-1, alloc-2)"


def test_a_gang_member_speaks_only_for_its_own_allocation() -> None:
    """The node a report names is the node that sent it (the bus vouches for it): node-1
    knows node-2's allocation and epoch from its grant, and is still not believed of it."""
    gang = [LIVE, LiveAllocation("alloc-2", "node-2", epoch=8)]
    assert fence(gang, "alloc-1", 7, "node-1") is None
    assert fence(gang, "alloc-2", 8, "node-2") is None
    assert (
        fence(gang, "alloc-2", 8, "node-1") == "allocation alloc-2 is node node-2's, not node-1's"
    )
    assert (
        fence(gang, "alloc-1", 7, "node-2") == "allocation alloc-1 is node node-1's, not node-2's"
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (JobStatus.QUEUED, JobStatus.ALLOCATED),
        (JobStatus.QUEUED, JobStatus.CANCELLED),
        (JobStatus.ALLOCATED, JobStatus.RUNNING),
        (JobStatus.RUNNING, JobStatus.QUEUED),
        (JobStatus.RUNNING, JobStatus.CANCELLING),
        (JobStatus.CANCELLING, JobStatus.CANCELLED),
    ],
)
def test_allowed_job_transitions(old: JobStatus, new: JobStatus) -> None:
    assert old.check(new) is new


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (JobStatus.QUEUED, JobStatus.RUNNING),
        (JobStatus.SUCCEEDED, JobStatus.QUEUED),
        (JobStatus.CANCELLED, JobStatus.ALLOCATED),
        (JobStatus.FAILED, JobStatus.RUNNING),
        (JobStatus.CANCELLING, JobStatus.QUEUED),
        (JobStatus.RUNNING, JobStatus.ALLOCATED),
    ],
)
def test_illegal_job_transitions_raise(old: JobStatus, new: JobStatus) -> None:
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        old.check(new)


def test_terminal_states_have_no_way_out() -> None:
    for status in JobStatus:
        if status.is_terminal:
            assert not any(status.can_become(other) for other in JobStatus)


def test_allocation_transitions() -> None:
    assert AllocationStatus.GRANTED.check(AllocationStatus.RUNNING) is AllocationStatus.RUNNING
    assert AllocationStatus.RUNNING.check(AllocationStatus.RELEASED) is AllocationStatus.RELEASED
    with pytest.raises(IllegalTransition):
        AllocationStatus.RELEASED.check(AllocationStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        AllocationStatus.RUNNING.check(AllocationStatus.GRANTED)


@pytest.mark.parametrize(
    ("status", "kind", "job_status", "outcome"),
    [
        (JobStatus.RUNNING, "succeeded", JobStatus.SUCCEEDED, "succeeded"),
        (JobStatus.ALLOCATED, "succeeded", JobStatus.SUCCEEDED, "succeeded"),
        (JobStatus.RUNNING, "failed", JobStatus.QUEUED, "failed"),
        (JobStatus.ALLOCATED, "failed", JobStatus.QUEUED, "failed"),
        (JobStatus.RUNNING, "preempted", JobStatus.QUEUED, "preempted"),
        (JobStatus.RUNNING, "lost", JobStatus.QUEUED, "lost"),
        (JobStatus.CANCELLING, "preempted", JobStatus.CANCELLED, "cancelled"),
        (JobStatus.CANCELLING, "failed", JobStatus.CANCELLED, "cancelled"),
        (JobStatus.CANCELLING, "succeeded", JobStatus.SUCCEEDED, "succeeded"),
        (JobStatus.CANCELLING, "lost", JobStatus.CANCELLED, "lost"),
    ],
)
def test_allocation_ended(
    status: JobStatus, kind: str, job_status: JobStatus, outcome: str
) -> None:
    decision = allocation_ended(status, kind, attempt=0, restarts=0, max_restarts=3)  # type: ignore[arg-type]
    assert (decision.job_status, decision.outcome) == (job_status, outcome)
    assert decision.requeued is (job_status is JobStatus.QUEUED)


def test_lost_node_requeues_until_max_restarts() -> None:
    first = allocation_ended(JobStatus.RUNNING, "lost", attempt=1, restarts=1, max_restarts=2)
    assert first.requeued and first.restart
    assert first.backoff_s == 0.0  # the node is gone: placed again at once
    assert first.reason == "node lost; requeued for attempt 3 (restart 2 of 2)"
    last = allocation_ended(JobStatus.RUNNING, "lost", attempt=2, restarts=2, max_restarts=2)
    assert last.job_status is JobStatus.FAILED
    assert last.reason == "node_lost: node lost; max restarts (2) reached after 3 attempts"
    assert last.failure_kind == "node_lost"
    never = allocation_ended(JobStatus.RUNNING, "lost", attempt=0, restarts=0, max_restarts=0)
    assert never.job_status is JobStatus.FAILED


@pytest.mark.parametrize("kind", ["user_error", "out_of_memory"])
def test_a_failure_requeues_with_back_off_until_max_restarts(kind: str) -> None:
    failure = Failure(kind, "exit code 1")  # type: ignore[arg-type]

    def ended(restarts: int) -> EndDecision:
        return allocation_ended(
            JobStatus.RUNNING,
            "failed",
            attempt=restarts,  # no preemption in between: each attempt failed
            restarts=restarts,
            max_restarts=2,
            failure=failure,
            backoff_base_s=5.0,
            backoff_max_s=300.0,
        )

    first = ended(0)
    assert first == EndDecision(
        JobStatus.QUEUED,
        "failed",
        f"attempt 1 failed ({kind}: exit code 1); restarting in 5 s",
        restart=True,
        backoff_s=5.0,
        failure_kind=kind,  # type: ignore[arg-type]
    )
    second = ended(1)
    assert (second.job_status, second.backoff_s) == (JobStatus.QUEUED, 10.0)
    assert second.reason == f"attempt 2 failed ({kind}: exit code 1); restarting in 10 s"
    last = ended(2)
    assert (last.job_status, last.outcome, last.restart) == (JobStatus.FAILED, "failed", False)
    assert last.reason == f"{kind}: exit code 1; max restarts (2) reached after 3 attempts"
    assert last.failure_kind == kind


@pytest.mark.parametrize("kind", ["max_runtime", "node_lost", "preempted", "cancelled"])
def test_other_failure_kinds_fail_at_once(kind: str) -> None:
    decision = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=0,
        restarts=0,
        max_restarts=3,
        failure=Failure(kind, "bundle sha256 mismatch"),  # type: ignore[arg-type]
    )
    assert (decision.job_status, decision.outcome, decision.restart) == (
        JobStatus.FAILED,
        "failed",
        False,
    )
    assert decision.reason == (
        f"{kind}: bundle sha256 mismatch; {kind} is not restarted (attempt 1)"
    )


def test_a_failure_of_a_job_being_cancelled_cancels_it() -> None:
    decision = allocation_ended(
        JobStatus.CANCELLING, "failed", attempt=0, restarts=0, max_restarts=3, failure=Failure()
    )
    assert (decision.job_status, decision.outcome, decision.restart) == (
        JobStatus.CANCELLED,
        "cancelled",
        False,
    )


def test_failures_and_lost_nodes_share_one_restart_counter() -> None:
    # One restart went to a lost node; the next failure is attempt 2 and uses the last one.
    decision = allocation_ended(
        JobStatus.RUNNING, "failed", attempt=1, restarts=1, max_restarts=1, failure=Failure()
    )
    assert decision.job_status is JobStatus.FAILED
    assert decision.reason == "user_error: failed; max restarts (1) reached after 2 attempts"


def test_the_reasons_name_the_attempt_as_the_history_does_after_a_preemption() -> None:
    # A job preempted once, then failing: its history said "SCHEDULED attempt 2 on ...",
    # "FAILED attempt 2 failed: ...", then the scheduler's "attempt 1 failed (...);
    # restarting", and its wait "restarting after a failure (attempt 2 of 4)" though the next
    # attempt was the third: the reasons counted restarts used, not attempts.
    failure = Failure("user_error", "exit code 1")
    restarted = allocation_ended(
        JobStatus.RUNNING, "failed", attempt=1, restarts=0, max_restarts=1, failure=failure
    )
    assert restarted.reason == "attempt 2 failed (user_error: exit code 1); restarting in 5 s"
    last = allocation_ended(
        JobStatus.RUNNING, "failed", attempt=2, restarts=1, max_restarts=1, failure=failure
    )
    assert last.reason == "user_error: exit code 1; max restarts (1) reached after 3 attempts"
    lost = allocation_ended(JobStatus.RUNNING, "lost", attempt=1, restarts=0, max_restarts=1)
    assert lost.reason == "node lost; requeued for attempt 3 (restart 1 of 1)"
    other = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=1,
        restarts=0,
        max_restarts=3,
        failure=Failure("platform_error", "disk full"),
        max_platform_retries=3,
    )
    assert other.reason == (
        "attempt 2 failed (platform_error: disk full); retrying in 5 s "
        "(platform retry 1 of 3; max_restarts not used)"
    )


@pytest.mark.parametrize("ran", [True, False])
def test_a_platform_failure_is_retried_on_its_own_budget_then_fails_saying_so(ran: bool) -> None:
    # Before: platform_error failed the job at once ("platform_error is not restarted"),
    # whatever max_restarts said, so a node's full disk failed the tenant's job for good.
    failure = Failure("platform_error", "the object store refused", ran=ran)

    def ended(used: int, restarts: int = 0) -> EndDecision:
        return allocation_ended(
            JobStatus.RUNNING,
            "failed",
            attempt=used,
            restarts=restarts,
            max_restarts=0,  # no restarts at all: the platform's retries are apart
            failure=failure,
            backoff_base_s=5.0,
            backoff_max_s=300.0,
            platform_retries=used,
            max_platform_retries=3,
        )

    first = ended(0)
    assert first == EndDecision(
        JobStatus.QUEUED,
        "failed",
        "attempt 1 failed (platform_error: the object store refused); retrying in 5 s "
        "(platform retry 1 of 3; max_restarts not used)",
        restart=False,
        platform_retry=True,
        backoff_s=5.0,
        failure_kind="platform_error",
    )
    third = ended(2)
    assert (third.job_status, third.restart, third.platform_retry) == (
        JobStatus.QUEUED,
        False,
        True,
    )
    assert third.backoff_s == 20.0  # backs off as a restart does
    last = ended(3)
    assert (last.job_status, last.outcome, last.restart, last.platform_retry) == (
        JobStatus.FAILED,
        "failed",
        False,
        False,
    )
    assert last.reason == (
        "platform_error: the object store refused; failed through the platform 4 times "
        "(platform retries: 3, all used; attempt 4)"
    )
    assert last.failure_kind == "platform_error"


def test_platform_retries_and_restarts_do_not_use_each_others_budget() -> None:
    # Every platform retry used: a failure of the job's own code still has its restart.
    own = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=3,
        restarts=0,
        max_restarts=1,
        failure=Failure("user_error", "exited with status 1"),
        platform_retries=3,
        max_platform_retries=3,
    )
    assert (own.job_status, own.restart, own.platform_retry) == (JobStatus.QUEUED, True, False)
    # Every restart used: a platform failure is still retried.
    platform = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=2,
        restarts=2,
        max_restarts=2,
        failure=Failure("platform_error", "disk full"),
        platform_retries=0,
        max_platform_retries=3,
    )
    assert (platform.job_status, platform.restart, platform.platform_retry) == (
        JobStatus.QUEUED,
        False,
        True,
    )


def test_no_platform_retries_fails_a_platform_failure_at_once() -> None:
    decision = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=0,
        restarts=0,
        max_restarts=3,
        failure=Failure("platform_error", "disk full"),
        max_platform_retries=0,
    )
    assert decision.job_status is JobStatus.FAILED
    assert decision.reason == (
        "platform_error: disk full; failed through the platform 1 time "
        "(platform retries: 0, all used; attempt 1)"
    )


def test_a_tenant_input_failure_is_not_retried() -> None:
    # The runner says user_error (exit code None) for a repository, commit or bundle the
    # job named that cannot be had: neither a restart nor a platform retry is spent.
    decision = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=0,
        restarts=0,
        max_restarts=3,
        failure=Failure("user_error", "spec.code.commit: not in the repository", ran=False),
        max_platform_retries=3,
    )
    assert (decision.job_status, decision.restart, decision.platform_retry) == (
        JobStatus.FAILED,
        False,
        False,
    )


def test_restart_backoff_doubles_up_to_its_cap() -> None:
    assert [restart_backoff(r, 5.0, 300.0) for r in range(0, 9)] == [
        0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0,
    ]  # fmt: skip
    assert restart_backoff(1000, 5.0, 300.0) == 300.0
    assert restart_backoff(3, 0.0, 300.0) == 0.0
    assert [format_seconds(s) for s in (0.2, 5.0, 40.0, 80.0, 300.0)] == [
        "0.2 s", "5 s", "40 s", "1.3 min", "5 min",
    ]  # fmt: skip


def test_preemption_does_not_use_up_restarts() -> None:
    decision = allocation_ended(
        JobStatus.RUNNING, "preempted", attempt=5, restarts=5, max_restarts=0
    )
    assert decision.requeued


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.CANCELLED])
def test_a_job_without_gpus_has_nothing_to_end(status: JobStatus) -> None:
    with pytest.raises(IllegalTransition):
        allocation_ended(status, "succeeded", attempt=0, restarts=0, max_restarts=3)


def test_release_time_is_kept_between_grant_and_now() -> None:
    granted = datetime(2025, 1, 1, 12, tzinfo=UTC)
    now = granted + timedelta(hours=1)
    inside = granted + timedelta(minutes=20)
    day = 86_400
    assert release_time(inside, granted, now, day) == inside
    assert release_time(granted - timedelta(minutes=5), granted, now, day) == granted
    assert release_time(now + timedelta(minutes=5), granted, now, day) == now
    # A clock behind the grant still never makes a negative lease.
    assert release_time(inside, granted, granted - timedelta(seconds=1), day) == granted
    # What the job's end says is kept as reported, within the same bounds.
    assert end_time(inside, granted, now) == inside
    assert end_time(now + timedelta(minutes=5), granted, now) == now


def test_release_time_bills_no_attempt_past_its_worst_case() -> None:
    """An allocation held past its grant plus its max_runtime_seconds and the kill grace (a
    long preparation before the runner's limit started, the wait for its last checkpoint's
    upload after it) is billed up to that, the worst case a budget reserves, no further."""
    granted = datetime(2025, 1, 1, 12, tzinfo=UTC)
    limit = 1200
    bound = granted + timedelta(seconds=limit + KILL_GRACE_SECONDS)
    held = bound + timedelta(minutes=25)
    assert release_time(held, granted, held, limit) == bound
    assert release_time(bound, granted, held, limit) == bound
    just_before = bound - timedelta(seconds=1)
    assert release_time(just_before, granted, held, limit) == just_before
    assert end_time(held, granted, held) == held  # the end itself is said as it was


def test_a_job_that_failed_by_its_own_fault_without_running_is_not_restarted() -> None:
    # requirements: [no-such-package==1.0] failed as user_error (exit code null) and was
    # restarted max_restarts times, backing off, though every attempt fails the same way.
    decision = allocation_ended(
        JobStatus.RUNNING,
        "failed",
        attempt=0,
        restarts=0,
        max_restarts=3,
        failure=Failure("user_error", "could not build the job's environment", ran=False),
    )
    assert (decision.job_status, decision.outcome, decision.restart) == (
        JobStatus.FAILED,
        "failed",
        False,
    )
    assert decision.failure_kind == "user_error"
    assert decision.reason == (
        "user_error: could not build the job's environment; user_error of a job that never "
        "ran is not restarted (attempt 1)"
    )


def test_a_late_success_bills_no_longer_than_an_attempt_could_run() -> None:
    """A runner node whose allocation was declared lost said weeks later that it had just
    succeeded: the allocation's bill ran to that moment, weeks of GPUs charged to the job's
    team. No attempt is billed past its spec's max_runtime_seconds and the kill grace from
    its grant (``release_time``), so a late success ends at most that long after its grant;
    never before its release, never after now."""
    granted = datetime(2025, 1, 1, 12, tzinfo=UTC)
    lost = granted + timedelta(minutes=30)
    max_runtime = 3600
    latest = granted + timedelta(seconds=max_runtime + KILL_GRACE_SECONDS)
    weeks = granted + timedelta(weeks=3)
    assert late_release_time(weeks, granted, lost, weeks, max_runtime) == latest
    honest = granted + timedelta(minutes=50)  # finished while cut off, reported weeks later
    assert late_release_time(honest, granted, lost, weeks, max_runtime) == honest
    # A bill is extended, never cut; nor is it extended past now.
    assert late_release_time(granted, granted, lost, weeks, max_runtime) == lost
    soon = lost + timedelta(minutes=5)
    assert late_release_time(weeks, granted, lost, soon, max_runtime) == soon
