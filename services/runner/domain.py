"""The runner's pure rules: event identities, progress throttling, how a job's exit becomes
an event, and the life of an allocation on this node.

Contract:
- Every event the runner publishes has a deterministic id (``event_id``): a re-publish after
  a lost ack or a runner restart is dropped by JetStream's duplicate window. All terminal
  events of one allocation (succeeded, failed, preempted) share one id, so at most one of
  them is ever accepted for an allocation inside the window.
- ``ProgressThrottle`` lets at most one progress report per interval through and never loses
  the newest one: a report held back is released when its turn comes or when the job ends.
- ``MetricBatcher`` loses no metric point: every value of every report goes into a
  ``job.metrics`` batch, in report order, sent when it holds ``max_points`` or its first
  point is ``max_age`` seconds old, and the rest when the job ends. Batches of an
  allocation are numbered 0, 1, 2, ... (``seq``, in the event id).
- ``decide_outcome`` is the single place that maps (exit status, why the runner stopped the
  job) to succeeded / failed / preempted; ``terminal_event`` builds the payload for it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
import signal
import sys
import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Generic, Literal, TypeVar

from trainyard_platform.shared.control import PREEMPTED_EXIT_CODE, CheckpointMessage, MetricsMessage
from trainyard_platform.shared.events.payloads import (
    MAX_METRIC_POINTS,
    AllocationGranted,
    CheckpointRef,
    CheckpointSaved,
    FailureKind,
    GrantOfInvalidSpec,
    JobFailed,
    JobMetrics,
    JobPreempted,
    JobProgress,
    JobSucceeded,
    MetricPoint,
)

SOURCE = "trainyard/runner"
_EVENT_NAMESPACE = uuid.UUID("6f1c3a52-7d0e-4c8b-9a57-2f4e51d0b6a1")

EventKind = Literal["started", "progress", "metrics", "checkpoint", "end", "heartbeat"]


class IllegalTransition(ValueError):
    """A change of an allocation's state that the transition table does not allow."""


class AllocationState(enum.StrEnum):
    """An allocation as this node's ledger remembers it (across runner restarts)."""

    LAUNCHED = "launched"
    """The job was started (or is about to be); no outcome yet."""
    ENDING = "ending"
    """The job ended; its terminal event is stored but maybe not yet published."""
    FINISHED = "finished"
    """The terminal event was published: the allocation is done on this node for good."""

    @property
    def is_terminal(self) -> bool:
        return self is AllocationState.FINISHED

    def check(self, new: AllocationState) -> AllocationState:
        if new not in _TRANSITIONS[self]:
            raise IllegalTransition(f"allocation {self.value} -> {new.value} is not allowed")
        return new


_TRANSITIONS: dict[AllocationState, frozenset[AllocationState]] = {
    AllocationState.LAUNCHED: frozenset({AllocationState.ENDING}),
    AllocationState.ENDING: frozenset({AllocationState.FINISHED}),
    AllocationState.FINISHED: frozenset(),
}


def event_id(scope: str, kind: EventKind, step: int | str | None = None) -> str:
    """Deterministic event id: uuid5 of ``"<scope>:<kind>[:<step>]"`` (scope: allocation or
    node id). The same logical event always gets the same id."""
    name = f"{scope}:{kind}" if step is None else f"{scope}:{kind}:{step}"
    return str(uuid.uuid5(_EVENT_NAMESPACE, name))


@dataclass(frozen=True)
class JobIdentity:
    """Which allocation of which job an event is about."""

    job_id: str
    allocation_id: str
    node_id: str
    epoch: int
    attempt: int

    @classmethod
    def from_grant(cls, grant: AllocationGranted | GrantOfInvalidSpec) -> JobIdentity:
        return cls(grant.job_id, grant.allocation_id, grant.node_id, grant.epoch, grant.attempt)


# --- progress throttling ------------------------------------------------------------

T = TypeVar("T")


