"""The job status machine and how lifecycle events move it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.unit.submission import factories as ev
from trainyard_platform.services.submission.domain import (
    CANCEL_STOP_REASON,
    SCHEDULER_SOURCE,
    TERMINAL,
    TRANSITIONS,
    Apply,
    AttemptFailed,
    CostLine,
    Ignore,
    IllegalTransition,
    JobState,
    JobStatus,
    LifecycleEvent,
    check_transition,
    event_time,
    failed_attempts,
    failure_line,
    failure_record,
    finite_metrics,
    history_reason,
    is_attempt_failure,
    judge,
    process_ended_at,
    summarize_cost,
)
from trainyard_platform.shared.events.payloads import AllocationGranted, JobFailed

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


def test_the_stop_of_a_job_being_cancelled_is_no_preemption() -> None:
    # Seen on a local stack: a running job cancelled by its user showed "PREEMPTED
    # cancelled" in its history before "CANCELLED cancelled by user" (the runner reports the
    # revocation that stops it as job.preempted); it was never preempted.
    cancelling = JobState(S.RUNNING, allocation_id="alloc-1", attempt=0, cancel_requested=True)
    stopped = ev.preempted(JOB).model_copy(update={"reason": "cancelled"})
    assert isinstance(judge(cancelling, stopped), Ignore)
    assert isinstance(judge(cancelling, stopped, SCHEDULER_SOURCE), Ignore)
    assert judge(cancelling, ev.cancelled(JOB)) == Apply(S.CANCELLED, record=True)
    # Without a cancel request a preemption is one.
    running = JobState(S.RUNNING, allocation_id="alloc-1", attempt=0)
    assert judge(running, ev.preempted(JOB)) == Apply(S.PREEMPTED, record=True)


def test_the_stop_of_a_cancel_heard_before_its_request_is_no_preemption() -> None:
    # The registry's cancel request (said on submission's behalf) may be handled after the
    # runner's report of the stop it caused: redelivered after it failed, or said again
    # after NATS lost its store. The job showed PREEMPTED, and its history kept "preempted"
    # after the scheduler's job.cancelled.
    running = JobState(S.RUNNING, allocation_id="alloc-1", attempt=0)
    stopped = ev.preempted(JOB).model_copy(update={"reason": CANCEL_STOP_REASON})
    assert isinstance(judge(running, stopped), Ignore)
    assert judge(running, ev.cancelled(JOB)) == Apply(S.CANCELLED, record=True)


def test_a_job_that_failed_while_cancelling_ends_cancelled_when_the_scheduler_says_so() -> None:
    failed = JobState(S.FAILED, allocation_id="alloc-1", attempt=1, cancel_requested=True)
    assert judge(failed, ev.cancelled(JOB)) == Apply(S.CANCELLED, record=True)
    # Without a cancel request a failure stays a failure.
    plain = JobState(S.FAILED, allocation_id="alloc-1", attempt=1)
    assert isinstance(judge(plain, ev.cancelled(JOB)), Ignore)
    # Nothing else reopens it.
    assert isinstance(judge(failed, ev.granted(JOB, "alloc-2", attempt=2)), Ignore)


def test_event_times_and_history_reasons() -> None:
    grant = ev.granted(JOB, attempt=0)  # the scheduler's first attempt; people count from 1
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
    # weighted by GPU-seconds: an hour at 2.0 and half an hour at 4.0
    assert summary.price_per_gpu_hour == pytest.approx((2.0 * 3600 + 4.0 * 1800) / 5400)
    assert summary.final
    assert not summarize_cost(lines[:1], allocations=2, status=S.SUCCEEDED).final
    assert not summarize_cost(lines, allocations=2, status=S.RUNNING).final


def test_the_price_is_the_billed_price_not_one_derived_from_the_rounded_cost() -> None:
    # A 1.2-GPU-second job at 0.10/GPU-hour costs 0.0000333..., billed 0.000033 (6 places):
    # the cost over the GPU-hours gave 0.099 (the demo printed "0.0998 USD/GPU-hour").
    # The cost may also hold CPU and memory charges, which are no part of the GPU price.
    lines = [CostLine(1.2, 0.000033, "USD", 0.10)]
    assert summarize_cost(lines, 1, S.SUCCEEDED).price_per_gpu_hour == pytest.approx(0.10)
    with_cpu = [CostLine(3600, 2.5, "USD", 2.0)]
    assert summarize_cost(with_cpu, 1, S.SUCCEEDED).price_per_gpu_hour == pytest.approx(2.0)


def test_the_cost_and_price_carry_no_float_noise() -> None:
    # Seen on a local stack: GET /v1/jobs/{id} said "cost": 0.0030470000000000002 and
    # "price_per_gpu_hour": 0.09999999999999999 for allocations billed at 0.10/GPU-hour,
    # while billing's own answer said 0.003047 and 0.1.
    lines = [
        CostLine(31.938, 0.001323, "USD", 0.10),
        CostLine(12.642455, 0.001724, "USD", 0.10),
        CostLine(0.1, 0.0, "USD", 0.10),
        CostLine(0.2, 0.0, "USD", 0.10),
    ]
    summary = summarize_cost(lines, 4, S.SUCCEEDED)
    assert summary.price_per_gpu_hour == 0.10
    assert summary.cost == 0.003047
    assert summary.gpu_seconds == 44.880455
    mixed = summarize_cost([CostLine(10, 1, "USD", 0.1), CostLine(30, 1, "USD", 0.3)], 2, S.FAILED)
    assert mixed.price_per_gpu_hour == pytest.approx(0.25)


def test_a_job_cancelled_before_placement_has_a_final_zero_cost() -> None:
    summary = summarize_cost([], allocations=0, status=S.CANCELLED)
    assert (summary.cost, summary.currency, summary.final) == (0, None, True)


# --- failures: a runner reports an attempt, the scheduler decides the job -------------------

RUNNER = "trainyard/runner"
SCHEDULER = SCHEDULER_SOURCE


def test_a_runners_failure_records_the_attempt_but_does_not_end_the_job() -> None:
    for status in (S.SCHEDULED, S.RUNNING):
        state = JobState(status, allocation_id="alloc-1", attempt=1)
        assert judge(state, ev.failed(JOB), RUNNER) == AttemptFailed()
        # Any source but the scheduler's reports an attempt (old events had no other).
        assert judge(state, ev.failed(JOB), "test") == AttemptFailed()
        assert judge(state, ev.failed(JOB)) == AttemptFailed()


def test_only_the_schedulers_failure_ends_the_job_failed() -> None:
    running = JobState(S.RUNNING, allocation_id="alloc-1", attempt=3, failed_attempt=3)
    assert judge(running, ev.failed(JOB), SCHEDULER) == Apply(S.FAILED, record=True)
    # A platform error fails before the process ever runs: straight from SCHEDULED.
    placed = JobState(S.SCHEDULED, allocation_id="alloc-1", attempt=1)
    platform = ev.failed(JOB, exit_code=None, failure_kind="platform_error")
    assert judge(placed, platform, RUNNER) == AttemptFailed()
    assert judge(placed, platform, SCHEDULER) == Apply(S.FAILED, record=True)


def test_an_attempts_failure_is_recorded_once() -> None:
    state = JobState(S.RUNNING, allocation_id="alloc-1", attempt=1, failed_attempt=1)
    verdict = judge(state, ev.failed(JOB), RUNNER)
    assert isinstance(verdict, Ignore) and "already recorded" in verdict.reason
    # A failure recorded for an earlier attempt does not hide this one's.
    later = JobState(S.RUNNING, allocation_id="alloc-2", attempt=2, failed_attempt=1)
    assert judge(later, ev.failed(JOB, "alloc-2"), RUNNER) == AttemptFailed()


@pytest.mark.parametrize("source", [RUNNER, SCHEDULER])
def test_a_failure_of_an_older_attempt_never_moves_the_job(source: str) -> None:
    for status in (S.SCHEDULED, S.RUNNING, S.PREEMPTED, S.PENDING):
        state = JobState(status, allocation_id="alloc-2", attempt=2, failed_attempt=1)
        verdict = judge(state, ev.failed(JOB, "alloc-1"), source)
        assert isinstance(verdict, Ignore)
        assert "alloc-1" in verdict.reason


@pytest.mark.parametrize("status", [S.PREEMPTED, S.PENDING, S.QUEUED])
def test_a_late_failure_of_an_attempt_already_requeued_is_ignored(status: JobStatus) -> None:
    # The scheduler said job.preempted (restart) for alloc-1; the job no longer runs it.
    state = JobState(status, allocation_id="alloc-1", attempt=1, failed_attempt=1)
    for source in (RUNNER, SCHEDULER):
        verdict = judge(state, ev.failed(JOB, "alloc-1"), source)
        assert isinstance(verdict, Ignore)
        assert str(status) in verdict.reason


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_a_failure_after_the_end_is_ignored(status: JobStatus) -> None:
    state = JobState(status, allocation_id="alloc-1", attempt=1)
    verdict = judge(state, ev.failed(JOB), RUNNER)
    assert isinstance(verdict, Ignore) and "attempt failure arrived late" in verdict.reason
    assert isinstance(judge(state, ev.failed(JOB), SCHEDULER), Ignore)


def test_a_gang_members_failure_counts_for_the_current_attempt() -> None:
    gang = frozenset({"alloc-a", "alloc-b"})
    state = JobState(S.RUNNING, allocation_id="alloc-a", attempt=1, attempt_allocations=gang)
    assert judge(state, ev.failed(JOB, "alloc-b"), RUNNER) == AttemptFailed()
    assert judge(state, ev.failed(JOB, "alloc-b"), SCHEDULER) == Apply(S.FAILED, True)
    assert isinstance(judge(state, ev.failed(JOB, "alloc-z"), SCHEDULER), Ignore)
    # Other runner events keep to the job's own allocation, as before.
    assert isinstance(judge(state, ev.preempted(JOB, "alloc-b")), Ignore)


def test_a_job_whose_process_failed_while_cancelling_ends_cancelled() -> None:
    state = JobState(S.RUNNING, allocation_id="alloc-1", attempt=1, cancel_requested=True)
    assert judge(state, ev.failed(JOB, exit_code=-15), RUNNER) == AttemptFailed()
    assert judge(state, ev.cancelled(JOB)) == Apply(S.CANCELLED, record=True)


def _play(events: list[tuple[LifecycleEvent, str]]) -> tuple[JobState, list[JobStatus]]:
    """Fold ``(event, source)`` through ``judge`` as the handlers do: the job's state and
    the statuses of its history entries."""
    state = JobState(S.QUEUED)
    history = [S.QUEUED]
    failure: dict[str, object] | None = None
    for event, source in events:
        verdict = judge(state, event, source)
        if isinstance(verdict, Ignore):
            continue
        if isinstance(event, JobFailed):
            final = not is_attempt_failure(event, source)
            failure = failure_record(event, final=final, attempt=state.attempt, previous=failure)
            history.append(S.FAILED)
            state = replace(state, failed_attempt=state.attempt)
            if isinstance(verdict, AttemptFailed):
                continue
        assert isinstance(verdict, Apply)
        if verdict.record and not isinstance(event, JobFailed):
            history.append(verdict.status)
        state = replace(state, status=verdict.status)
        if isinstance(event, AllocationGranted):
            state = replace(state, allocation_id=event.allocation_id, attempt=event.attempt)
    return state, history


def test_a_restarted_job_goes_on_until_the_scheduler_says_it_failed() -> None:
    state, history = _play(
        [
            (ev.granted(JOB, "alloc-1", attempt=1), SCHEDULER),
            (ev.started(JOB, "alloc-1", attempt=1), RUNNER),
            (ev.failed(JOB, "alloc-1"), RUNNER),
            (ev.preempted_by_scheduler(JOB, "alloc-1"), SCHEDULER),
            (ev.failed(JOB, "alloc-1"), RUNNER),  # repeated: ignored
            (ev.pending(JOB, "backing off"), SCHEDULER),
            (ev.granted(JOB, "alloc-2", attempt=2), SCHEDULER),
            (ev.started(JOB, "alloc-2", attempt=2), RUNNER),
            (ev.failed(JOB, "alloc-1"), RUNNER),  # attempt 1's, late: ignored
            (ev.failed(JOB, "alloc-2"), RUNNER),
            (ev.failed(JOB, "alloc-2"), SCHEDULER),
            (ev.granted(JOB, "alloc-3", attempt=3), SCHEDULER),  # after the end: ignored
        ]
    )
    assert state.status is S.FAILED
    assert history == [
        S.QUEUED,
        S.SCHEDULED,
        S.RUNNING,
        S.FAILED,  # attempt 1 failed
        S.QUEUED,  # restarted after its failure: nothing preempted it
        S.PENDING,
        S.SCHEDULED,
        S.RUNNING,
        S.FAILED,  # attempt 2 failed
        S.FAILED,  # the job failed
    ]


def test_a_restart_after_a_failure_is_no_preemption() -> None:
    # Seen on a local stack: a job whose attempt failed and was restarted showed "PREEMPTED
    # attempt 1 failed (user_error: ...); restarting in 0.5 s" in its history; nothing
    # preempted it. It is QUEUED again, with the scheduler's reason.
    failed = JobState(S.RUNNING, allocation_id="alloc-1", attempt=0, failed_attempt=0)
    restart = ev.preempted_by_scheduler(JOB, "alloc-1")
    assert judge(failed, restart, SCHEDULER) == Apply(S.QUEUED, record=True)
    # A preemption (no failure of this attempt recorded: an earlier one's does not count).
    assert judge(replace(failed, failed_attempt=None), ev.preempted(JOB)) == Apply(
        S.PREEMPTED, record=True
    )
    earlier = JobState(S.RUNNING, allocation_id="alloc-1", attempt=1, failed_attempt=0)
    assert judge(earlier, ev.preempted(JOB)) == Apply(S.PREEMPTED, record=True)


def test_an_attempt_failure_record_says_which_attempt_and_why() -> None:
    event = ev.failed(JOB, exit_code=1, reason="exited with status 1")
    # The first attempt is index 0 in events and the API; its text says "attempt 1".
    record = failure_record(event, final=False, attempt=0, previous=None)
    assert record["reason"] == "attempt 1 failed: user_error: exited with status 1"
    assert (record["exit_code"], record["failure_kind"], record["attempt"]) == (1, "user_error", 0)
    assert record["log_tail"].endswith("ValueError: bad batch")
    assert record["failed_attempts"] == 1
    assert (
        failure_line(record) == "attempt 1 failed: user_error: exited with status 1 (exit code 1)"
    )
    second = failure_record(ev.failed(JOB, "alloc-2"), final=False, attempt=1, previous=record)
    assert second["reason"].startswith("attempt 2 failed: ")
    assert second["failed_attempts"] == 2
    assert failed_attempts(second) == 2
    assert failed_attempts(None) == 0
    assert failed_attempts({"reason": "from before the count"}) == 1


def test_the_final_failure_keeps_the_runners_exit_code_and_log_tail_of_the_same_attempt() -> None:
    runner = failure_record(ev.failed(JOB, exit_code=3), final=False, attempt=2, previous=None)
    reason = "user_error: process exited; max restarts (1) reached after 2 attempts"
    said = ev.failed(JOB, exit_code=None, reason=reason, log_tail="")
    final = failure_record(said, final=True, attempt=2, previous=runner)
    assert final["reason"] == reason
    assert (final["exit_code"], final["failure_kind"], final["attempt"]) == (3, "user_error", 2)
    assert "ValueError" in final["log_tail"]
    assert final["failed_attempts"] == 1  # the same attempt, counted once
    # A failure of an earlier attempt lends nothing (a node lost on attempt 3, say).
    lost = ev.failed(
        JOB, exit_code=None, reason="node_lost: ...", failure_kind="node_lost", log_tail=""
    )
    ended = failure_record(lost, final=True, attempt=3, previous=runner)
    assert (ended["exit_code"], ended["log_tail"], ended["failed_attempts"]) == (None, "", 2)


def test_a_cancelled_job_whose_process_failed_ended_when_the_process_did() -> None:
    record = failure_record(ev.failed(JOB), final=False, attempt=1, previous=None)
    running = JobState(S.RUNNING, allocation_id="alloc-1", attempt=1)
    assert process_ended_at(running, record) == ev.at(400)
    assert process_ended_at(running, None) is None
    # Requeued (or on another attempt): the failed process is not what the cancel ended.
    assert process_ended_at(replace(running, status=S.PENDING), record) is None
    assert process_ended_at(replace(running, attempt=2), record) is None


# --- a late success the scheduler kept ------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        JobState(S.QUEUED),  # requeued after its node was declared lost
        JobState(S.PENDING, pending_reason="quota"),
        JobState(S.SCHEDULED, allocation_id="alloc-2", attempt=2),  # placed again
        JobState(S.RUNNING, allocation_id="alloc-2", attempt=2),
        JobState(S.PREEMPTED, allocation_id="alloc-1", attempt=1),
    ],
)
def test_a_late_success_the_scheduler_kept_ends_the_job_succeeded(state: JobState) -> None:
    late = ev.succeeded(JOB, allocation="alloc-1")
    assert judge(state, late, SCHEDULER) == Apply(S.SUCCEEDED, record=True)
    # The runner's own report of the same allocation is stale in every one of these states.
    assert isinstance(judge(state, late, RUNNER), Ignore)


def test_a_kept_success_does_not_reopen_a_finished_job() -> None:
    for status in TERMINAL:
        verdict = judge(JobState(status), ev.succeeded(JOB, allocation="alloc-1"), SCHEDULER)
        assert isinstance(verdict, Ignore)
