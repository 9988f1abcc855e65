"""The rules of liveness that survives the observer's own outage, and of late successes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainyard_platform.services.scheduler.domain import (
    IllegalTransition,
    JobStatus,
    LateSuccess,
    late_success,
)
from trainyard_platform.services.scheduler.node_watch import BusHearing, NodeWatch, judgment_cutoff
from trainyard_platform.shared.bus import Hearing

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


# --- judging nodes ---------------------------------------------------------------------------


def test_a_node_is_judged_by_what_was_heard_not_by_the_clock() -> None:
    # Heard continuously for a minute, everything up to T0 + 60 s.
    hearing = Hearing(since=T0, through=T0 + 60 * S)
    assert judgment_cutoff(hearing, 15 * S) == T0 + 45 * S
    # The same, with a grace after the hearing began: still judged (60 >= 15 + 5).
    assert judgment_cutoff(hearing, 15 * S, 5 * S) == T0 + 45 * S


def test_nobody_is_judged_until_heard_for_the_timeout_plus_the_grace() -> None:
    assert judgment_cutoff(Hearing(T0, T0 + 14 * S), 15 * S) is None
    assert judgment_cutoff(Hearing(T0, T0 + 15 * S), 15 * S) == T0
    assert judgment_cutoff(Hearing(T0, T0 + 19 * S), 15 * S, 5 * S) is None
    assert judgment_cutoff(Hearing(T0, T0 + 20 * S), 15 * S, 5 * S) == T0 + 5 * S


def test_a_backlog_holds_the_judgment_back() -> None:
    """The clock says 12:05, but the scheduler has only read what was sent until 12:01: a
    node is judged by the heartbeats it had the chance to read."""
    hearing = Hearing(since=T0, through=T0 + 60 * S)  # it is now T0 + 300 s
    cutoff = judgment_cutoff(hearing, 15 * S)
    assert cutoff == T0 + 45 * S  # a node heard at T0 + 50 s is not lost, whatever the time


class FakeBus:
    def __init__(self) -> None:
        self.answers = True
        self.heard: Hearing | None = None
        self.settings = type("Settings", (), {"stream": "TRAINYARD"})()
        self.jetstream = self

    async def consumer_info(self, stream: str, consumer: str, timeout: float) -> object:
        if not self.answers:
            raise TimeoutError("no answer")
        return object()

    def hearing(self, consumer: str) -> Hearing | None:
        return self.heard


async def test_the_watch_judges_nothing_while_it_does_not_hear() -> None:
    bus = FakeBus()
    clock = [T0]
    hearing: Any = BusHearing(bus, "scheduler")  # type: ignore[arg-type]
    watch = NodeWatch(
        None,  # the cutoff needs no database
        interval_seconds=1,
        timeout_seconds=15,
        clock=lambda: clock[0],
        hearing=hearing,
        grace_seconds=5,
    )
    # Not caught up yet: nothing to judge by.
    assert await watch.cutoff() is None
    # Hearing since the process started, through a minute later.
    bus.heard = Hearing(T0, T0 + 60 * S)
    cutoff = await watch.cutoff()
    # The probe only began answering now (real time, after T0): nothing before it counts.
    assert cutoff is None
    started = datetime.now(UTC)
    bus.heard = Hearing(started, started + 60 * S)
    assert await watch.cutoff() == started + 45 * S

    # JetStream stops answering (a half-open connection): no judgment, even though the bus
    # still reports what it heard.
    bus.answers = False
    assert await watch.cutoff() is None
    # It answers again: hearing begins anew at that answer (just after ``again``).
    bus.answers = True
    again = datetime.now(UTC)
    bus.heard = Hearing(started, again - S)
    assert await watch.cutoff() is None  # caught up only before the new answer
    bus.heard = Hearing(started, again + 19 * S)
    assert await watch.cutoff() is None  # under 15 s + 5 s grace since it answered
    bus.heard = Hearing(started, again + 60 * S)
    assert await watch.cutoff() == again + 45 * S


async def test_a_watch_without_a_bus_hears_everything_since_it_started() -> None:
    clock = [T0]
    watch = NodeWatch(
        None,
        interval_seconds=1,
        timeout_seconds=15,
        clock=lambda: clock[0],
    )
    assert await watch.cutoff() is None
    clock[0] = T0 + 20 * S
    assert await watch.cutoff() == T0 + 5 * S


# --- late successes ------------------------------------------------------------------------


def kept(status: JobStatus, job_attempt: int = 1, attempt: int = 0) -> LateSuccess | str:
    return late_success(
        status, job_attempt=job_attempt, attempt=attempt, outcome="lost", epoch=7, reported_epoch=7
    )


@pytest.mark.parametrize(
    "status",
    [JobStatus.QUEUED, JobStatus.ALLOCATED, JobStatus.RUNNING, JobStatus.CANCELLING],
)
def test_a_lost_attempts_success_ends_a_job_still_going(status: JobStatus) -> None:
    verdict = kept(status)
    assert isinstance(verdict, LateSuccess) and verdict.job_succeeds
    assert verdict.reason == "attempt 1 succeeded after its node was lost"
    assert status.check_late_success() is JobStatus.SUCCEEDED


def test_a_failure_the_loss_caused_becomes_a_success() -> None:
    # The loss used up the restarts: the job FAILED on attempt 0, which then succeeded.
    verdict = kept(JobStatus.FAILED, job_attempt=0, attempt=0)
    assert isinstance(verdict, LateSuccess) and verdict.job_succeeds
    assert JobStatus.FAILED.check_late_success() is JobStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("status", "job_attempt"),
    [(JobStatus.SUCCEEDED, 1), (JobStatus.CANCELLED, 1), (JobStatus.FAILED, 1)],
)
def test_an_ended_job_keeps_its_end_and_only_the_bill_changes(
    status: JobStatus, job_attempt: int
) -> None:
    verdict = kept(status, job_attempt=job_attempt, attempt=0)
    assert isinstance(verdict, LateSuccess) and not verdict.job_succeeds


def test_only_a_lost_allocation_at_its_own_epoch_reports_late() -> None:
    stale = late_success(
        JobStatus.RUNNING, job_attempt=1, attempt=0, outcome="lost", epoch=7, reported_epoch=8
    )
    assert stale == "epoch 8 is stale (the allocation's epoch is 7)"
    for outcome in ("failed", "preempted", "cancelled", "succeeded"):
        refused = late_success(
            JobStatus.RUNNING,
            job_attempt=1,
            attempt=0,
            outcome=outcome,
            epoch=7,
            reported_epoch=7,
        )
        assert refused == (
            f"the allocation ended {outcome}; only a lost node's allocation reports late"
        )


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.CANCELLED])
def test_no_other_way_out_of_a_terminal_state(status: JobStatus) -> None:
    with pytest.raises(IllegalTransition):
        status.check_late_success()
    assert not any(status.can_become(other) for other in JobStatus)