class ProgressThrottle(Generic[T]):
    """At most one item per ``interval`` seconds; the newest held-back item is kept.

    Times are plain floats (``time.monotonic()`` in the runner) so the rule is testable
    without a clock.
    """

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._last_sent: float | None = None
        self._pending: T | None = None

    def offer(self, item: T, now: float) -> T | None:
        """The item to send now, or None when it is held back until ``next_due()``."""
        if self._last_sent is None or now - self._last_sent >= self._interval:
            self._last_sent = now
            self._pending = None
            return item
        self._pending = item  # replaces an older held-back item: only the newest matters
        return None

    def next_due(self) -> float | None:
        """When the held-back item may go, or None when nothing is held back."""
        if self._pending is None or self._last_sent is None:
            return None
        return self._last_sent + self._interval

    def due(self, now: float) -> T | None:
        """The held-back item if its time has come (it is then counted as sent)."""
        due_at = self.next_due()
        if due_at is None or now < due_at:
            return None
        item, self._pending = self._pending, None
        self._last_sent = now
        return item

    def flush(self) -> T | None:
        """The held-back item regardless of time (the job ended)."""
        item, self._pending = self._pending, None
        return item


class MetricBatcher:
    """Metric points gathered into ``job.metrics`` batches (module docstring). Times are
    plain floats (``time.monotonic()`` in the runner)."""

    def __init__(self, max_points: int = MAX_METRIC_POINTS, max_age: float = 1.0) -> None:
        if not 1 <= max_points <= MAX_METRIC_POINTS:
            raise ValueError(f"a batch holds 1 to {MAX_METRIC_POINTS} points, not {max_points}")
        self._max_points = max_points
        self._max_age = max_age
        self._points: list[MetricPoint] = []
        self._since: float | None = None
        self._seq = 0

    def add(self, points: Sequence[MetricPoint], now: float) -> list[tuple[int, list[MetricPoint]]]:
        """Take ``points``; the batches (``seq``, points) that are full or due now."""
        ready: list[tuple[int, list[MetricPoint]]] = []
        for point in points:
            if self._since is None:
                self._since = now
            self._points.append(point)
            if len(self._points) >= self._max_points:
                ready.append(self._take())
        due = self.due(now)
        if due is not None:
            ready.append(due)
        return ready

    def next_due(self) -> float | None:
        """When the points held now must go, or None when none are held."""
        return None if self._since is None else self._since + self._max_age

    def due(self, now: float) -> tuple[int, list[MetricPoint]] | None:
        """The held points if their time has come."""
        at = self.next_due()
        return self._take() if at is not None and now >= at else None

    def flush(self) -> tuple[int, list[MetricPoint]] | None:
        """The held points regardless of time (the job ended)."""
        return self._take() if self._points else None

    def _take(self) -> tuple[int, list[MetricPoint]]:
        batch, self._points, self._since = self._points, [], None
        seq, self._seq = self._seq, self._seq + 1
        return seq, batch


def metric_points(message: MetricsMessage, at: datetime) -> list[MetricPoint]:
    """Every value of a report as points (NaN and infinities kept). Its keys are those
    ``metric_limits.MetricLimits.keys`` kept (1 to ``MAX_METRIC_KEY`` characters): the one
    place a key is refused, and said in the job's log."""
    return [
        MetricPoint(key=key, step=message.step, time=at, value=value)
        for key, value in message.metrics.items()
    ]


def metrics_event(job: JobIdentity, seq: int, points: list[MetricPoint]) -> JobMetrics:
    return JobMetrics(
        job_id=job.job_id,
        allocation_id=job.allocation_id,
        node_id=job.node_id,
        seq=seq,
        points=points,
    )


def metrics_event_id(job: JobIdentity, seq: int) -> str:
    return event_id(job.allocation_id, "metrics", str(seq))


# --- control messages -> events --------------------------------------------------------


def publishable_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The finite metrics: events are JSON, where the envelope writes NaN and infinities as
    ``null``, which no consumer could then parse. The job's log still shows them."""
    return {name: value for name, value in metrics.items() if math.isfinite(value)}


def progress_event(job: JobIdentity, message: MetricsMessage) -> JobProgress:
    return JobProgress(
        job_id=job.job_id,
        allocation_id=job.allocation_id,
        step=message.step,
        metrics=publishable_metrics(message.metrics),
        node_id=job.node_id,
    )


def checkpoint_event(
    job: JobIdentity, message: CheckpointMessage, now: datetime
) -> CheckpointSaved:
    return CheckpointSaved(
        job_id=job.job_id,
        allocation_id=job.allocation_id,
        epoch=job.epoch,
        checkpoint=message.checkpoint,
        saved_at=now,
        node_id=job.node_id,
    )


