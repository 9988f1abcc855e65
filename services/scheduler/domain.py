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
  state, the outcome billed for the allocation, whether a restart is used up and how long
  the job then backs off (the table is in its docstring).
- ``late_success`` decides what a success reported for an allocation that is no longer live
  does: only an allocation released because its node was declared lost may still report
  one, and a real result is kept (the table is in its docstring). It is the one way out of a
  terminal state (``JobStatus.check_late_success``): FAILED by that very loss.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from trainyard_platform.shared.events.payloads import FailureKind, JobSpec
from trainyard_platform.shared.worst_case import billed_until

Outcome = Literal["succeeded", "failed", "cancelled", "preempted", "lost"]
EndKind = Literal["succeeded", "failed", "preempted", "lost"]

RESTARTABLE: frozenset[FailureKind] = frozenset({"user_error", "out_of_memory"})
"""Failure kinds of the job's own code a job is restarted after (while ``max_restarts``
allows). ``platform_error`` is retried on its own budget (``PLATFORM``); any other kind
(``max_runtime``, ...) would only fail again: the job fails at once."""

PLATFORM: FailureKind = "platform_error"
"""The platform's failure (a full disk, the package index or the object store away, the
ledger not written): retried while the operator's ``platform_retries`` allow, whether the
job's code ran or not, never counted against the job's ``max_restarts``. A failure the
job's own input causes (a repository or commit that does not exist, a bundle that does not
verify, requirements the index cannot meet) is ``user_error`` instead: the runner says so."""


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

    def check_late_success(self) -> JobStatus:
        """SUCCEEDED, for a job whose attempt on a node declared lost reports its success
        after all (``late_success`` says when); the only move out of a terminal state."""
        if self not in _LATE_SUCCESS:
            raise IllegalTransition(f"job {self.value} -> SUCCEEDED (late success) is not allowed")
        return JobStatus.SUCCEEDED


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


_LATE_SUCCESS = frozenset(
    {
        JobStatus.QUEUED,
        JobStatus.ALLOCATED,
        JobStatus.RUNNING,
        JobStatus.CANCELLING,
        JobStatus.FAILED,
    }
)
"""States a lost attempt's late success moves to SUCCEEDED (FAILED: only the failure that
loss caused, see ``late_success``)."""


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
    platform_retries: int = 0
    """Retries used after ``platform_error`` failures (``allocation_ended``); apart from
    ``restarts``."""
    trace_context: Mapping[str, str] | None = None
    """W3C trace headers of the job's submission (its events join that trace)."""
    changed_at: datetime | None = None
    """When its status last changed: for a ``QUEUED`` job, when it entered the queue (its
    submission, or the end of its last attempt)."""

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
            changed_at=row["updated_at"],
            platform_retries=row["platform_retries"],
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
    live: LiveAllocation | Sequence[LiveAllocation] | None,
    allocation_id: str,
    epoch: int,
    node_id: str | None = None,
) -> str | None:
    """None when an event about ``allocation_id``/``epoch`` applies to one of the job's live
    allocations (``live``: the one, or all of a gang's); otherwise why it is stale. A
    runner's report names the node that sent it (``node_id``, which the bus vouches for:
    ``shared.events.trust``): one about an allocation of another node (a gang peer's) is
    never its own to make."""
    lives = [] if live is None else [live] if isinstance(live, LiveAllocation) else list(live)
    if not lives:
        return "the job holds no live allocation"
    for one in lives:
        if one.allocation_id == allocation_id:
            if node_id is not None and one.node_id != node_id:
                return f"allocation {allocation_id} is node {one.node_id}'s, not {node_id}'s"
            if one.epoch != epoch:
                return f"epoch {epoch} is stale (live epoch {one.epoch})"
            return None
    names = ", ".join(one.allocation_id for one in lives)
    return f"allocation {allocation_id} is not the live one ({names})"


