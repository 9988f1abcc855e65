"""One pass of a preemptive policy: place, wait for GPUs under notice, or name victims.

The machinery the preemptive baselines (``las``, ``srtf``, ``maxmin``) share. Contract of
``PreemptivePass.start(job, may_preempt)``, called for pending jobs in the policy's order:
- the job starts now if its gang fits in the free GPUs (``gangs.first_fit``);
- else, if it fits in the free GPUs plus those of jobs already under a preemption notice that
  no earlier job of this pass has claimed, it claims them and waits for their release (no new
  victim: a notice is never repeated while the previous one runs out);
- else running jobs without a notice for which ``may_preempt`` holds are added, in the order
  ``victim_order`` gave, until the gang fits; only the ones whose GPUs the gang uses get a
  notice, and the job claims its GPUs (they are taken from everyone later in the pass);
- else it is blocked and nothing changes. Gangs are all-or-nothing throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Literal

from bench.simulator import gangs
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    PendingJob,
    Placement,
    Preemption,
    PreemptionKind,
    RunningJob,
    Snapshot,
)

Outcome = Literal["started", "claimed", "blocked"]


class PreemptivePass:
    """The state of one pass (see the module docstring)."""

    def __init__(
        self,
        snapshot: Snapshot,
        victim_order: Callable[[RunningJob], tuple[float, ...]],
        kind: PreemptionKind = "priority",
    ) -> None:
        self.free = gangs.free_map(snapshot)
        order = list(self.free)
        self.noticed = gangs.held_map(
            (r.placement for r in snapshot.running if r.notice_at is not None), order
        )
        self.candidates = sorted(
            (r for r in snapshot.running if r.notice_at is None), key=victim_order
        )
        self.kind: PreemptionKind = kind
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.victims: set[str] = set()
        self.failed: set[Hashable] = set()

    def start(
        self,
        job: PendingJob,
        may_preempt: Callable[[RunningJob], bool],
        reason: str,
        cache_key: Hashable | None = None,
    ) -> tuple[Outcome, list[RunningJob]]:
        """Start ``job``, let it claim GPUs, or block it; returns what happened and the victims.

        ``cache_key``: jobs with the same key later in the pass can do no better than this one
        (same gang size, no more victims), so a blocked key is not tried again.
        """
        if cache_key is not None and cache_key in self.failed:
            return "blocked", []
        fit = gangs.first_fit(job.gpus, self.free)
        if fit is not None:
            self._take(fit)
            self.placements.append(Placement(job.job_id, fit))
            return "started", []
        pool = gangs.merge(self.free, self.noticed)
        fit = gangs.first_fit(job.gpus, pool)
        chosen: list[RunningJob] = []
        if fit is None:
            for victim in self.candidates:
                if victim.job_id in self.victims or not may_preempt(victim):
                    continue
                chosen.append(victim)
                for node, indices in victim.placement.items():
                    pool[node] = sorted([*pool[node], *indices])
                fit = gangs.first_fit(job.gpus, pool)
                if fit is not None:
                    break
        if fit is None:
            if cache_key is not None:
                self.failed.add(cache_key)
            return "blocked", []
        needed = [v for v in chosen if _overlaps(v.placement, fit)]
        for victim in needed:
            self.victims.add(victim.job_id)
            self.preemptions.append(Preemption(victim.job_id, job.job_id, self.kind, reason))
        self._take(fit)
        return "claimed", needed

    def start_if_free(self, job: PendingJob, cache_key: Hashable | None = None) -> bool:
        """Start ``job`` only if it fits in the free GPUs now (no claim, no victim)."""
        if cache_key is not None and cache_key in self.failed:
            return False
        fit = gangs.first_fit(job.gpus, self.free)
        if fit is None:
            if cache_key is not None:
                self.failed.add(cache_key)
            return False
        self._take(fit)
        self.placements.append(Placement(job.job_id, fit))
        return True

    def decisions(self) -> Decisions:
        return Decisions(placements=tuple(self.placements), preemptions=tuple(self.preemptions))

    def _take(self, fit: gangs.Gpus) -> None:
        gangs.take(self.free, fit)
        gangs.take(self.noticed, fit)


def _overlaps(placement: Mapping[str, tuple[int, ...]], fit: gangs.Gpus) -> bool:
    return any(set(ix) & set(fit.get(node, ())) for node, ix in placement.items())
