"""Pure rules of the submission service: the job status machine and how events move it.

Contract:
- ``JobStatus`` is the status a user sees; ``TRANSITIONS`` lists every allowed move and
  ``check_transition`` raises ``IllegalTransition`` for any other.
- ``judge(state, event)`` decides what a lifecycle event does to a job: ``Apply`` (move to a
  status, and whether the move belongs in the history) or ``Ignore`` (with the reason to
  log). Late, duplicated and out-of-order events are ignored, never applied: an event from
  an allocation the job no longer holds, a grant older than the job's current one, or any
  move the table does not allow (including every move out of a terminal status). One
  exception: a job whose cancel was requested and whose process then failed becomes
  CANCELLED when the scheduler confirms the cancel (the scheduler decides the outcome).
- Data-only events (metrics, checkpoints, models, costs) are not judged: they are always
  recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from shared.events.payloads import (
    AllocationGranted,
    JobCancelled,
    JobFailed,
    JobPending,
    JobPreempted,
    JobStarted,
    JobSucceeded,
)


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
    _S.SCHEDULED: frozenset({_S.SCHEDULED, _S.RUNNING, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}),
    _S.RUNNING: frozenset({_S.SCHEDULED, _S.SUCCEEDED, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}),
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


@dataclass(frozen=True)
class Apply:
    """Move the job to ``status``; add a history entry when ``record`` is true."""

    status: JobStatus
    record: bool


@dataclass(frozen=True)
class Ignore:
    """Leave the job's status alone; ``reason`` is logged."""

    reason: str


Verdict = Apply | Ignore


def target_status(event: LifecycleEvent) -> JobStatus:
    return _TARGET[type(event)]


def judge(state: JobState, event: LifecycleEvent) -> Verdict:
    """What ``event`` does to a job in ``state``."""
    target = target_status(event)
    if _failed_while_cancelling(state, event):
        # The runner reported the process's failure (it was stopped for the cancel); the
        # scheduler, which decides a job's outcome, says CANCELLED. Its word stands.
        return Apply(JobStatus.CANCELLED, record=True)
    if state.status.is_terminal:
        return Ignore(f"job is already {state.status}; {target} arrived late")
    match event:
        case JobStarted() | JobSucceeded() | JobFailed() | JobPreempted():
            if event.allocation_id != state.allocation_id:
                return Ignore(
                    f"{target} from allocation {event.allocation_id}, "
                    f"but the job holds {state.allocation_id}"
                )
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
            return f"attempt {event.attempt} on {event.node_id} (GPUs {gpus})"
        case JobStarted():
            return f"resumed from {event.resumed_from}" if event.resumed_from else None
        case JobFailed():
            code = "" if event.exit_code is None else f" (exit code {event.exit_code})"
            return f"{event.reason}{code}"
        case JobPreempted() | JobCancelled():
            return event.reason
        case _:
            return None


def finite_metrics(metrics: dict[str, float]) -> dict[str, float | None]:
    """Metrics as JSON can hold them: a NaN or infinite value (a diverged loss) is kept as
    ``None`` rather than dropped, so the user still sees that the metric went bad."""
    return {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}


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
    gpu_seconds = sum(line.gpu_seconds for line in lines)
    cost = sum(line.cost for line in lines)
    if gpu_seconds > 0:
        price: float | None = cost * 3600.0 / gpu_seconds  # the effective blended price
    else:
        price = lines[-1].price_per_gpu_hour if lines else None
    return CostSummary(
        gpu_seconds=gpu_seconds,
        cost=cost,
        currency=lines[0].currency if lines else None,
        price_per_gpu_hour=price,
        final=status.is_terminal and len(lines) >= allocations,
    )