@dataclass(frozen=True)
class Failure:
    """How a runner said an attempt failed (``job.failed``)."""

    kind: FailureKind = "user_error"
    detail: str = "failed"
    """The runner's reason, e.g. "exited with status 1"."""
    ran: bool = True
    """Whether the job's code ran (the runner's report has an exit code). A job that
    failed without running by its own fault (``user_error``: its requirements cannot be
    met) would fail the same way again: it is not restarted."""


@dataclass(frozen=True)
class EndDecision:
    """What happens when a job's allocation ends."""

    job_status: JobStatus
    outcome: Outcome
    reason: str | None = None
    """Why the job moved on, where the scheduler has something to say (a restart, a final
    failure, a lost node), else None."""
    restart: bool = False
    """The requeue uses up one of the job's ``max_restarts``."""
    platform_retry: bool = False
    """The requeue uses up one of the platform's retries (``platform_retries``), not a
    restart."""
    backoff_s: float = 0.0
    """Seconds the requeued job waits before it may be placed again (0: at once)."""
    failure_kind: FailureKind | None = None
    """Why the attempt failed (a failure or a lost node), else None."""

    @property
    def requeued(self) -> bool:
        return self.job_status is JobStatus.QUEUED


def restart_backoff(restarts: int, base_s: float, max_s: float) -> float:
    """Seconds to wait before the job's ``restarts``-th restart: ``base_s * 2**(restarts-1)``,
    at most ``max_s`` (0 for no restart)."""
    if restarts < 1 or base_s <= 0:
        return 0.0
    return min(max_s, base_s * 2.0 ** min(restarts - 1, 64))


