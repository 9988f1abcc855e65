"""The scheduler's pure rules: job, allocation and node states, fencing, and what an ended
allocation means for its job.

Contract:
- Every status change goes through ``JobStatus.check`` / ``AllocationStatus.check``; a change
  outside the transition table raises ``IllegalTransition`` and is never written.
- ``fence`` decides whether a runner's event about an allocation still applies: only when it
  names one of the job's live allocations (a gang has one per node) *and* that allocation's
  epoch. Anything else is stale (a runner that was fenced off, a redelivery after the lease
  ended) and must be ignored.
- ``allocation_ended`` maps how an allocation ended, and the job's state, to the job's next
  state and the outcome billed for the allocation.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.events.payloads import JobSpec

Outcome = Literal["succeeded", "failed", "cancelled", "preempted", "lost"]
EndKind = Literal["succeeded", "failed", "preempted", "lost"]


class IllegalTransition(ValueError):
    """A status change that the transition table does not allow."""


class JobStatus(enum.StrEnum):
    QUEUED = "QUEUED"
    ALLOCATED = "ALLOCATED"
    """GPUs granted; the runner has not said it started yet."""
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    """Cancel requested while it held GPUs; waiting for the runner to stop it."""
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_JOB

    @property
    def holds_gpus(self) -> bool:
        return self in (JobStatus.ALLOCATED, JobStatus.RUNNING, JobStatus.CANCELLING)

    def can_become(self, new: JobStatus) -> bool:
        return new in _JOB_TRANSITIONS[self]

    def check(self, new: JobStatus) -> JobStatus:
        if not self.can_become(new):
            raise IllegalTransition(f"job {self.value} -> {new.value} is not allowed")
        return new


_TERMINAL_JOB = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

_JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.ALLOCATED, JobStatus.CANCELLED}),
    JobStatus.ALLOCATED: frozenset(
        {
            JobStatus.RUNNING,
            JobStatus.CANCELLING,
            JobStatus.QUEUED,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
        }
    ),
    JobStatus.RUNNING: frozenset(
        {JobStatus.CANCELLING, JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED}
    ),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELLED, JobStatus.SUCCEEDED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


class AllocationStatus(enum.StrEnum):
    GRANTED = "GRANTED"
    RUNNING = "RUNNING"
    RELEASED = "RELEASED"

    def check(self, new: AllocationStatus) -> AllocationStatus:
        if new not in _ALLOCATION_TRANSITIONS[self]:
            raise IllegalTransition(f"allocation {self.value} -> {new.value} is not allowed")
        return new


_ALLOCATION_TRANSITIONS: dict[AllocationStatus, frozenset[AllocationStatus]] = {
    AllocationStatus.GRANTED: frozenset({AllocationStatus.RUNNING, AllocationStatus.RELEASED}),
    AllocationStatus.RUNNING: frozenset({AllocationStatus.RELEASED}),
    AllocationStatus.RELEASED: frozenset(),
}


class NodeStatus(enum.StrEnum):
    READY = "READY"
    LOST = "LOST"
    """No heartbeat within the timeout; its leases were released. A heartbeat makes it READY."""


@dataclass(frozen=True)
class Job:
    """A job as the scheduler keeps it."""

    job_id: str
    spec: JobSpec
    status: JobStatus
    status_reason: str | None
    attempt: int
    restarts: int
    submitted_at: datetime
    pending_reason: str | None
    pending_position: int | None
    queue: str = ""
    """The team's queue (``default:<team>`` until an operator defines one)."""
    trace_context: Mapping[str, str] | None = None
    """W3C trace headers of the job's submission (its events join that trace)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        return cls(
            job_id=row["job_id"],
            spec=JobSpec.model_validate(row["spec"]),
            status=JobStatus(row["status"]),
            status_reason=row["status_reason"],
            attempt=row["attempt"],
            restarts=row["restarts"],
            submitted_at=row["submitted_at"],
            pending_reason=row["pending_reason"],
            pending_position=row["pending_position"],
            queue=row["queue"],
            trace_context=row["trace_context"],
        )


@dataclass(frozen=True)
class Allocation:
    """GPUs of one node leased to one attempt of one job."""

    allocation_id: str
    job_id: str
    node_id: str
    epoch: int
    attempt: int
    gpu_indices: tuple[int, ...]
    status: AllocationStatus
    granted_at: datetime
    gang_id: str = ""
    """Shared by the allocations of one placement of a job on several nodes ('' = its own)."""
    gang_size: int = 1
    borrowed: bool = False
    notice_at: datetime | None = None
    """When a preemption notice was sent; None without one."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Allocation:
        return cls(
            allocation_id=str(row["allocation_id"]),
            job_id=row["job_id"],
            node_id=row["node_id"],
            epoch=row["epoch"],
            attempt=row["attempt"],
            gpu_indices=tuple(row["gpu_indices"]),
            status=AllocationStatus(row["status"]),
            granted_at=row["granted_at"],
            gang_id=str(row["gang_id"]),
            gang_size=row["gang_size"],
            borrowed=row["borrowed"],
            notice_at=row["notice_at"],
        )

    @property
    def live(self) -> LiveAllocation:
        return LiveAllocation(self.allocation_id, self.node_id, self.epoch)


