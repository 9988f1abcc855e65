"""Pure rules of the submission service: the job status machine and how events move it.

Contract:
- ``JobStatus`` is the status a user sees; ``TRANSITIONS`` lists every allowed move and
  ``check_transition`` raises ``IllegalTransition`` for any other.
- ``judge(state, event)`` decides what a lifecycle event does to a job: ``Apply`` (move to a
  status, and whether the move belongs in the history) or ``Ignore`` (with the reason to
  log). Late, duplicated and out-of-order events are ignored, never applied: an event from
  an allocation the job no longer holds, a grant older than the job's current one, or any
  move the table does not allow (including every move out of a terminal status); the
  handler judges a runner's report that came before its grant (or a success before its
  start) only once that arrives (``early_reports``). One exception: a job whose cancel was requested and whose process then failed becomes
  CANCELLED when the scheduler confirms the cancel (the scheduler decides the outcome).
- A job whose current attempt failed is requeued QUEUED, not PREEMPTED: the scheduler's
  ``job.preempted`` that restarts it (after the runner's ``job.failed``) says why it runs
  again, and no one preempted it.
- A job whose cancel was requested is never PREEMPTED: a ``job.preempted`` then reports the
  stop the cancel asked for, and the job stays as it was until the scheduler's
  ``job.cancelled`` (its history never says it was preempted). Nor is a job whose
  ``job.preempted`` says so itself (``CANCEL_STOP_REASON``), whether or not the request was
  heard yet: the registry's request, said on this service's behalf, may be handled after
  the runner's report of the stop (redelivered after it failed, or said again after NATS
  lost its store), and either order ends the same. A runner that says ``cancelled`` of a
  stop no cancel asked for does not keep the job RUNNING: the scheduler, which requeues it,
  then says its own ``job.preempted`` (``services.scheduler.leases``), which is applied.
- Only the scheduler ends a job FAILED. A ``job.failed`` from any other source (the
  runner's) reports one attempt: ``judge`` answers ``AttemptFailed`` (record the failure and
  a FAILED history entry, keep the status) once per attempt, and only while that attempt
  is the job's current one and still placed (SCHEDULED/RUNNING); the scheduler then says
  ``job.preempted`` (the job is restarted) or its own, final ``job.failed``
  (``SCHEDULER_SOURCE``). A failure of any allocation of the current attempt counts (a
  gang has one allocation per node); a late or repeated report of an older attempt, or of
  one the scheduler already requeued, is ignored.
- A ``job.succeeded`` from the scheduler is a late success it kept (the reporting attempt's
  node had been declared lost; ``services.scheduler.late_success``): the job is SUCCEEDED
  from any status that is not terminal, whatever allocation it holds now.
- Data-only events (metrics, checkpoints, models, costs) are not judged: they are always
  recorded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobCancelled,
    JobFailed,
    JobPending,
    JobPreempted,
    JobStarted,
    JobSucceeded,
)

SCHEDULER_SOURCE = "trainyard/scheduler"
"""The envelope ``source`` of the scheduler's events: the one that decides a job's outcome."""

CANCEL_STOP_REASON = "cancelled"
"""The reason of a runner's ``job.preempted`` that reports the stop of a cancel: the
scheduler revokes a cancelled job's allocations with the reason ``cancelled`` and no detail
(``AllocationRevoked``), and the runner reports the revocation's detail, else its reason."""


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