def allocation_ended(
    status: JobStatus,
    kind: EndKind,
    *,
    attempt: int,
    restarts: int,
    max_restarts: int,
    failure: Failure | None = None,
    backoff_base_s: float = 5.0,
    backoff_max_s: float = 300.0,
    platform_retries: int = 0,
    max_platform_retries: int = 0,
) -> EndDecision:
    """The job's next state when its live allocation ends with ``kind``.

    ``attempt`` is the ending attempt's 0-based index (every requeue, a preemption's too, makes
    a new attempt); the reasons name it as people count it, from 1, as the job's history does.
    ``restarts`` counts the restarts used so far; failures and lost nodes share it, so a job
    fails on the ``max_restarts + 1``-th failed or lost attempt (preemption is not the job's
    fault and never uses up a restart). ``platform_retries`` counts the retries used after
    ``platform_error`` failures, of ``max_platform_retries`` (the operator's): a job fails
    on its ``max_platform_retries + 1``-th platform failure, and those never use up
    ``max_restarts`` (that budget is for the job's own code failing).

    | job        | ended with                          | next      | outcome   | restart |
    |------------|-------------------------------------|-----------|-----------|---------|
    | any        | succeeded                           | SUCCEEDED | succeeded | -       |
    | CANCELLING | failed / preempted                  | CANCELLED | cancelled | -       |
    | CANCELLING | lost                                | CANCELLED | lost      | -       |
    | other      | failed, user_error / out_of_memory, | QUEUED    | failed    | yes,    |
    |            | its code ran, restarts left         |           |           | backs off |
    | other      | the same, restarts used up          | FAILED    | failed    | -       |
    | other      | failed, platform_error (ran or not),| QUEUED    | failed    | no: a   |
    |            | platform retries left               |           |           | platform  |
    |            |                                     |           |           | retry, backs off |
    | other      | failed, platform_error, platform    | FAILED    | failed    | -       |
    |            | retries used up                     |           |           |         |
    | other      | failed, any other kind, or a job    | FAILED    | failed    | -       |
    |            | whose code never ran                |           |           |         |
    | other      | preempted                           | QUEUED    | preempted | -       |
    | other      | lost, restarts < max_restarts       | QUEUED    | lost      | yes     |
    | other      | lost, restarts used up              | FAILED    | lost      | -       |

    A restart after a failure backs off ``backoff_base_s * 2**(r-1)`` seconds (``r``: the
    restart count after this one), at most ``backoff_max_s``. A lost node's job is requeued
    at once: the node is out of the inventory, so the cause is gone.
    """
    if status.is_terminal or not status.holds_gpus:
        raise IllegalTransition(f"a {status.value} job holds no allocation that could end")
    cancelling = status is JobStatus.CANCELLING
    number = attempt + 1
    exhausted = restarts >= max_restarts
    match kind:
        case "succeeded":
            return EndDecision(status.check(JobStatus.SUCCEEDED), "succeeded")
        case "failed" | "preempted" if cancelling:
            return EndDecision(status.check(JobStatus.CANCELLED), "cancelled")
        case "failed":
            failure = failure or Failure()
            what = f"{failure.kind}: {failure.detail}"
            if failure.kind == PLATFORM:
                return _platform_failure(
                    status,
                    what,
                    number,
                    platform_retries,
                    max_platform_retries,
                    backoff_base_s,
                    backoff_max_s,
                )
            if failure.kind not in RESTARTABLE or not failure.ran:
                why = failure.kind if failure.ran else f"{failure.kind} of a job that never ran"
                reason = f"{what}; {why} is not restarted (attempt {number})"
                return EndDecision(
                    status.check(JobStatus.FAILED), "failed", reason, failure_kind=failure.kind
                )
            if exhausted:
                reason = f"{what}; max restarts ({max_restarts}) reached after {number} attempts"
                return EndDecision(
                    status.check(JobStatus.FAILED), "failed", reason, failure_kind=failure.kind
                )
            backoff = restart_backoff(restarts + 1, backoff_base_s, backoff_max_s)
            reason = f"attempt {number} failed ({what}); restarting in {format_seconds(backoff)}"
            return EndDecision(
                status.check(JobStatus.QUEUED),
                "failed",
                reason,
                restart=True,
                backoff_s=backoff,
                failure_kind=failure.kind,
            )
        case "preempted":
            return EndDecision(status.check(JobStatus.QUEUED), "preempted")
        case "lost" if cancelling:
            return EndDecision(status.check(JobStatus.CANCELLED), "lost", "node lost")
        case "lost" if exhausted:
            reason = (
                f"node_lost: node lost; max restarts ({max_restarts}) reached after "
                f"{number} attempts"
            )
            return EndDecision(
                status.check(JobStatus.FAILED), "lost", reason, failure_kind="node_lost"
            )
        case "lost":
            reason = (
                f"node lost; requeued for attempt {number + 1} "
                f"(restart {restarts + 1} of {max_restarts})"
            )
            return EndDecision(
                status.check(JobStatus.QUEUED),
                "lost",
                reason,
                restart=True,
                failure_kind="node_lost",
            )
    raise AssertionError(f"unknown end kind {kind!r}")  # pragma: no cover


def _platform_failure(
    status: JobStatus,
    what: str,
    number: int,
    used: int,
    allowed: int,
    backoff_base_s: float,
    backoff_max_s: float,
) -> EndDecision:
    """``allocation_ended`` for a ``platform_error`` (``what``) of attempt ``number``, with
    ``used`` of ``allowed`` platform retries used before it."""
    if used >= allowed:
        failures = used + 1
        reason = (
            f"{what}; failed through the platform {failures} time{'s' * (failures > 1)} "
            f"(platform retries: {allowed}, all used; attempt {number})"
        )
        return EndDecision(status.check(JobStatus.FAILED), "failed", reason, failure_kind=PLATFORM)
    backoff = restart_backoff(used + 1, backoff_base_s, backoff_max_s)
    reason = (
        f"attempt {number} failed ({what}); retrying in {format_seconds(backoff)} "
        f"(platform retry {used + 1} of {allowed}; max_restarts not used)"
    )
    return EndDecision(
        status.check(JobStatus.QUEUED),
        "failed",
        reason,
        platform_retry=True,
        backoff_s=backoff,
        failure_kind=PLATFORM,
    )


@dataclass(frozen=True)
class LateSuccess:
    """A late success that is kept (``late_success``)."""

    job_succeeds: bool
    """The job becomes SUCCEEDED (else it keeps its status: only the allocation's outcome and
    its bill change)."""
    reason: str