def progress_event_id(job: JobIdentity, message: MetricsMessage) -> str:
    # Step *and* content: a job may report different metrics at one step (training loss,
    # then validation accuracy), and those are different events; the same report twice is not.
    content = json.dumps(message.metrics, sort_keys=True)
    digest = hashlib.sha256(content.encode()).hexdigest()[:16]
    return event_id(job.allocation_id, "progress", f"{message.step}:{digest}")


def checkpoint_event_id(job: JobIdentity, message: CheckpointMessage) -> str:
    # The URI, not only the step: a job may save twice at one step (e.g. final + preempt).
    return event_id(job.allocation_id, "checkpoint", message.checkpoint.uri)


# --- outcomes ----------------------------------------------------------------------------

StopKind = Literal["revoked", "shutdown", "max_runtime", "platform", "over_limit"]


@dataclass(frozen=True)
class StopRequest:
    """Why the runner asked a job to stop (SIGTERM, then SIGKILL after a grace)."""

    kind: StopKind
    reason: str
    """The revocation's detail when it has one (for which job, by which rule, the work
    lost), else its reason (``cancelled`` / ``preempted`` / ``fenced``); or
    ``runner shutting down``, or ``max runtime exceeded (N s, counted from its grant,
    its preparation included)``, or (``platform``) what
    failed in the runner that keeps it from supervising the job, or (``over_limit``) the
    limit of the node's the job went past (its disk use: ``disk_watch``)."""


def shutdown_stop() -> StopRequest:
    return StopRequest("shutdown", "runner shutting down")


def max_runtime_stop(seconds: int) -> StopRequest:
    """The stop of a job whose ``max_runtime_seconds`` (``seconds``) passed: counted from its
    grant (``deadline``), which the reason says, the process having run less."""
    return StopRequest(
        "max_runtime",
        f"max runtime exceeded ({seconds} s, counted from its grant, its preparation included)",
    )


@dataclass(frozen=True)
class Outcome:
    kind: Literal["succeeded", "failed", "preempted"]
    reason: str
    exit_code: int | None
    failure_kind: FailureKind | None = None
    """How a failed attempt failed (None unless ``kind`` is failed)."""
    node_fault: bool = False
    """This node itself failed the attempt (``JobFailed.node_fault``: it counts towards
    the node's cordon)."""


_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "MemoryError", "Killed: out of memory")


@dataclass(frozen=True)
class MemoryEvidence:
    """What the kernel recorded in an attempt's memory cgroup, read before the cgroup is
    removed (``cgroups.JobCgroup.memory_evidence``): the evidence ``decide_outcome`` judges
    a SIGKILL by."""

    limit_kill: str | None = None
    """Why the attempt failed when its own memory limit's OOM killer killed a process of
    it (naming the limit and where it comes from), else None. On cgroup v1, where the
    kernel does not say which OOM killer killed, one killed with the limit reached: the
    reason says that, and declaring more memory only if the job used more than its limit."""
    host_oom_kill: bool = False
    """An OOM killer killed a process of the attempt although its own limit was never
    reached (or it had none): the node (or the runner's own cgroup) ran out of memory. Who
    exhausted it is not known: the job itself may have (a limit declared past the node's
    memory, memory its cgroup does not count), so it is not the node's fault."""


def names_out_of_memory(log_tail: str) -> bool:
    """Whether the job's last output names an out-of-memory error of its own (Python's, or
    CUDA's, which no cgroup counts)."""
    return any(m in log_tail for m in _OOM_MARKERS)


def describe_exit(exit_code: int | None) -> str:
    """``exited with status 3`` / ``killed by SIGKILL`` / ``did not start``."""
    if exit_code is None:
        return "did not start"
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exited with status {exit_code}"


TORCHRUN_MODULE = "torch.distributed.run"
"""The launcher a job of several processes runs under (``launch.job_argv``)."""
_TORCHRUN_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
    re.DOTALL,
)


def torchrun_worker_exit(log_tail: str) -> tuple[int, int] | None:
    """``(rank, exit code)`` of the worker whose failure ended a ``torchrun`` job, from the
    report torchrun prints last (``Root Cause (first observed failure)``, its ``rank`` and
    ``exitcode``: negative for a signal), or None when the tail holds none."""
    start = log_tail.rfind("Root Cause (first observed failure):")
    if start < 0:
        return None
    found = _TORCHRUN_ROOT_CAUSE.search(log_tail, start)
    return (int(found.group(1)), int(found.group(2))) if found else None


