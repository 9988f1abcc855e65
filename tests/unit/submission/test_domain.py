"""The job status machine and how lifecycle events move it."""

from __future__ import annotations

import math

import pytest

from services.submission.domain import (
    TERMINAL,
    TRANSITIONS,
    Apply,
    CostLine,
    Ignore,
    IllegalTransition,
    JobState,
    JobStatus,
    check_transition,
    event_time,
    finite_metrics,
    history_reason,
    judge,
    summarize_cost,
)
from tests.unit.submission import factories as ev

S = JobStatus
JOB = "job-1"


def test_every_status_has_a_row_and_terminal_ones_lead_nowhere() -> None:
    assert set(TRANSITIONS) == set(JobStatus)
    assert {s for s in JobStatus if s.is_terminal} == {S.SUCCEEDED, S.FAILED, S.CANCELLED}
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.QUEUED, S.PENDING),
        (S.PENDING, S.PENDING),
        (S.PENDING, S.SCHEDULED),
        (S.QUEUED, S.SCHEDULED),
        (S.SCHEDULED, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.PREEMPTED),
        (S.PREEMPTED, S.PENDING),
        (S.PREEMPTED, S.SCHEDULED),
        (S.PREEMPTED, S.QUEUED),
        (S.QUEUED, S.CANCELLED),
        (S.RUNNING, S.CANCELLED),
        (S.PREEMPTED, S.CANCELLED),
    ],
)
def test_allowed_transitions(current: JobStatus, target: JobStatus) -> None:
    check_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.QUEUED, S.RUNNING),
        (S.QUEUED, S.SUCCEEDED),
        (S.PENDING, S.RUNNING),
        (S.SCHEDULED, S.SUCCEEDED),
        (S.SCHEDULED, S.PENDING),
        (S.RUNNING, S.PENDING),
        (S.PREEMPTED, S.RUNNING),
        (S.SUCCEEDED, S.RUNNING),
        (S.FAILED, S.SCHEDULED),
        (S.CANCELLED, S.QUEUED),
        (S.SUCCEEDED, S.CANCELLED),
    ],
)
def test_illegal_transitions_raise(current: JobStatus, target: JobStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(current, target)


def test_happy_path_is_applied_step_by_step() -> None:
    state = JobState(S.QUEUED)
    assert judge(state, ev.pending(JOB)) == Apply(S.PENDING, record=True)
    state = JobState(S.PENDING, pending_reason="waiting for 1 free cpu")
    assert judge(state, ev.granted(JOB)) == Apply(S.SCHEDULED, record=True)
    state = JobState(S.SCHEDULED, allocation_id="alloc-1", attempt=1)
    assert judge(state, ev.started(JOB)) == Apply(S.RUNNING, record=True)
    state = JobState(S.RUNNING, allocation_id="alloc-1", attempt=1)
    assert judge(state, ev.succeeded(JOB)) == Apply(S.SUCCEEDED, record=True)


def test_repeated_pending_is_recorded_only_when_the_reason_changes() -> None:
    state = JobState(S.PENDING, pending_reason="quota")
    assert judge(state, ev.pending(JOB, reason="quota", position=2)) == Apply(S.PENDING, False)
    assert judge(state, ev.pending(JOB, reason="no free h200")) == Apply(S.PENDING, True)


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_nothing_moves_a_terminal_job(status: JobStatus) -> None:
    state = JobState(status, allocation_id="alloc-1", attempt=1)
    for event in (
        ev.pending(JOB),
        ev.granted(JOB, "alloc-2", attempt=2),
        ev.started(JOB),
        ev.succeeded(JOB),
        ev.failed(JOB),
        ev.preempted(JOB),
        ev.cancelled(JOB),
    ):
        verdict = judge(state, event)
        assert isinstance(verdict, Ignore)
        assert str(status) in verdict.reason


def test_runner_events_from_another_allocation_are_stale() -> None:
    state = JobState(S.RUNNING, allocation_id="alloc-2", attempt=2)
    for event in (
        ev.started(JOB, "alloc-1"),
        ev.succeeded(JOB, "alloc-1"),
        ev.failed(JOB, "alloc-1"),
        ev.preempted(JOB, "alloc-1"),
    ):
        verdict = judge(state, event)
        assert isinstance(verdict, Ignore)
        assert "alloc-1" in verdict.reason


def test_out_of_order_events_are_ignored() -> None:
    assert isinstance(judge(JobState(S.QUEUED), ev.succeeded(JOB, allocation="x")), Ignore)
    placed = JobState(S.SCHEDULED, allocation_id="alloc-1", attempt=1)
    assert isinstance(judge(placed, ev.pending(JOB)), Ignore)
    assert isinstance(judge(placed, ev.succeeded(JOB)), Ignore)  # never started
    preempted = JobState(S.PREEMPTED, allocation_id="alloc-1", attempt=1)
    assert isinstance(judge(preempted, ev.started(JOB)), Ignore)


def test_duplicate_and_older_grants_are_ignored_but_a_newer_attempt_replaces() -> None:
    running = JobState(S.RUNNING, allocation_id="alloc-2", attempt=2)
    assert isinstance(judge(running, ev.granted(JOB, "alloc-2", attempt=2)), Ignore)
    assert isinstance(judge(running, ev.granted(JOB, "alloc-1", attempt=1)), Ignore)
    # The node was lost and the scheduler placed the job again.
    assert judge(running, ev.granted(JOB, "alloc-3", attempt=3)) == Apply(S.SCHEDULED, True)


def test_preempted_job_can_be_placed_again() -> None:
    state = JobState(S.PREEMPTED, allocation_id="alloc-1", attempt=1)
    assert judge(state, ev.granted(JOB, "alloc-2", attempt=2)) == Apply(S.SCHEDULED, True)
    assert judge(state, ev.pending(JOB)) == Apply(S.PENDING, True)


def test_cancel_applies_from_any_live_status() -> None:
    for status in set(JobStatus) - TERMINAL:
        state = JobState(status, allocation_id="alloc-1", attempt=1)
        assert judge(state, ev.cancelled(JOB)) == Apply(S.CANCELLED, True)


def test_a_job_that_failed_while_cancelling_ends_cancelled_when_the_scheduler_says_so() -> None:
    failed = JobState(S.FAILED, allocation_id="alloc-1", attempt=1, cancel_requested=True)
    assert judge(failed, ev.cancelled(JOB)) == Apply(S.CANCELLED, record=True)
    # Without a cancel request a failure stays a failure.
    plain = JobState(S.FAILED, allocation_id="alloc-1", attempt=1)
    assert isinstance(judge(plain, ev.cancelled(JOB)), Ignore)
    # Nothing else reopens it.
    assert isinstance(judge(failed, ev.granted(JOB, "alloc-2", attempt=2)), Ignore)


def test_event_times_and_history_reasons() -> None:
    grant = ev.granted(JOB)
    assert event_time(grant, ev.at(999)) == grant.granted_at
    assert event_time(ev.cancelled(JOB), ev.at(999)) == ev.at(999)
    assert history_reason(grant) == "attempt 1 on node-1 (GPUs 0,1)"
    assert history_reason(ev.failed(JOB, exit_code=3)) == "process exited (exit code 3)"
    assert history_reason(ev.started(JOB)) is None


def test_non_finite_metrics_are_kept_as_none() -> None:
    assert finite_metrics({"loss": math.nan, "acc": 0.5, "x": math.inf}) == {
        "loss": None,
        "acc": 0.5,
        "x": None,
    }


def test_cost_is_summed_and_final_only_when_every_allocation_is_billed() -> None:
    lines = [CostLine(3600, 2.0, "USD", 2.0), CostLine(1800, 2.0, "USD", 4.0)]
    summary = summarize_cost(lines, allocations=2, status=S.SUCCEEDED)
    assert (summary.gpu_seconds, summary.cost, summary.currency) == (5400, 4.0, "USD")
    assert summary.price_per_gpu_hour == pytest.approx(4.0 * 3600 / 5400)
    assert summary.final
    assert not summarize_cost(lines[:1], allocations=2, status=S.SUCCEEDED).final
    assert not summarize_cost(lines, allocations=2, status=S.RUNNING).final


def test_a_job_cancelled_before_placement_has_a_final_zero_cost() -> None:
    summary = summarize_cost([], allocations=0, status=S.CANCELLED)
    assert (summary.cost, summary.currency, summary.final) == (0, None, True)