def late_success(
    status: JobStatus,
    *,
    job_attempt: int,
    attempt: int,
    outcome: Outcome,
    epoch: int,
    reported_epoch: int,
) -> LateSuccess | str:
    """What a ``job.succeeded`` about an allocation that is no longer live does; a str says
    why it is ignored.

    Only an allocation released because its node was declared lost (outcome ``lost``) may
    report a success late, and only at its own epoch: the scheduler presumed that attempt
    dead, the runner says it finished, and a result a job really produced is never thrown
    away. Every other ended allocation stays fenced (a failure, a preemption, progress, or a
    success of an allocation that ended otherwise). A kept success changes the allocation's
    outcome to ``succeeded`` and its bill to the time it really ran, and the job:

    | job                                 | becomes   | and                                  |
    |-------------------------------------|-----------|--------------------------------------|
    | QUEUED (requeued after the loss)    | SUCCEEDED | it is not run again                  |
    | ALLOCATED / RUNNING / CANCELLING on | SUCCEEDED | the newer attempt is stopped: its    |
    | a newer attempt                     |           | allocations released (``cancelled``, |
    |                                     |           | billed to now) and fenced            |
    | FAILED by this attempt's lost node  | SUCCEEDED | (its ``job_attempt`` is ``attempt``) |
    | SUCCEEDED, CANCELLED, FAILED later  | unchanged | only the allocation and its bill     |

    The earlier success wins over a newer attempt even once that one has started: it is a
    complete result, while the newer attempt only repeats the work (its own late reports are
    then fenced like any stale allocation's).
    """
    if reported_epoch != epoch:
        return f"epoch {reported_epoch} is stale (the allocation's epoch is {epoch})"
    if outcome != "lost":
        return f"the allocation ended {outcome}; only a lost node's allocation reports late"
    if not status.is_terminal:
        return LateSuccess(True, f"attempt {attempt + 1} succeeded after its node was lost")
    if status is JobStatus.FAILED and job_attempt == attempt:
        return LateSuccess(True, f"attempt {attempt + 1} succeeded after its node was lost")
    return LateSuccess(False, f"attempt {attempt + 1} succeeded; the job is {status.value}")


def format_seconds(seconds: float) -> str:
    """A short human duration: "0.2 s", "5 s", "2.5 min"."""
    if seconds < 60:
        return f"{round(seconds, 1):g} s"
    return f"{round(seconds / 60, 1):g} min"


def end_time(reported: datetime, granted_at: datetime, now: datetime) -> datetime:
    """When an allocation ended, as said of it: the time the runner (or the last heartbeat)
    reported, kept between the grant and now so a skewed clock never says a negative or
    future lease."""
    return min(max(reported, granted_at), max(now, granted_at))


def release_time(
    reported: datetime, granted_at: datetime, now: datetime, max_runtime_s: int
) -> datetime:
    """When a lease ended for billing: ``end_time``, and never later than what one attempt
    of a job of this ``max_runtime_s`` is billed at most (``worst_case.billed_until``: the
    grant plus the limit and the kill grace). An allocation held longer (a long
    preparation, the wait for its last checkpoint's upload) is billed no further, so the
    worst case a budget reserves bounds every bill."""
    return min(end_time(reported, granted_at, now), billed_until(granted_at, max_runtime_s))


def late_release_time(
    reported: datetime,
    granted_at: datetime,
    released_at: datetime,
    now: datetime,
    max_runtime_s: int,
) -> datetime:
    """When a lost allocation whose runner reported success late ended, for its bill: what the
    runner reported (``release_time``, so never later than its grant plus the spec's
    ``max_runtime_seconds`` and the kill grace), never before its release (a bill is
    extended, never cut). Without that bound, a runner silent for weeks billed the job's
    team for weeks of GPUs by saying it had just finished."""
    return max(released_at, release_time(reported, granted_at, now, max_runtime_s))
