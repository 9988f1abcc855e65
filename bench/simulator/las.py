"""Tiresias-style discretised two-dimensional least-attained-service (2D-LAS), preemptive.

Follows Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning" (NSDI 2019),
with no knowledge of durations (neither true nor declared ones):
- A job's attained service is GPU-seconds: GPUs x time it has held them (both dimensions), over
  all its allocations so far. The policy keeps it itself from what the snapshots show: a job
  seen running that is pending again stopped at its notice + ``grace_s`` (or now, if earlier).
- Discretised: queue ``k`` holds jobs whose attained service is below ``thresholds_gpu_s[k]``
  and at least the previous threshold; the last queue has no upper bound. Defaults: Q0 under
  1 GPU-hour, Q1 under 10 GPU-hours, Q2 the rest. A running job is demoted as soon as it
  crosses a threshold. Within a queue, jobs go in arrival order (FIFO).
- Preemption: a pending job may preempt running jobs of strictly lower queues only (lowest
  queue and latest start first, ``preemptive.PreemptivePass``); never a job of its own queue.
- Promotion (the paper's PROMOTEKNOB, against starvation): a job that has run and has waited
  since it last stopped for at least ``promote_knob`` x the length of that last run goes back to
  Q0 with its attained service reset to 0. Default knob 8.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.simulator.preemptive import PreemptivePass
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    PendingJob,
    RunningJob,
    Snapshot,
)


@dataclass(frozen=True)
class LasConfig:
    thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0)
    """Upper bounds of attained GPU-seconds of all queues but the last (ascending)."""
    promote_knob: float = 8.0
    """Back to Q0 after waiting this many times the last run (<= 0: never)."""
    grace_s: float = 300.0
    """The engine's grace between a notice and the release (to date a stop)."""


@dataclass
class _Seen:
    started_at: float
    gpus: int
    notice_at: float | None


@dataclass
class TiresiasLas:
    """The policy; one instance per simulation run (it keeps attained service)."""

    config: LasConfig = field(default_factory=LasConfig)
    banked: dict[str, float] = field(default_factory=dict)
    """GPU-seconds of finished allocations, per job."""
    stopped: dict[str, tuple[float, float]] = field(default_factory=dict)
    """(when it stopped, how long it had run) of a job waiting after a preemption."""
    seen: dict[str, _Seen] = field(default_factory=dict)

    def __call__(self, snapshot: Snapshot) -> Decisions:
        self._observe(snapshot)
        now = snapshot.now

        def pending_level(job: PendingJob) -> int:
            return self.level(self.banked.get(job.job_id, 0.0))

        def running_level(job: RunningJob) -> int:
            return self.level(self.attained(job, now))

        levels = {r.job_id: running_level(r) for r in snapshot.running}
        p = PreemptivePass(snapshot, lambda r: (-levels[r.job_id], -r.started_at))
        for job in sorted(snapshot.pending, key=lambda j: (pending_level(j), j.seq)):
            mine = pending_level(job)
            p.start(
                job,
                _above(levels, mine),
                f"least attained service: queue {mine} over queue >= {mine + 1}",
                cache_key=(job.gpus, mine),
            )
        return p.decisions()

    def level(self, attained_gpu_s: float) -> int:
        return bisect.bisect_right(self.config.thresholds_gpu_s, attained_gpu_s)

    def attained(self, job: RunningJob, now: float) -> float:
        return self.banked.get(job.job_id, 0.0) + job.gpus * (now - job.started_at)

    def _observe(self, snapshot: Snapshot) -> None:
        now, cfg = snapshot.now, self.config
        running = {r.job_id: r for r in snapshot.running}
        pending = {p.job_id for p in snapshot.pending}
        for job_id, seen in list(self.seen.items()):
            if job_id in running and running[job_id].started_at == seen.started_at:
                continue
            del self.seen[job_id]
            if job_id not in pending:  # finished: forget it
                self.banked.pop(job_id, None)
                self.stopped.pop(job_id, None)
                continue
            end = now if seen.notice_at is None else min(now, seen.notice_at + cfg.grace_s)
            ran = max(0.0, end - seen.started_at)
            self.banked[job_id] = self.banked.get(job_id, 0.0) + seen.gpus * ran
            self.stopped[job_id] = (end, ran)
        for job_id, r in running.items():
            self.seen[job_id] = _Seen(r.started_at, r.gpus, r.notice_at)
            self.stopped.pop(job_id, None)
        if cfg.promote_knob > 0:
            for job_id, (end, ran) in list(self.stopped.items()):
                if job_id in pending and now - end >= cfg.promote_knob * ran:
                    self.banked[job_id] = 0.0
                    del self.stopped[job_id]


def _above(levels: Mapping[str, float], mine: float) -> Callable[[RunningJob], bool]:
    """Victims: running jobs whose value in ``levels`` is strictly greater than ``mine``."""
    return lambda v: levels[v.job_id] > mine
