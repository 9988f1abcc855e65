"""Preemption: which running jobs to stop so a blocked job can start, losing the least work.

Contract:
- A running job may be a victim only if it holds no notice already and its protection is
  over (``protected_until``): its class is preemptible, it was preempted fewer than
  ``PolicyConfig.max_preemptions`` times before, and it has run in this allocation at least
  ``PolicyConfig.min_runtime_s`` doubled per earlier preemption, or its class's own minimum
  runtime when that is longer. So no job is preempted more than ``max_preemptions`` times,
  and a job that keeps being taken back runs longer each time (anti-thrash).
- Priority preemption: victims come from the blocked job's own queue and flavor and have a
  strictly lower priority value. Reclaim: a job that stays within its queue's nominal quota
  may take back lent quota from queues of its cohort that borrow the flavor, whatever their
  priority, and only from a queue while it still borrows (after the victims already chosen).
  A job larger than what its queue borrows (taking it takes that queue below its nominal
  quota; e.g. the gang larger than its quota an idle queue may start,
  ``QuotaBook.first_tier``) is spared for its first ``PolicyConfig.oversize_protection_s``
  in an allocation: reclaiming it at once would trade the lender's wait for the borrower's
  lost start and its own reclaim back.
- Jobs already under notice (leaving anyway) are used first and cost nothing; they are
  *claimed* so that two blocked jobs never count on the same leaving GPUs.
- Among the others, victims are preferred by least work lost: seconds since the last
  checkpoint in this allocation (or since its start when there is none), then those seconds
  times the GPUs of the whole gang, then lowest priority, then youngest, then job id. (GPU-
  seconds first was measured too: half the GPU-hours lost, but it picks small jobs, which
  raised the shared trace's mean JCT by 15%; docs/scheduling.md.) The notice tells the
  victim what it loses. For reclaim, jobs no bigger than what
  their queue borrows come before bigger ones, so a lender takes back borrowed GPUs rather
  than the borrower's own quota where it can.
- ``select`` adds victims in that order until the blocked job would fit (quota and a gang
  shape on the freed nodes), then drops, least preferred first, every victim not needed.
  None when even all candidates would not do.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field

from trainyard_platform.services.scheduler.policy import explain
from trainyard_platform.services.scheduler.policy.model import (
    PendingJob,
    PolicyConfig,
    PreemptionKind,
    PriorityClass,
    RunningJob,
)
from trainyard_platform.services.scheduler.policy.packing import FlavorPool, Shape
from trainyard_platform.services.scheduler.policy.quota import QuotaBook

MAX_CANDIDATES = 512
"""Victim candidates examined per attempt (bounds the cost of one pass)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    job: RunningJob
    kind: PreemptionKind | None
    """None for a job already leaving under notice."""
    key: tuple[int, int, float, float, int, float, str]


def protected_until(job: RunningJob, cls: PriorityClass, config: PolicyConfig) -> float:
    """The first moment ``job`` may be preempted in its current allocation (``math.inf``:
    not before it ends). See the module docstring."""
    if not cls.preemptible or job.preemptions >= config.max_preemptions:
        return math.inf
    # The exponent is capped: an operator's very large max_preemptions must not let a job
    # preempted a thousand times overflow the float and stop every pass.
    floor = config.min_runtime_s * 2.0 ** min(job.preemptions, 64)
    return job.started_at + max(cls.min_runtime_s, floor)


def oversize_until(job: RunningJob, config: PolicyConfig) -> float:
    """The first moment reclaim may take ``job`` when it is larger than what its queue
    borrows (module docstring)."""
    return job.started_at + config.oversize_protection_s


def eligible(job: RunningJob, cls: PriorityClass, config: PolicyConfig, now: float) -> bool:
    """Whether ``job`` may receive a preemption notice now."""
    return job.notice_at is None and now >= protected_until(job, cls, config)


def work_lost_s(job: RunningJob, now: float) -> float:
    """Seconds of the job's work a preemption now would lose: since its last checkpoint in
    this allocation, or since the allocation started when it has none."""
    saved = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    return max(0.0, now - max(saved, job.started_at))


def victim_key(
    job: RunningJob, priority: int, now: float, leaving: bool = False, oversize: bool = False
) -> tuple[int, int, float, float, int, float, str]:
    """Preference order of victims, smallest first (see module docstring)."""
    lost = work_lost_s(job, now)
    return (
        0 if leaving else 1,
        1 if oversize else 0,
        lost,
        lost * job.gpus,
        priority,
        -job.started_at,
        job.job_id,
    )


@dataclass
class _Freeing:
    """GPUs that the chosen victims would free, kept incrementally."""

    pool: FlavorPool
    shapes: tuple[Shape, ...]
    nodes: dict[str, int] = field(default_factory=dict)
    queues: dict[str, int] = field(default_factory=dict)
    have: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.have = [
            self.pool.count_at_least(per) if per <= self.pool.capacity else 0
            for _, per in self.shapes
        ]

    def change(self, job: RunningJob, sign: int) -> None:
        self.queues[job.queue] = self.queues.get(job.queue, 0) + sign * job.gpus
        for node_id, gpus in job.placement.items():
            node = self.pool.nodes.get(node_id)
            if node is None:
                continue
            base = node.free_count
            before = base + self.nodes.get(node_id, 0)
            after = before + sign * len(gpus)
            self.nodes[node_id] = after - base
            for i, (_, per_node) in enumerate(self.shapes):
                if before < per_node <= after:
                    self.have[i] += 1
                elif after < per_node <= before:
                    self.have[i] -= 1

    def fits(self) -> bool:
        return any(have >= count for have, (count, _) in zip(self.have, self.shapes, strict=True))