def decide_outcome(
    exit_code: int,
    stop: StopRequest | None,
    log_tail: str = "",
    *,
    torchrun: bool = False,
    memory: MemoryEvidence | None = None,
) -> Outcome:
    """How a job that exited with ``exit_code`` ended, given why the runner stopped it.

    - Killed by the runner for its own failure (``platform``): failed as
      ``platform_error``, whatever the exit status, this node's own fault (``node_fault``).
    - Over its max runtime: failed, whatever the exit status.
    - Over a limit of the node's (``over_limit``: its disk use): failed as ``user_error``,
      whatever the exit status.
    - Exit 0: succeeded (also when it finished its work during a stop's grace period).
    - Stopped by a revocation or the runner's shutdown: preempted with the stop's reason
      (``cancelled`` included: the scheduler already knows it is cancelling and ends the job
      CANCELLED). Exit 75 is the clean case; any other status (killed after the grace, a
      crash while checkpointing) is still the platform's doing, so still preempted; the job
      resumes from its last reported checkpoint.
    - Its cgroup's memory limit killed a process of it (``memory.limit_kill``: why, naming
      the limit and where it comes from): failed as ``out_of_memory`` with that reason,
      torchrun or not (the job's own doing: restarted like ``user_error``, never the
      platform's).
    - An OOM killer killed a process of it while its own limit was never reached
      (``memory.host_oom_kill``): failed as ``out_of_memory``, the reason saying the node
      ran out of memory while the job was within its limit. Never ``platform_error`` nor
      ``node_fault``: the runner cannot tell whether others exhausted the node or the job
      did (a limit declared past the node's memory, memory its cgroup does not count such
      as pinned host memory), and a tenant able to reach the host's OOM killer at will
      would otherwise get retries the platform pays for and cordon a node others use.
    - Exit 75 without a stop request: failed (the job was not asked to stop).
    - Anything else: failed, as ``out_of_memory`` when its last output names an
      out-of-memory error (``names_out_of_memory``), else ``user_error``; a SIGKILL the
      runner did not send is judged by the attempt's cgroup: with none to ask (``memory``
      None: a runner that is not root, a host without the controller, a kernel that counts
      no OOM kills) it is taken for an out of memory, the reason saying it is a guess; with
      one that recorded no OOM kill it was someone else's (an operator, another process of
      the uid), failed as ``user_error``, the reason naming the signal and that no OOM kill
      was recorded. Under ``torchrun`` (which exits 1 whatever its worker did) the worker's
      exit code that torchrun reported (``torchrun_worker_exit``) is the one classified and
      recorded, the reason naming its rank and torchrun's own exit.
    """
    if stop is not None and stop.kind == "platform":
        return Outcome("failed", stop.reason, exit_code, "platform_error", node_fault=True)
    if stop is not None and stop.kind == "max_runtime":
        return Outcome("failed", stop.reason, exit_code, "max_runtime")
    if stop is not None and stop.kind == "over_limit":
        return Outcome("failed", stop.reason, exit_code, "user_error")
    if exit_code == 0:
        return Outcome("succeeded", "exited with status 0", 0)
    if stop is not None:
        return Outcome("preempted", stop.reason, exit_code)
    if memory is not None and memory.limit_kill is not None:
        return Outcome("failed", memory.limit_kill, exit_code, "out_of_memory")
    if memory is not None and memory.host_oom_kill:
        # Not the node's fault: the job may have exhausted the node itself (see above).
        why = (
            f"{describe_exit(exit_code)}: the node's kernel OOM killer killed a process of the "
            "job, not its own memory limit (the node ran out of memory, which the job may "
            "have caused: not counted as the platform's)"
        )
        return Outcome("failed", why, exit_code, "out_of_memory")
    worker = torchrun_worker_exit(log_tail) if torchrun else None
    if worker is not None and worker[1] != 0:
        rank, code = worker
        failed = decide_outcome(code, None, log_tail, memory=memory)
        why = f"rank {rank}: {failed.reason} (torchrun {describe_exit(exit_code)})"
        return replace(failed, reason=why)
    if exit_code == PREEMPTED_EXIT_CODE:
        return Outcome(
            "failed",
            f"exited with status {PREEMPTED_EXIT_CODE} (preempted) although the runner "
            "never asked it to stop",
            exit_code,
            "user_error",
        )
    if names_out_of_memory(log_tail):
        why = f"out of memory: {describe_exit(exit_code)}"
        return Outcome("failed", why, exit_code, "out_of_memory")
    if exit_code == -signal.SIGKILL and memory is None:
        # The kernel's OOM killer is the likeliest sender, but without the attempt's cgroup
        # nothing confirms it: an operator or another process kills the same way.
        why = f"{describe_exit(exit_code)}, likely out of memory: no cgroup to confirm"
        return Outcome("failed", why, exit_code, "out_of_memory")
    if exit_code == -signal.SIGKILL:
        why = (
            f"{describe_exit(exit_code)}, which the runner did not send; the job's cgroup "
            "recorded no out-of-memory kill"
        )
        return Outcome("failed", why, exit_code, "user_error")
    return Outcome("failed", describe_exit(exit_code), exit_code, "user_error")


