"""A discrete-event simulator that drives a scheduling policy with a simulated clock.

Contract of ``simulate``:
- Events are arrivals, completions, preemption revocations (a notice's grace period ends) and
  optional wake-ups. All events of one timestamp are applied, then the policy runs one pass
  over a ``Snapshot`` of what a real scheduler sees: nodes and who holds which GPU, queues,
  pending jobs (queue, GPUs, gang shape, submit time, declared runtime), running jobs (start
  of their allocation, latest checkpoint, notice) and per-team decayed usage. True durations
  never leave the engine. No time passes during a pass. With ``min_pass_interval_s`` > 0
  passes are at least that far apart: events in between are applied at their times and a
  wake-up runs the pass when it is due.
- Decisions are checked before they are applied; a placement on a GPU that is taken, a gang of
  the wrong shape or a preemption of a job that does not run raises ``SimulationError``. So the
  engine never over-allocates, whatever the policy does.
- A placed job runs for its remaining work. A preempted job keeps its GPUs for ``grace_s``
  (it may finish meanwhile), then loses the work since its latest checkpoint (checkpoints are
  taken every ``checkpoint_s`` of runtime in each allocation) and is pending again with the
  rest. Its declared runtime shrinks by the work it has checkpointed; its submit time and
  queue position stay.
- Team usage decays with ``half_life_s`` (``fairshare.decay_usage``) and is charged with the
  exact decayed integral of the GPUs the team held since the previous event.
- A job runs at most its declared runtime per allocation, as the platform's runner enforces:
  one that needs more (an under-estimate, ``trace.load_trace``'s ``underestimate_share``) is
  stopped at its limit, keeps the work up to its latest checkpoint, loses the rest, and is
  resubmitted at once by its user declaring twice as long: a new submission (submit time
  now, behind every job already waiting) whose JCT still counts from the first arrival.
  Those kills and the work they lose are counted apart from preemptions.
- If jobs remain pending when no event is left (a policy that never places them), the run stops
  and reports them in ``SimResult.unfinished``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bench.simulator.cluster import FLAVOR, SimNode, gang_shape
from bench.simulator.trace import TraceJob
from trainyard_platform.services.scheduler.policy.fairshare import charge, decay_usage
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Node,
    PendingJob,
    PriorityClass,
    Queue,
    RunningJob,
    Snapshot,
)

Policy = Callable[[Snapshot], Decisions]
Progress = Callable[[float, int, int], None]
"""Called after every pass with (simulated time, pending jobs, running jobs)."""

_COMPLETION, _LIMIT, _REVOKE, _ARRIVAL, _WAKE = 0, 1, 2, 3, 4


class SimulationError(RuntimeError):
    """The policy asked for something impossible (it is a bug in the policy)."""


@dataclass(frozen=True)
class SimConfig:
    checkpoint_s: float = 1800.0
    """Jobs checkpoint every this many seconds of runtime in an allocation (inf: never)."""
    grace_s: float = 300.0
    """A preempted job keeps its GPUs this long after the notice."""
    half_life_s: float = 7 * 24 * 3600.0
    """Half-life of team usage (use the policy's)."""
    min_pass_interval_s: float = 0.0
    """Passes at most this often (0: after every batch of simultaneous events)."""
    priority: str = "default"


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    team: str
    gpus: int
    arrival: float
    first_start: float
    completion: float
    duration: float
    preemptions: int
    lost_gpu_s: float
    """GPU-seconds of work lost to preemption."""
    limit_kills: int = 0
    """Times the job was stopped at its declared limit (and resubmitted)."""
    limit_lost_gpu_s: float = 0.0
    """GPU-seconds of work lost when it was stopped at its limit."""


@dataclass
class SimResult:
    outcomes: list[JobOutcome]
    unfinished: list[str]
    busy_gpu_s: float
    """GPU-seconds allocated to jobs, including work lost to preemption."""
    passes: int
    policy_s: float
    """Wall-clock seconds spent inside the policy."""
    max_pass_s: float
    preemptions: int
    missing_explanations: int
    """Pending jobs a pass left without an explanation (summed over passes)."""
    wall_s: float = 0.0


@dataclass
class _Job:
    job: TraceJob
    seq: int
    saved: float = 0.0
    run_start: float = 0.0
    placement: dict[str, tuple[int, ...]] = field(default_factory=dict)
    epoch: int = 0
    notice_at: float | None = None
    first_start: float | None = None
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    declared: float = 0.0
    """The declared runtime of the whole job in its current submission."""
    submitted: float = 0.0
    limit_kills: int = 0
    limit_lost_gpu_s: float = 0.0


class _Engine:
    def __init__(
        self,
        jobs: Iterable[TraceJob],
        nodes: tuple[SimNode, ...],
        queues: tuple[Queue, ...],
        priority_classes: tuple[PriorityClass, ...],
        policy: Policy,
        config: SimConfig,
        progress: Progress | None,
    ) -> None:
        self.cfg = config
        self.progress = progress
        self.policy = policy
        self.queues = queues
        self.classes = priority_classes
        self.nodes = {n.node_id: n for n in nodes}
        self.used: dict[str, dict[int, str]] = {n.node_id: {} for n in nodes}
        self.node_cache = {n.node_id: Node(n.node_id, FLAVOR, n.gpus, n.rack, {}) for n in nodes}
        self.dirty: set[str] = set()
        self.jobs: dict[str, _Job] = {}
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, _Job] = {}
        self.views: dict[str, RunningJob] = {}
        self.checkpoints: list[tuple[float, str, int]] = []
        self.team_gpus: dict[str, int] = {}
        self.usage: dict[str, float] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.counter = 0
        self.now = 0.0
        self.last_pass = -math.inf
        self.wake_at: float | None = None
        self.outcomes: list[JobOutcome] = []
        self.result = SimResult([], [], 0.0, 0, 0.0, 0.0, 0, 0)
        for seq, job in enumerate(sorted(jobs, key=lambda j: (j.arrival, j.job_id))):
            gang_shape(job.gpus)  # reject impossible shapes early
            self.jobs[job.job_id] = _Job(
                job, seq, declared=job.declared_runtime, submitted=job.arrival
            )
            self._push(job.arrival, _ARRIVAL, job.job_id, 0)
        self.next_seq = len(self.jobs)

    def _push(self, at: float, kind: int, job_id: str, epoch: int) -> None:
        self.counter += 1
        heapq.heappush(self.events, (at, kind, self.counter, job_id, epoch))

    def run(self) -> SimResult:
        while self.events:
            at = self.events[0][0]
            self._advance_usage(at)
            while self.events and self.events[0][0] == at:
                _, kind, _, job_id, epoch = heapq.heappop(self.events)
                self._apply(kind, job_id, epoch)
            if self.pending and self.wake_at is None:
                # Compare with the due time itself (not ``at - last_pass``): a wake-up lands
                # exactly on it, and a rounded difference could postpone it forever.
                due = self.last_pass + self.cfg.min_pass_interval_s
                if at >= due:
                    self._pass()
                else:
                    self.wake_at = due
                    self._push(due, _WAKE, "", 0)
        self.result.outcomes = sorted(self.outcomes, key=lambda o: self.jobs[o.job_id].seq)
        self.result.unfinished = sorted(self.pending, key=lambda j: self.jobs[j].seq)
        return self.result

    def _apply(self, kind: int, job_id: str, epoch: int) -> None:
        if kind == _WAKE:
            self.wake_at = None
            return
        state = self.jobs[job_id]
        if kind == _ARRIVAL:
            self._enqueue(state)
        elif state.epoch != epoch:
            return  # stale: the job was revoked or finished since this event was planned
        elif kind == _COMPLETION:
            self._stop(state)
            first = state.first_start if state.first_start is not None else self.now
            job = state.job
            self.outcomes.append(
                JobOutcome(
                    job.job_id, job.team, job.gpus, job.arrival, first, self.now,
                    job.duration, state.preemptions, state.lost_gpu_s,
                    state.limit_kills, state.limit_lost_gpu_s,
                )
            )  # fmt: skip
        elif kind == _LIMIT:
            # The runner stops a job at its declared limit; its user resubmits it at once,
            # from its latest checkpoint, declaring twice as long (module docstring).
            ran = self.now - state.run_start
            kept = self._checkpointed(state.run_start)
            state.saved += kept
            state.limit_lost_gpu_s += max(0.0, ran - kept) * state.job.gpus
            state.limit_kills += 1
            self._stop(state)
            state.declared *= 2
            state.submitted = self.now
            state.seq = self.next_seq
            self.next_seq += 1
            self._enqueue(state)
        else:  # _REVOKE
            ran = self.now - state.run_start
            kept = self._checkpointed(state.run_start)
            state.saved += kept
            state.lost_gpu_s += max(0.0, ran - kept) * state.job.gpus
            state.preemptions += 1
            self.result.preemptions += 1
            self._stop(state)
            self._enqueue(state)

    def _checkpoints(self, run_start: float) -> int:
        """Checkpoints taken by now in an allocation that began at ``run_start``: the ``k``
        with ``run_start + k * every <= now < run_start + (k + 1) * every`` as floats compute
        it (``floor(ran / every)`` alone can be one short, and the next refresh would then be
        due now, forever)."""
        every = self.cfg.checkpoint_s
        if not math.isfinite(every) or every <= 0:
            return 0
        k = max(0, math.floor((self.now - run_start) / every))
        while run_start + (k + 1) * every <= self.now:
            k += 1
        while k > 0 and run_start + k * every > self.now:
            k -= 1
        return k

    def _checkpointed(self, run_start: float) -> float:
        """Runtime covered by the latest checkpoint of the allocation begun at ``run_start``."""
        k = self._checkpoints(run_start)
        return k * self.cfg.checkpoint_s if k else 0.0

    def _enqueue(self, state: _Job) -> None:
        job = state.job
        _, per_node = gang_shape(job.gpus)
        self.pending[job.job_id] = PendingJob(
            job_id=job.job_id,
            queue=job.team,
            flavor=FLAVOR,
            gpus=job.gpus,
            priority=self.cfg.priority,
            submitted_at=state.submitted,
            declared_runtime_s=state.declared - state.saved,
            seq=state.seq,
            gpus_per_node=per_node,
        )

    def _stop(self, state: _Job) -> None:
        job = state.job
        self.result.busy_gpu_s += (self.now - state.run_start) * job.gpus
        for node_id, indices in state.placement.items():
            for index in indices:
                del self.used[node_id][index]
            self.dirty.add(node_id)
        self.team_gpus[job.team] -= job.gpus
        state.placement = {}
        state.notice_at = None
        state.epoch += 1
        del self.running[job.job_id]
        del self.views[job.job_id]

    def _advance_usage(self, at: float) -> None:
        elapsed = at - self.now
        if elapsed > 0:
            hl = self.cfg.half_life_s
            self.usage = decay_usage(self.usage, elapsed, hl)
            # Integral of g * 0.5 ** ((at - s) / hl) over the interval: exact decayed usage.
            weight = hl / math.log(2) * (1 - 0.5 ** (elapsed / hl)) if hl > 0 else 0.0
            for team, gpus in self.team_gpus.items():
                if gpus:
                    self.usage = charge(self.usage, team, gpus * weight)
        self.now = at

    def _pass(self) -> None:
        snapshot = self.snapshot()
        started = time.perf_counter()
        decisions = self.policy(snapshot)
        spent = time.perf_counter() - started
        self.last_pass = self.now
        self.result.passes += 1
        self.result.policy_s += spent
        self.result.max_pass_s = max(self.result.max_pass_s, spent)
        self._check(decisions)
        for preemption in decisions.preemptions:
            state = self.running[preemption.job_id]
            state.notice_at = self.now
            self._view(state)
            self._push(self.now + self.cfg.grace_s, _REVOKE, preemption.job_id, state.epoch)
        for placement in decisions.placements:
            self._start(self.jobs[placement.job_id], placement.gpus)
        # Counted, not listed: a policy explains exactly the pending jobs it did not place.
        unplaced = len(snapshot.pending) - len(decisions.placements)
        self.result.missing_explanations += max(0, unplaced - len(decisions.explanations))
        if self.progress is not None:
            self.progress(self.now, len(self.pending), len(self.running))

    def _start(self, state: _Job, gpus: Mapping[str, tuple[int, ...]]) -> None:
        job = state.job
        del self.pending[job.job_id]
        state.placement = {node: tuple(indices) for node, indices in gpus.items()}
        for node_id, indices in state.placement.items():
            for index in indices:
                self.used[node_id][index] = job.job_id
            self.dirty.add(node_id)
        state.run_start = self.now
        if state.first_start is None:
            state.first_start = self.now
        self.running[job.job_id] = state
        self._view(state)
        self.team_gpus[job.team] = self.team_gpus.get(job.team, 0) + job.gpus
        work, allowed = job.duration - state.saved, state.declared - state.saved
        if allowed < work:
            self._push(self.now + allowed, _LIMIT, job.job_id, state.epoch)
        else:
            self._push(self.now + work, _COMPLETION, job.job_id, state.epoch)

    def _check(self, decisions: Decisions) -> None:
        taken: set[tuple[str, int]] = set()
        for placement in decisions.placements:
            pending = self.pending.get(placement.job_id)
            if pending is None:
                raise SimulationError(f"placed {placement.job_id}, which is not pending")
            nodes, per_node = gang_shape(pending.gpus)
            shape = sorted(len(ix) for ix in placement.gpus.values())
            if shape != [per_node] * nodes:
                raise SimulationError(
                    f"{placement.job_id} placed as {shape}, needs {nodes}x{per_node}"
                )
            for node_id, indices in placement.gpus.items():
                node = self.nodes.get(node_id)
                if node is None:
                    raise SimulationError(f"{placement.job_id} placed on unknown node {node_id}")
                for index in indices:
                    if not 0 <= index < node.gpus or index in self.used[node_id]:
                        raise SimulationError(
                            f"{placement.job_id}: GPU {node_id}/{index} is not free"
                        )
                    if (node_id, index) in taken:
                        raise SimulationError(f"GPU {node_id}/{index} placed twice in one pass")
                    taken.add((node_id, index))
        victims = [p.job_id for p in decisions.preemptions]
        for victim in victims:
            state = self.running.get(victim)
            if state is None or state.notice_at is not None:
                raise SimulationError(f"preempted {victim}, which is not running without a notice")
        if len(set(victims)) != len(victims):
            raise SimulationError("a job was preempted twice in one pass")

    def snapshot(self) -> Snapshot:
        """What the policy sees now (views are cached and rebuilt only when they change)."""
        for node_id in self.dirty:
            node = self.nodes[node_id]
            self.node_cache[node_id] = Node(
                node_id, FLAVOR, node.gpus, node.rack, dict(self.used[node_id])
            )
        self.dirty.clear()
        # A running job's view changes when it checkpoints: rebuild the ones whose next
        # checkpoint is due (stale heap entries of stopped or re-viewed jobs are skipped).
        while self.checkpoints and self.checkpoints[0][0] <= self.now:
            _, job_id, epoch = heapq.heappop(self.checkpoints)
            state = self.running.get(job_id)
            if state is not None and state.epoch == epoch:
                self._view(state)
        return Snapshot(
            now=self.now,
            nodes=tuple(self.node_cache.values()),
            queues=self.queues,
            priority_classes=self.classes,
            pending=tuple(self.pending.values()),
            running=tuple(self.views.values()),
            usage=dict(self.usage),
        )

    def _view(self, state: _Job) -> None:
        """Rebuild the policy's view of a running job and plan its next refresh."""
        job = state.job
        done = self._checkpoints(state.run_start)
        kept = done * self.cfg.checkpoint_s if done else 0.0
        self.views[job.job_id] = RunningJob(
            job_id=job.job_id,
            queue=job.team,
            flavor=FLAVOR,
            gpus=job.gpus,
            priority=self.cfg.priority,
            started_at=state.run_start,
            declared_runtime_s=state.declared - state.saved,
            placement=dict(state.placement),
            last_checkpoint_at=state.run_start + kept if done else None,
            notice_at=state.notice_at,
            preemptions=state.preemptions,
            # As it waits again once preempted (``_enqueue``): the policy orders it there.
            submitted_at=state.submitted,
            seq=state.seq,
        )
        every = self.cfg.checkpoint_s
        if math.isfinite(every) and every > 0:
            due = state.run_start + (done + 1) * every  # > now, by ``_checkpoints``
            heapq.heappush(self.checkpoints, (due, job.job_id, state.epoch))


def simulate(
    jobs: Iterable[TraceJob],
    nodes: tuple[SimNode, ...],
    queues: tuple[Queue, ...],
    priority_classes: tuple[PriorityClass, ...],
    policy: Policy,
    config: SimConfig | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Run ``jobs`` on ``nodes`` under ``policy`` to the end (see the module docstring)."""
    started = time.perf_counter()
    engine = _Engine(jobs, nodes, queues, priority_classes, policy, config or SimConfig(), progress)
    result = engine.run()
    result.wall_s = time.perf_counter() - started
    return result