def select(
    candidates: list[Candidate],
    pool: FlavorPool,
    shapes: tuple[Shape, ...],
    quota_ok: Callable[[Mapping[str, int]], bool],
    reclaimable: Mapping[str, int],
) -> list[Candidate] | None:
    """The victims to free for a blocked job (see module docstring), or None.

    ``quota_ok(freed)`` says whether the job fits its quota once ``freed`` (queue -> GPUs)
    are released; ``reclaimable`` caps what reclaim may take from each queue.
    """
    ordered = sorted(candidates, key=_by_key)[:MAX_CANDIDATES]
    freeing = _Freeing(pool, shapes)
    taken: dict[str, int] = {}
    chosen: list[Candidate] = []
    for candidate in ordered:
        job = candidate.job
        if candidate.kind == "reclaim":
            if taken.get(job.queue, 0) >= reclaimable.get(job.queue, 0):
                continue
            taken[job.queue] = taken.get(job.queue, 0) + job.gpus
        freeing.change(job, +1)
        chosen.append(candidate)
        if freeing.fits() and quota_ok(freeing.queues):
            break
    else:
        return None
    for candidate in reversed(list(chosen)):
        freeing.change(candidate.job, -1)
        if freeing.fits() and quota_ok(freeing.queues):
            chosen.remove(candidate)
        else:
            freeing.change(candidate.job, +1)
    return chosen


_by_key = operator.attrgetter("key")


def candidates_for(
    quota: QuotaBook,
    queue: str,
    flavor: str,
    priority: int,
    within_nominal: bool,
    running: Mapping[tuple[str, str], list[RunningJob]],
    leaving: list[RunningJob],
    classes: Callable[[str], PriorityClass],
    config: PolicyConfig,
    now: float,
    memo: dict[str, tuple[int, bool]] | None = None,
    made: dict[tuple[str, str, str, int], list[Candidate]] | None = None,
    claimed: Set[str] = frozenset(),
) -> tuple[list[Candidate], dict[str, int]]:
    """Candidate victims for a job of ``queue``/``flavor`` and what reclaim may take per
    queue (see module docstring); jobs in ``claimed`` (victims already chosen) are left out.

    ``memo`` (job id -> its priority value and whether it is eligible) and ``made`` (the
    candidates of one queue and flavor, per kind and priority or borrowed GPUs, before
    ``claimed`` is taken out) may be kept across the calls of one pass over the same
    ``running``: a candidate is made of the job, its class, ``now`` and the priority or
    borrowed GPUs it is judged against, none of which changes for a key during a pass."""
    memo = {} if memo is None else memo
    made = {} if made is None else made

    def judged(job: RunningJob) -> tuple[int, bool]:
        known = memo.get(job.job_id)
        if known is None:
            cls = classes(job.priority)
            known = memo[job.job_id] = (cls.value, eligible(job, cls, config, now))
        return known

    def unclaimed(candidates: list[Candidate]) -> list[Candidate]:
        if not claimed:
            return candidates
        return [c for c in candidates if c.job.job_id not in claimed]

    found = [
        Candidate(job, None, victim_key(job, classes(job.priority).value, now, leaving=True))
        for job in leaving
    ]
    own = made.get(("priority", queue, flavor, priority))
    if own is None:
        own = made[("priority", queue, flavor, priority)] = []
        for job in running.get((queue, flavor), ()):
            value, ok = judged(job)
            if value < priority and ok:
                own.append(Candidate(job, "priority", victim_key(job, value, now)))
        own.sort(key=_by_key)  # (``select`` sorts again: sorted runs make that cheap)
    found += unclaimed(own)
    reclaimable: dict[str, int] = {}
    cohort = quota.queues[queue].cohort
    if within_nominal and cohort is not None:
        for other, borrowed in quota.borrowers(cohort, flavor, exclude=queue):
            reclaimable[other] = borrowed
            lent = made.get(("reclaim", other, flavor, borrowed))
            if lent is None:
                lent = made[("reclaim", other, flavor, borrowed)] = []
                for job in running.get((other, flavor), ()):
                    value, ok = judged(job)
                    oversize = job.gpus > borrowed
                    if ok and not (oversize and now < oversize_until(job, config)):
                        key = victim_key(job, value, now, oversize=oversize)
                        lent.append(Candidate(job, "reclaim", key))
                lent.sort(key=_by_key)
            found += unclaimed(lent)
    return found, reclaimable


def notice(
    job: PendingJob,
    job_class: PriorityClass,
    victim: Candidate,
    victim_class: PriorityClass,
    now: float,
) -> str:
    """The reason a victim is told: for whom, which rule allowed it, and what it loses."""
    checkpointed = (
        victim.job.last_checkpoint_at is not None
        and victim.job.last_checkpoint_at >= victim.job.started_at
    )
    lost = explain.work_lost(work_lost_s(victim.job, now), victim.job.gpus, checkpointed)
    if victim.kind == "priority":
        detail = f"priority {job_class.name} outranks {victim_class.name} in queue {job.queue}"
        return explain.victim(job.job_id, "priority", f"{detail}; {lost}")
    # The waiting job is another team's: named by its queue, never by its id (other teams'
    # job ids are never shown, as in every explanation), since the victim's owner reads this.
    detail = f"queue {victim.job.queue} borrows {job.flavor} quota that {job.queue} needs"
    return explain.victim(f"a job of queue {job.queue}", "reclaim", f"{detail}; {lost}")
