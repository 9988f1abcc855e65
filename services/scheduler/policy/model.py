"""The policy's input and output types: a snapshot of the cluster in, decisions out.

Contract:
- Every type is a frozen, slotted dataclass holding plain values; nothing here does I/O or
  keeps references to the service's rows. A snapshot with 10,000 jobs is cheap to build.
- Times are seconds on one clock (epoch seconds in the service, a simulated clock in the
  simulator); durations are seconds. The policy never reads a clock: ``Snapshot.now`` is it.
- Ids are plain strings and must be unique within their kind (node, queue, job).
- ``schedule(snapshot, config) -> Decisions`` (in ``services.scheduler.policy``) is a pure
  function: the same snapshot and config give equal decisions, whatever the order of the
  snapshot's tuples.
- Compatibility: these types only ever gain optional fields (with defaults), so code written
  against them keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Flavor = str
"""A GPU flavor name such as ``"a100"``; every GPU of a node has one flavor."""


# --- supply --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    """A ready node that takes new work (lost or cordoned nodes are left out of the
    snapshot; the running jobs of a cordoned one stay in ``Snapshot.running``, their
    ``placement`` naming a node that is not here)."""

    node_id: str
    flavor: Flavor
    gpu_count: int
    topology: str = ""
    """Topology domain (NVLink domain, rack); multi-node gangs prefer one domain."""
    used: Mapping[int, str] = field(default_factory=dict)
    """GPU index -> id of the (running) job holding it, or a text that starts with the id
    of a job that no longer runs but whose GPUs are still being freed (the service's
    ``convert.stopping_holder``). Indices are ``0..gpu_count-1``."""
    teams: Mapping[str, str] = field(default_factory=dict)
    """Job id -> team of the holders in ``used`` that are no running job (GPUs being
    freed): explanations name another team's job by its team, these too."""