_S = JobStatus
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    _S.QUEUED: frozenset({_S.PENDING, _S.SCHEDULED, _S.CANCELLED}),
    # PENDING -> PENDING: the scheduler refreshes the reason, position and estimate.
    _S.PENDING: frozenset({_S.PENDING, _S.SCHEDULED, _S.CANCELLED}),
    # SCHEDULED/RUNNING -> SCHEDULED: the job was placed again (its node was lost); only a
    # grant of a later attempt may do this (see ``judge``). A job can fail or be preempted
    # before its process ever started.
    # SCHEDULED/RUNNING -> QUEUED: the attempt failed and the scheduler restarts the job (see
    # ``judge``: it was not preempted).
    _S.SCHEDULED: frozenset(
        {_S.QUEUED, _S.SCHEDULED, _S.RUNNING, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}
    ),
    _S.RUNNING: frozenset(
        {_S.QUEUED, _S.SCHEDULED, _S.SUCCEEDED, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}
    ),
    _S.PREEMPTED: frozenset({_S.QUEUED, _S.PENDING, _S.SCHEDULED, _S.CANCELLED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


class IllegalTransition(Exception):
    """A status change the table does not allow."""


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in TRANSITIONS[current]


def check_transition(current: JobStatus, target: JobStatus) -> None:
    if not can_transition(current, target):
        raise IllegalTransition(f"{current} -> {target} is not allowed")


LifecycleEvent = (
    JobPending
    | AllocationGranted
    | JobStarted
    | JobSucceeded
    | JobFailed
    | JobPreempted
    | JobCancelled
)

_TARGET: dict[type[LifecycleEvent], JobStatus] = {
    JobPending: JobStatus.PENDING,
    AllocationGranted: JobStatus.SCHEDULED,
    JobStarted: JobStatus.RUNNING,
    JobSucceeded: JobStatus.SUCCEEDED,
    JobFailed: JobStatus.FAILED,
    JobPreempted: JobStatus.PREEMPTED,
    JobCancelled: JobStatus.CANCELLED,
}


@dataclass(frozen=True)
class JobState:
    """What ``judge`` needs to know about a job."""

    status: JobStatus
    allocation_id: str | None = None
    attempt: int | None = None
    pending_reason: str | None = None
    cancel_requested: bool = False
    attempt_allocations: frozenset[str] = frozenset()
    """Every allocation of the current attempt (a gang holds one per node); the job's
    ``allocation_id`` counts whether listed or not."""
    failed_attempt: int | None = None
    """The attempt whose failure is recorded (the last one that failed), if any."""


@dataclass(frozen=True)
class Apply:
    """Move the job to ``status``; add a history entry when ``record`` is true."""

    status: JobStatus
    record: bool


@dataclass(frozen=True)
class Ignore:
    """Leave the job's status alone; ``reason`` is logged."""

    reason: str


@dataclass(frozen=True)
class AttemptFailed:
    """The current attempt failed (a runner's ``job.failed``): record the failure and a
    FAILED history entry, but leave the status alone; the scheduler decides whether the job
    restarts (``job.preempted``) or has failed (its own ``job.failed``)."""


Verdict = Apply | AttemptFailed | Ignore


def target_status(event: LifecycleEvent) -> JobStatus:
    return _TARGET[type(event)]


def judge(state: JobState, event: LifecycleEvent, source: str = "") -> Verdict:
    """What ``event``, sent by ``source`` (the envelope's), does to a job in ``state``."""
    target = target_status(event)
    if _failed_while_cancelling(state, event):
        # A job that ended FAILED on its runner's word (before only the scheduler's counted)
        # while its cancel was requested: the scheduler says CANCELLED. Its word stands.
        return Apply(JobStatus.CANCELLED, record=True)
    if state.status.is_terminal:
        what = "attempt failure" if is_attempt_failure(event, source) else str(target)
        return Ignore(f"job is already {state.status}; {what} arrived late")
    if isinstance(event, JobSucceeded) and source == SCHEDULER_SOURCE:
        # A late success the scheduler kept: an attempt whose node was declared lost had
        # really finished. Final, whatever attempt the job has shown since.
        return Apply(target, record=True)
    match event:
        case JobFailed():
            if not _of_current_attempt(state, event.allocation_id):
                return Ignore(
                    f"failure of allocation {event.allocation_id}, but the job's current "
                    f"attempt {state.attempt} holds {state.allocation_id}"
                )
            if state.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
                return Ignore(
                    f"failure of allocation {event.allocation_id} arrived after the job "
                    f"moved on to {state.status}"
                )
            if is_attempt_failure(event, source):
                if state.failed_attempt is not None and state.failed_attempt == state.attempt:
                    return Ignore(f"the failure of attempt {state.attempt} is already recorded")
                return AttemptFailed()
        case JobStarted() | JobSucceeded() | JobPreempted():
            if event.allocation_id != state.allocation_id:
                return Ignore(
                    f"{target} from allocation {event.allocation_id}, "
                    f"but the job holds {state.allocation_id}"
                )
            if isinstance(event, JobPreempted) and (
                state.cancel_requested or event.reason == CANCEL_STOP_REASON
            ):
                # The stop the cancel asked for (the runner says a revocation ended its
                # allocation as job.preempted); the scheduler's job.cancelled ends the job.
                # Its reason says so even before the request is heard (the registry's may
                # be handled after this report: ``CANCEL_STOP_REASON``).
                return Ignore("the job is being cancelled; it was stopped, not preempted")
            if isinstance(event, JobPreempted) and _restarted(state):
                # The scheduler's requeue of an attempt whose failure is recorded: the job
                # waits to run again after a failure; nothing preempted it.
                return Apply(JobStatus.QUEUED, record=True)
        case AllocationGranted():
            if event.allocation_id == state.allocation_id:
                return Ignore(f"allocation {event.allocation_id} was already granted")
            placed = state.status in (JobStatus.SCHEDULED, JobStatus.RUNNING)
            if placed and state.attempt is not None and event.attempt <= state.attempt:
                return Ignore(
                    f"grant of attempt {event.attempt} is older than the current "
                    f"attempt {state.attempt}"
                )
        case _:
            pass
    if not can_transition(state.status, target):
        return Ignore(f"illegal transition {state.status} -> {target}")
    if isinstance(event, JobPending) and state.status is JobStatus.PENDING:
        # A refresh of the same wait is not news; a new reason is.
        return Apply(target, record=event.reason != state.pending_reason)
    return Apply(target, record=True)


def _restarted(state: JobState) -> bool:
    """The current attempt's failure is recorded: a requeue now is a restart after it."""
    return state.attempt is not None and state.failed_attempt == state.attempt


def is_attempt_failure(event: LifecycleEvent, source: str) -> bool:
    """``event`` reports one attempt's failure (a ``job.failed`` not from the scheduler)."""
    return isinstance(event, JobFailed) and source != SCHEDULER_SOURCE


def _of_current_attempt(state: JobState, allocation_id: str) -> bool:
    return allocation_id == state.allocation_id or allocation_id in state.attempt_allocations


def _failed_while_cancelling(state: JobState, event: LifecycleEvent) -> bool:
    return (
        isinstance(event, JobCancelled)
        and state.status is JobStatus.FAILED
        and state.cancel_requested
    )


def event_time(event: LifecycleEvent, default: datetime) -> datetime:
    """When the event's change happened (the payload's own time where it has one)."""
    match event:
        case AllocationGranted():
            return event.granted_at
        case JobStarted():
            return event.started_at
        case JobSucceeded() | JobFailed() | JobPreempted():
            return event.finished_at
        case _:
            return default


def history_reason(event: LifecycleEvent) -> str | None:
    """The human line stored with a history entry."""
    match event:
        case JobPending():
            return event.reason
        case AllocationGranted():
            gpus = ",".join(str(i) for i in event.gpu_indices) or "none"
            return f"{attempt_text(event.attempt)} on {event.node_id} (GPUs {gpus})"
        case JobStarted():
            return f"resumed from {event.resumed_from}" if event.resumed_from else None
        case JobFailed():
            code = "" if event.exit_code is None else f" (exit code {event.exit_code})"
            return f"{event.reason}{code}"
        case JobPreempted() | JobCancelled():
            return event.reason
        case _:
            return None


def failure_line(failure: Mapping[str, Any]) -> str:
    """A failure record (``failure_record``) as one history line: its reason and exit code."""
    code = failure.get("exit_code")
    return str(failure["reason"]) + ("" if code is None else f" (exit code {code})")


def attempt_text(index: int) -> str:
    """An attempt as people count it. Events, the job row and the API's ``attempt`` fields
    carry its 0-based index (0: the first attempt); every text shows ``attempt 1`` for it, as
    the scheduler's reasons ("attempt 1 failed (...); restarting in 5 s") and the dashboard
    do."""
    return f"attempt {index + 1}"


def attempt_failure_reason(event: JobFailed, attempt: int | None) -> str:
    """What failed, e.g. ``attempt 1 failed: user_error: exited with status 1`` (the first
    attempt, index 0)."""
    which = "attempt failed" if attempt is None else f"{attempt_text(attempt)} failed"
    return f"{which}: {event.failure_kind}: {event.reason}"


def failure_record(
    event: JobFailed, *, final: bool, attempt: int | None, previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What the job keeps about its latest failure (the ``failure`` the view shows).

    An attempt's failure (``final`` false) is the runner's report; the final one is the
    scheduler's decision, which keeps the exit code and log tail of the runner's report of
    the same attempt where it has none of its own. ``failed_attempts`` counts the attempts
    that failed (an attempt counts once, whoever reported it)."""
    earlier: Mapping[str, Any] = previous or {}
    same_attempt = attempt is not None and earlier.get("attempt") == attempt
    counted = failed_attempts(previous)
    exit_code = event.exit_code
    log_tail = event.log_tail
    if final and same_attempt:
        exit_code = earlier.get("exit_code") if exit_code is None else exit_code
        log_tail = log_tail or str(earlier.get("log_tail") or "")
    return {
        "reason": event.reason if final else attempt_failure_reason(event, attempt),
        "exit_code": exit_code,
        "log_tail": log_tail,
        "failure_kind": event.failure_kind,
        "attempt": attempt,
        "allocation_id": event.allocation_id,
        "finished_at": event.finished_at.isoformat(),
        "failed_attempts": counted if same_attempt else counted + 1,
    }


def failed_attempts(failure: Mapping[str, Any] | None) -> int:
    """How many attempts failed, from the job's failure record (one if it predates the
    count)."""
    if not failure:
        return 0
    return int(failure.get("failed_attempts", 1))


def process_ended_at(state: JobState, failure: Mapping[str, Any] | None) -> datetime | None:
    """When the current attempt's process ended, if its failure is recorded and the job is
    still placed (a cancelled job that had failed keeps that time as its end)."""
    if (
        failure is None
        or state.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING)
        or state.attempt is None
        or failure.get("attempt") != state.attempt
        or not failure.get("finished_at")
    ):
        return None
    return datetime.fromisoformat(str(failure["finished_at"]))


def finite_metrics(metrics: dict[str, float]) -> dict[str, float | None]:
    """Metrics as JSON can hold them: a NaN or infinite value (a diverged loss) is kept as
    ``None`` rather than dropped, so the user still sees that the metric went bad."""
    return {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}


MONEY_PLACES = 6
"""The decimal places billing keeps a cost in."""


@dataclass(frozen=True)
class CostLine:
    """One billed allocation."""

    gpu_seconds: float
    cost: float
    currency: str
    price_per_gpu_hour: float


@dataclass(frozen=True)
class CostSummary:
    gpu_seconds: float
    cost: float
    currency: str | None
    price_per_gpu_hour: float | None
    final: bool


def summarize_cost(lines: list[CostLine], allocations: int, status: JobStatus) -> CostSummary:
    """Sum the billed allocations. ``final``: the job has ended and every allocation it
    was granted has been billed (billing reports each one after it is released)."""
    # Billing keeps each cost to 6 places (numeric(24, 6)): their sum has no more, and the
    # float additions' noise (0.0030470000000000002) is no part of it. GPU-seconds are
    # summed to the microsecond.
    gpu_seconds = round(sum(line.gpu_seconds for line in lines), MONEY_PLACES)
    cost = round(sum(line.cost for line in lines), MONEY_PLACES)
    # The billed GPU prices, weighted by GPU-seconds. Not the cost over the GPU-hours: each
    # cost is rounded to 6 places (0.000033 for 1.2 GPU-seconds at 0.10 reads as 0.099) and
    # may hold CPU and memory charges, which are no part of a price per GPU-hour. One price
    # is itself (its weighted mean of floats read 0.09999999999999999 for 0.1).
    prices = {line.price_per_gpu_hour for line in lines}
    if len(prices) == 1:
        price: float | None = prices.pop()
    elif gpu_seconds > 0:
        weighted = sum(line.price_per_gpu_hour * line.gpu_seconds for line in lines)
        price = weighted / gpu_seconds
    else:
        price = lines[-1].price_per_gpu_hour if lines else None
    return CostSummary(
        gpu_seconds=gpu_seconds,
        cost=cost,
        currency=lines[0].currency if lines else None,
        price_per_gpu_hour=price,
        final=status.is_terminal and len(lines) >= allocations,
    )