_COMPENSATED_SUM = sys.version_info >= (3, 12)
"""Whether ``sum`` adds floats with compensation (Neumaier's), as it does from 3.12."""


class RunningMean:
    """The mean of the values added, in constant memory: for a series as long as the job
    runs (a GPU sample every few seconds, a report per step), where keeping each value only
    to average them at the end grows the runner's memory with the job's runtime.

    Contract: ``mean`` is ``sum(values) / len(values)`` of every value added, to the last
    bit (``sum``'s own float algorithm: compensated from Python 3.12, a plain running sum
    before), None when none was added."""

    __slots__ = ("_compensation", "_total", "count")

    def __init__(self) -> None:
        self._total = 0.0
        self._compensation = 0.0
        self.count = 0

    @classmethod
    def of(cls, values: Iterable[float]) -> RunningMean:
        """A mean with ``values`` added."""
        mean = cls()
        for value in values:
            mean.add(value)
        return mean

    def add(self, value: float) -> None:
        x = float(value)
        if _COMPENSATED_SUM:
            total = self._total + x
            if abs(self._total) >= abs(x):
                self._compensation += (self._total - total) + x
            else:
                self._compensation += (x - total) + self._total
            self._total = total
        else:
            self._total += x
        self.count += 1

    @property
    def mean(self) -> float | None:
        if not self.count:
            return None
        total = self._total
        # As sum: the compensation never turns an infinite or overflowed sum into NaN.
        if self._compensation and math.isfinite(self._compensation):
            total += self._compensation
        return total / self.count


INPUT_BOUND_THRESHOLD = 0.25
"""A job whose loop waits for data more than this share of the time is input-bound."""


def input_bound_metrics(data_waits: RunningMean, runtime_s: float, gpus: int) -> dict[str, float]:
    """``data_wait_fraction_mean`` of the job's reports, and for an input-bound job
    ``input_bound`` (1.0) with the GPU-seconds its GPUs spent waiting for data."""
    mean = data_waits.mean
    if mean is None:
        return {}
    figures = {"data_wait_fraction_mean": mean}
    if mean > INPUT_BOUND_THRESHOLD:
        figures["input_bound"] = 1.0
        figures["gpu_seconds_waiting_for_data"] = mean * max(runtime_s, 0.0) * max(gpus, 1)
    return figures


RUNNER_MEASURES = frozenset(
    {
        "gpu_utilization",  # gpus.GpuUsage.sample, into the job's series
        "gpu_memory_used_bytes",
        "gpu_utilization_mean",  # end_metrics: the job's end
        "data_wait_fraction_mean",  # input_bound_metrics: the job's end
        "input_bound",
        "gpu_seconds_waiting_for_data",
    }
)
"""Metric names only the runner says, the one list of them: its GPU samples and the figures
of a job's end (billing prices idle and input-bound GPU time by these). Never taken from
what the job itself logged: ``end_metrics`` leaves them out of the job's own, and
``metric_limits`` drops a value a job reports under one of them as it comes."""