@dataclass(frozen=True)
class LiveAllocation:
    """The one unreleased allocation of a job, as far as fencing needs it."""

    allocation_id: str
    node_id: str
    epoch: int


def fence(
    live: LiveAllocation | Sequence[LiveAllocation] | None, allocation_id: str, epoch: int
) -> str | None:
    """None when an event about ``allocation_id``/``epoch`` applies to one of the job's live
    allocations (``live``: the one, or all of a gang's); otherwise why it is stale."""
    lives = [] if live is None else [live] if isinstance(live, LiveAllocation) else list(live)
    if not lives:
        return "the job holds no live allocation"
    for one in lives:
        if one.allocation_id == allocation_id:
            if one.epoch != epoch:
                return f"epoch {epoch} is stale (live epoch {one.epoch})"
            return None
    names = ", ".join(one.allocation_id for one in lives)
    return f"allocation {allocation_id} is not the live one ({names})"


@dataclass(frozen=True)
class EndDecision:
    """What happens when a job's allocation ends."""

    job_status: JobStatus
    outcome: Outcome
    reason: str | None = None
    """Why the job ended where the runner could not say it (lost node), else None."""

    @property
    def requeued(self) -> bool:
        return self.job_status is JobStatus.QUEUED


def allocation_ended(
    status: JobStatus, kind: EndKind, *, restarts: int, max_restarts: int
) -> EndDecision:
    """The job's next state when its live allocation ends with ``kind``.

    ``restarts`` counts earlier restarts after lost nodes; preemption is not the job's fault
    and never uses up a restart. A job whose cancel is pending ends CANCELLED unless it
    finished its work anyway.
    """
    if status.is_terminal or not status.holds_gpus:
        raise IllegalTransition(f"a {status.value} job holds no allocation that could end")
    cancelling = status is JobStatus.CANCELLING
    match kind:
        case "succeeded":
            return EndDecision(status.check(JobStatus.SUCCEEDED), "succeeded")
        case "failed" if cancelling:
            return EndDecision(status.check(JobStatus.CANCELLED), "cancelled")
        case "failed":
            return EndDecision(status.check(JobStatus.FAILED), "failed")
        case "preempted" if cancelling:
            return EndDecision(status.check(JobStatus.CANCELLED), "cancelled")
        case "preempted":
            return EndDecision(status.check(JobStatus.QUEUED), "preempted")
        case "lost" if cancelling:
            return EndDecision(status.check(JobStatus.CANCELLED), "lost", "node lost")
        case "lost" if restarts >= max_restarts:
            return EndDecision(
                status.check(JobStatus.FAILED), "lost", "node lost; max restarts reached"
            )
        case "lost":
            return EndDecision(status.check(JobStatus.QUEUED), "lost", "node lost; requeued")
    raise AssertionError(f"unknown end kind {kind!r}")  # pragma: no cover


def release_time(reported: datetime, granted_at: datetime, now: datetime) -> datetime:
    """When a lease ended for billing: the time the runner (or the last heartbeat) reported,
    kept between the grant and now so a skewed clock never bills negative or future time."""
    return min(max(reported, granted_at), max(now, granted_at))