# --- configuration of demand ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queue:
    """A team's queue with its quota.

    Quota rules (per flavor ``f``), following Kueue's ClusterQueue semantics:
    - Without a cohort a queue may use at most ``nominal[f]`` GPUs.
    - In a cohort a queue may use its nominal quota plus borrow what other queues of the
      cohort lend: at most ``borrowing_limit[f]`` GPUs beyond ``nominal[f]`` (absent key =
      no limit other than what the cohort lends).
    - A queue lends at most ``lending_limit[f]`` of its *unused* nominal quota (absent key =
      all of it). Lent quota is reclaimed by preemption when its owner needs it.
    """

    name: str
    team: str
    cohort: str | None = None
    nominal: Mapping[Flavor, int] = field(default_factory=dict)
    borrowing_limit: Mapping[Flavor, int] = field(default_factory=dict)
    lending_limit: Mapping[Flavor, int] = field(default_factory=dict)
    weight: float = 1.0
    """Fair-share weight of the queue's team within its cohort (a team's weight is the sum
    over its queues)."""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority; whether a job may be preempted is separate from its priority."""

    name: str
    value: int
    """Higher runs first and may preempt lower within a queue."""
    preemptible: bool = True
    min_runtime_s: float = 0.0
    """A running job of this class is never preempted before running this long."""


DEFAULT_PRIORITY = PriorityClass("default", 0, preemptible=True, min_runtime_s=0.0)
"""Used for a job whose priority class is not in the snapshot."""


# --- demand --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting for GPUs (queued, or requeued after preemption or a lost node)."""

    job_id: str
    queue: str
    flavor: Flavor
    gpus: int
    priority: str
    """Name of a ``PriorityClass`` (unknown names mean ``DEFAULT_PRIORITY``)."""
    submitted_at: float
    declared_runtime_s: float
    """The user's declared maximum runtime; the policy never knows the true one."""
    seq: int
    """Arrival order at the scheduler; breaks ties between equal submit times."""
    gpus_per_node: int | None = None
    """Shape of a multi-node gang: ``None`` lets the policy choose an equal split (whole
    nodes preferred); otherwise ``gpus`` must be a multiple of it."""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs (granted or running)."""

    job_id: str
    queue: str
    flavor: Flavor
    gpus: int
    priority: str
    started_at: float
    """When its current allocation was granted (the minimum runtime counts from here)."""
    declared_runtime_s: float
    placement: Mapping[str, tuple[int, ...]]
    """Node id -> the GPU indices it holds there."""
    last_checkpoint_at: float | None = None
    """Time of its latest complete checkpoint in this allocation, or None."""
    borrowed: bool = False
    """Admitted beyond its queue's nominal quota (informational: the policy recomputes
    borrowing from queue usage)."""
    notice_at: float | None = None
    """When a preemption notice was sent (its GPUs free up after the grace period); None if
    it has none. Such a job is never chosen as a victim again."""
    preemptions: int = 0
    """How many of the job's earlier attempts ended by preemption (its protection against
    another grows with it; see ``PolicyConfig.min_runtime_s``)."""
    submitted_at: float | None = None
    """When the job was submitted (``PendingJob.submitted_at``: a job re-queued after a
    preemption keeps it), or None when unknown. With ``seq`` it places the job in its
    queue's order once re-queued: a waiting job may preempt only a job it would stand
    before there (see ``preemption``). None: that test is skipped for it (snapshots built
    before the field existed)."""
    seq: int = 0
    """Its ``PendingJob.seq`` (read with ``submitted_at``)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the policy may see at one moment."""

    now: float
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    priority_classes: tuple[PriorityClass, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    usage: Mapping[str, float] = field(default_factory=dict)
    """Team -> decayed GPU-seconds used (see ``decay_usage``); absent = 0."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Tunables of ``schedule``; the defaults suit a production cluster."""

    half_life_s: float = 7 * 24 * 3600.0
    """Half-life of past usage in fair share (Slurm's default is 7 days)."""
    ageing_s: float = 3600.0
    """Every ``ageing_s`` of waiting lifts a job by one priority level in the order of its
    queue and by one whole fair share (a team using exactly its weighted share of its cohort)
    across queues, so no job starves. A job that has waited this long for its queue's quota
    holds that quota against later jobs of its queue and flavor."""
    size_weight: float = 8.0
    """Smaller jobs first: a job whose declared GPU-hours are ten times another's is ordered
    as if it were ``size_weight`` priority levels lower (``size_weight * ageing_s`` of
    waiting). 0 keeps submit order within a priority level."""
    fair_share: bool = True
    """Order teams of a cohort by weighted decayed usage (else by submit time only)."""
    backfill: bool = True
    """Let later jobs start ahead of blocked ones when they cannot delay their reservations."""
    preemption: bool = True
    """Allow priority preemption within a queue and reclaim of lent quota in a cohort."""
    grace_s: float = 300.0
    """How long a preemption notice lasts before the GPUs are revoked (for estimates)."""
    reservations: int = 8
    """How many blocked jobs per flavor get a reservation that backfill must not delay."""
    min_runtime_s: float = 60.0
    """Anti-thrash: every preemptible job runs at least this long in an allocation before it
    may be preempted, doubled for each time it was preempted before (1, 2, 4 min by
    default); a priority class's own ``min_runtime_s`` applies when it is longer."""
    max_preemptions: int = 3
    """Anti-thrash: a job preempted this many times runs its next allocation to the end."""
    oversize_protection_s: float = 4 * 3600.0
    """Anti-thrash: a borrowed job larger than what its queue borrows (reclaiming it would take
    that queue below its nominal quota, e.g. the gang larger than its quota an idle queue may
    start) cannot be reclaimed in its first ``oversize_protection_s`` of an allocation."""


# --- output --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Start ``job_id`` on these GPUs now."""

    job_id: str
    gpus: Mapping[str, tuple[int, ...]]
    """Node id -> GPU indices (ascending); every node of a gang gets the same count."""
    borrowed: bool = False
    """It takes quota beyond its queue's nominal (it may be reclaimed)."""


PreemptionKind = Literal["priority", "reclaim"]


@dataclass(frozen=True, slots=True)
class Preemption:
    """Send ``job_id`` (the victim) a preemption notice so ``for_job_id`` can start."""

    job_id: str
    for_job_id: str
    kind: PreemptionKind
    reason: str
    """Human text for the victim, e.g. "preempted for job x (priority high > normal)"."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a pending job waits, and what would change that."""

    position: int
    """1-based rank among the pending jobs of its queue, in the order they are considered."""
    reason: str
    """Human sentence naming the blocking constraint and who holds it."""
    blocking: str
    """Who holds what it needs: job ids, queue or team names (comma-separated)."""
    suggestion: str | None = None
    """What would let it start now (e.g. "ask for 4 GPUs"), or None."""
    estimated_start: float | None = None
    """Best estimate of its start (snapshot clock), or None when nothing bounds it."""


@dataclass(frozen=True, slots=True)
class Decisions:
    """The result of one pass: start these, preempt those, and why everyone else waits."""

    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    explanations: Mapping[str, Explanation] = field(default_factory=dict)
    """Job id -> explanation, for every pending job that was not placed."""