def end_metrics(
    reported: Mapping[str, float],
    utilization: RunningMean,
    data_waits: RunningMean,
    runtime_s: float,
    gpus: int,
) -> dict[str, float]:
    """The metrics of an attempt's end report: the newest value of each metric the job
    reported, but for ``RUNNER_MEASURES``, which only the runner says: the mean of its GPU
    utilisation samples (none: not said) and ``input_bound_metrics`` of the data waits."""
    metrics = {k: v for k, v in reported.items() if k not in RUNNER_MEASURES}
    if utilization.mean is not None:
        metrics["gpu_utilization_mean"] = utilization.mean
    return metrics | input_bound_metrics(data_waits, runtime_s, gpus)


@dataclass(frozen=True)
class JobResults:
    """What the runner learned from the job while it ran."""

    last_metrics: dict[str, float]
    """The newest value of every metric the job reported (not only its last report's)."""
    last_checkpoint: CheckpointRef | None
    """The last checkpoint the job reported."""
    log_tail: str


@dataclass(frozen=True)
class LostCheckpoint:
    """A checkpoint the job staged that was still not uploaded when its end could wait no
    longer (``TRAINYARD_RUNNER_CHECKPOINT_UPLOAD_WAIT_SECONDS``)."""

    step: int
    error: str
    """Why its latest upload failed."""
    waited_s: float
    store_failed: bool = True
    """Whether the object store failed (an error, a request timed out) since the last upload
    that worked. False: the store took every request, and the upload was still going when
    the wait ran out: the checkpoint was too large for the runner's limit, which is the
    job's doing, not the platform's."""


def with_lost_checkpoint(
    outcome: Outcome, lost: LostCheckpoint | None, kept: CheckpointRef | None
) -> Outcome:
    """``outcome``, told that the checkpoint ``lost`` was never uploaded (``kept``: the
    latest one that was). Never silent: a job that succeeded would otherwise end with
    ``kept`` as its artifact, an older checkpoint that the registry would register as its
    model. It fails instead: as ``platform_error`` when the object store failed
    (``lost.store_failed``: the job did nothing wrong), which the scheduler retries on the
    platform's budget from ``kept`` (at most the work since ``kept`` is done again); as
    ``user_error`` when the store took every request and the upload simply did not finish
    in time (the job's checkpoint was too large for the runner's limit: retried on the job's
    ``max_restarts`` and billed to its team, so no job rides free on a slow final upload of
    its own making). Any other outcome keeps its kind and its reason says so too."""
    if lost is None:
        return outcome
    since = (
        f"the latest uploaded is step {kept.step}"
        if kept is not None
        else "none of its checkpoints was uploaded"
    )
    if lost.store_failed:
        what = (
            f"its checkpoint of step {lost.step} could not be uploaded to the object store "
            f"within {lost.waited_s:g} s ({lost.error}); {since}"
        )
        kind: FailureKind = "platform_error"
    else:
        what = (
            f"its checkpoint of step {lost.step} was still uploading after {lost.waited_s:g} s, "
            "the runner's limit for the uploads at a job's end, with no error from the object "
            f"store: the checkpoint is too large to upload in that time (save a smaller one, "
            f"or save it earlier); {since}"
        )
        kind = "user_error"
    if outcome.kind == "succeeded":
        return Outcome("failed", f"the job finished, but {what}", outcome.exit_code, kind)
    return replace(outcome, reason=f"{outcome.reason}; {what}")


@dataclass(frozen=True)
class RefusedCheckpoint:
    """A checkpoint the job staged that the runner refused to upload
    (``checkpoints.StagedCheckpointInvalid``: a bad manifest, a link, a path outside its
    staging folder, an object too large or not matching its manifest)."""

    step: int
    why: str
    """The refusal's message."""


def with_refused_checkpoint(
    outcome: Outcome, refused: RefusedCheckpoint | None, kept: CheckpointRef | None
) -> Outcome:
    """``outcome``, told that the runner refused the checkpoint ``refused`` (the newest of
    the job's refused, if any), ``kept`` being the latest one uploaded. When ``kept`` is
    newer, nothing changes: the job's artifact is its newest checkpoint. Otherwise never
    silent: a job that succeeded would end with ``kept`` as its artifact, an older
    checkpoint that the registry would register as its model. It fails instead as
    ``user_error`` (the refused checkpoint is the job's own output; not retried on the
    platform's budget) and nothing is registered. Any other outcome keeps its kind and its
    reason says so too."""
    if refused is None or (kept is not None and kept.step >= refused.step):
        return outcome
    since = (
        f"the latest valid checkpoint is step {kept.step}"
        if kept is not None
        else "none of its checkpoints was valid"
    )
    what = (
        f"its final checkpoint, of step {refused.step}, was refused by the runner "
        f"({refused.why}); {since}"
    )
    if outcome.kind == "succeeded":
        return Outcome("failed", f"the job finished, but {what}", outcome.exit_code, "user_error")
    return replace(outcome, reason=f"{outcome.reason}; {what}")


def terminal_event(
    job: JobIdentity, outcome: Outcome, results: JobResults, now: datetime
) -> JobSucceeded | JobFailed | JobPreempted:
    """The one event that ends an allocation (its id: ``event_id(allocation, "end")``)."""
    common = {
        "job_id": job.job_id,
        "allocation_id": job.allocation_id,
        "node_id": job.node_id,
        "epoch": job.epoch,
        "finished_at": now,
    }
    match outcome.kind:
        case "succeeded":
            return JobSucceeded(
                **common,
                metrics=publishable_metrics(results.last_metrics),
                artifact=results.last_checkpoint,
            )
        case "preempted":
            return JobPreempted(
                **common,
                reason=outcome.reason,
                checkpoint=results.last_checkpoint,
                metrics=publishable_metrics(results.last_metrics),
            )
        case "failed":
            return JobFailed(
                **common,
                exit_code=outcome.exit_code,
                reason=outcome.reason,
                log_tail=results.log_tail,
                failure_kind=outcome.failure_kind or "user_error",
                metrics=publishable_metrics(results.last_metrics),
                node_fault=outcome.node_fault,
            )
    raise AssertionError(f"unknown outcome {outcome.kind!r}")  # pragma: no cover


def failed_to_start(
    job: JobIdentity,
    reason: str,
    now: datetime,
    failure_kind: FailureKind = "platform_error",
    *,
    node_fault: bool = False,
) -> JobFailed:
    """The terminal event of an allocation whose job never ran: a platform error (the code,
    environment or process could not be had; the scheduler retries it on its own budget),
    or ``user_error`` when the job's own input is at fault (``sandbox.JobInputError``:
    requirements, repository, commit or bundle), which it does not. ``node_fault``: this
    node itself is at fault (``sandbox.counts_against_node``), which alone counts towards
    its cordon."""
    return JobFailed(
        failure_kind=failure_kind,
        node_fault=node_fault,
        job_id=job.job_id,
        allocation_id=job.allocation_id,
        node_id=job.node_id,
        epoch=job.epoch,
        finished_at=now,
        exit_code=None,
        reason=storable(reason),  # it may quote what the tenant's git server said
    )


def lost_on_restart(job: JobIdentity, now: datetime) -> JobPreempted:
    """The terminal event of an allocation whose process died with a previous runner.

    Reported as preempted, not failed: the job did nothing wrong, and the scheduler requeues
    a preempted job to resume from its latest checkpoint (a failed one would end for good).
    """
    return JobPreempted(
        job_id=job.job_id,
        allocation_id=job.allocation_id,
        node_id=job.node_id,
        epoch=job.epoch,
        finished_at=now,
        reason="lost: the runner restarted while the job was running",
        checkpoint=None,
    )


MAX_LOG_TAIL_CHARS = 16 * 1024
"""The most characters of a job's output its ``job.failed`` carries (the end of its last
lines): lines are up to 64 KiB (``process.OUTPUT_LINE_LIMIT``) and a control character is
six bytes of JSON, so forty whole lines could pass NATS's 1 MiB message limit, and an event
that cannot be sent is retried for ever (``publishing``): the job would never end."""


def storable(text: str) -> str:
    """``text`` with each NUL replaced by U+FFFD, as undecodable output already is: the
    consumers' databases (PostgreSQL's text and JSON) store no NUL, and an event they
    cannot store is dead-lettered, not applied."""
    return text.replace("\x00", "\ufffd")


class LogTail:
    """The last ``size`` lines of a job's output, at most ``MAX_LOG_TAIL_CHARS`` of them in
    all, ``storable``."""

    def __init__(self, size: int) -> None:
        self._lines: deque[str] = deque(maxlen=size)

    def add(self, line: str) -> None:
        self._lines.append(storable(line))

    def text(self) -> str:
        return "\n".join(self._lines)[-MAX_LOG_TAIL_CHARS:]
