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
  What a queue borrows is counted as it will be once the preemptions are played out: without
  its jobs under notice and the victims given notice earlier in the same pass, with the jobs
  of the queue that preempted in the pass (the quota book counts what it holds now until
  the pass is applied; counted so, a queue whose borrowed GPUs one job had reclaimed still
  "borrowed" them for the next, which took the queue's own quota). A job under notice whose
  preemptor has not yet preempted again in the pass is counted gone alone (reclaim may then
  take less from its queue, never more). A job larger than what its queue borrows (taking it takes that queue below its nominal
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
- A victim re-queued keeps its submit time and arrival sequence, so it may stand before the
  job that preempted it: it would then be decided first in the next pass and start again on
  the GPUs it left, and be preempted again once protected no more (thrash, each round losing
  its work for nothing). So a waiting job takes a set of victims only if it would be
  ordered before each of them once all of them have left and are re-queued
  (``Preemptor.admits``). For priority, both are of one queue: the queue's order
  (``fairshare.queue_key``: priority level less the size term, ageing, submit time,
  sequence) must put the waiting job first; a strictly lower priority value alone is not
  enough, since ageing or a smaller declared size can outweigh it (that order does not
  depend on what the queue holds, so the other victims change nothing). For reclaim, a
  re-queued victim borrows again, so it is ordered after every job within its nominal
  quota (the waiting job is one) -- except when its queue, without the set's victims and
  its jobs under notice, would be within its nominal quota with it again or hold nothing
  else: re-queued, it is then in the first tier (``QuotaBook.first_tier``), and the waiting
  job must stand before it across queues, by fair share (each team's share with the set's
  GPUs of that team gone: the victim's, and the waiting job's own when the set holds
  GPUs of its team) and queue order. Judged one by one, two gangs of a queue that
  lends through both were each "still borrowing" once the other was counted, and taken
  together the queue held nothing: the first re-queued started again. A victim whose
  submit time is unknown (``RunningJob.submitted_at`` None) is not tested.
- ``select`` adds victims in that order until the blocked job would fit (quota and a gang
  shape on the freed nodes), then drops, least preferred first, every victim not needed.
  None when even all candidates would not do. When rule 6 refuses that set, it chooses
  again, skipping each candidate with which the set would be refused (the set it ends
  with, or None).
- Given the reservations already made in the pass (``Reserved``: those of blocked jobs
  decided before the waiting job, and the holds of jobs that preempted before it), a node
  counts for a gang shape only with the GPUs the waiting job could take there, from the end
  of the victims' notice to its declared end, without delaying any of them: for each
  reservation it would overlap, the reservation's slack on the node plus the GPUs of the
  victims there that it did not count on (released after it starts). Without this, a job
  preempted for GPUs reserved for a job ahead, could not start on them once its victims had
  left; a victim short enough for backfill started again there and was preempted again
  (``reserved_conflicts`` names those reservations for the waiting job's explanation).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field

from trainyard_platform.services.scheduler.policy import explain
from trainyard_platform.services.scheduler.policy.backfill import Reservation
from trainyard_platform.services.scheduler.policy.fairshare import FairShare, queue_key
from trainyard_platform.services.scheduler.policy.model import (
    PendingJob,
    PolicyConfig,
    PreemptionKind,
    PriorityClass,
    RunningJob,
)
from trainyard_platform.services.scheduler.policy.packing import FlavorPool, NodeSlot, Shape
from trainyard_platform.services.scheduler.policy.quota import QuotaBook

MAX_CANDIDATES = 512
"""Victim candidates examined per attempt (bounds the cost of one pass)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    job: RunningJob
    kind: PreemptionKind | None
    """None for a job already leaving under notice."""
    key: tuple[int, int, float, float, int, float, str]
    order: tuple[float, float, int, str] | None = None
    """Where the job would stand once re-queued (``Preemptor.order``), when the waiting job
    may have to be ordered before it (module docstring); None when nothing is to be tested."""
    rest: int = 0
    """For reclaim: the GPUs of the flavor its queue holds once its jobs under notice and the
    victims given notice earlier in the pass have left and the jobs that preempted for them
    have started (``PolicyState.outgoing``; the job's own included); what
    ``Preemptor.admits`` counts the set's victims from."""


QueueKey = tuple[float, float, int, str]


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The waiting job that looks for victims, and what orders it against a victim once the
    victim is re-queued (module docstring): ``level`` is the priority level less the size
    term of a pending job (the pass's), ``fair`` the pass's fair shares."""

    job: PendingJob
    level: Callable[[PendingJob], float]
    fair: FairShare
    ageing_s: float

    def key(self) -> QueueKey:
        """The waiting job's place in its queue's order."""
        job = self.job
        return queue_key(job.submitted_at, self.level(job), job.seq, job.job_id, self.ageing_s)

    def order(self, victim: RunningJob) -> QueueKey | None:
        """The victim's place in its queue's order once re-queued, or None when unknown."""
        if victim.submitted_at is None:
            return None
        again = requeued(victim, victim.submitted_at)
        return queue_key(again.submitted_at, self.level(again), again.seq, again.job_id,
                         self.ageing_s)  # fmt: skip

    def admits(self, quota: QuotaBook, victims: Sequence[Candidate]) -> bool:
        """Whether the waiting job stands before each of ``victims`` once all of them have
        left and are re-queued (module docstring): for priority, in their queue's order; for
        reclaim, only a victim then in the first tier is tested (its queue's use counted
        without every victim of the set and its jobs under notice), by standing (fair share
        with the set's GPUs of its team gone, for the waiting job as for the victim, plus
        the queue order's first term), then submit time, sequence and id, as a pass orders
        queue heads. Taking more victims of other teams never turns a refused set into an
        admitted one (a queue's use and a team's share only fall), so ``select`` may skip
        any victim that makes its set refused; a victim of the waiting job's own team
        lowers its own share, so dropping one may turn an admitted set refused (``select``
        then takes none)."""
        held: dict[str, int] = {}
        for c in victims:
            if c.kind is not None:
                team = quota.queues[c.job.queue].team
                held[team] = held.get(team, 0) + c.job.gpus
        mine = self.key()
        for c in victims:
            if c.kind == "priority" and c.order is not None and not mine < c.order:
                return False
        first: QueueKey | None = None
        for c in first_tier_again(quota, victims):
            if first is None:  # its own team's share, too, without the set's GPUs of it
                own = quota.queues[self.job.queue]
                share = self.fair.share_without(own, held.get(own.team, 0))
                first = (share + mine[0], *mine[1:])
            assert c.order is not None
            theirs = quota.queues[c.job.queue]
            other = self.fair.share_without(theirs, held[theirs.team]) + c.order[0]
            if not first < (other, *c.order[1:]):
                return False
        return True


def first_tier_again(quota: QuotaBook, victims: Sequence[Candidate]) -> Iterator[Candidate]:
    """The reclaim victims of ``victims`` whose order is tested (``Candidate.order``) and
    that are in the first tier (``QuotaBook.first_tier``) once every victim of the set has
    left and is re-queued, their queues' jobs under notice gone too: their queue fits its
    nominal quota with them again, or holds nothing else. Only such a victim may stand
    before a job reclaiming (module docstring)."""
    gone: dict[str, int] = {}
    for c in victims:
        if c.kind is not None:
            gone[c.job.queue] = gone.get(c.job.queue, 0) + c.job.gpus
    for c in victims:
        if c.kind == "reclaim" and c.order is not None:
            job = c.job
            nominal = quota.nominal(job.queue, job.flavor)
            left = c.rest - gone[job.queue]
            if left + job.gpus <= nominal or (left == 0 and nominal > 0):
                yield c


def rest_of(quota: QuotaBook, queue: str, flavor: str, theirs: Sequence[RunningJob]) -> int:
    """The GPUs of ``flavor`` that ``queue`` holds once its jobs under notice (among
    ``theirs``, its running jobs of the flavor) have left (``Candidate.rest``)."""
    return quota.used(queue, flavor) - sum(r.gpus for r in theirs if r.notice_at)


def requeued(job: RunningJob, submitted_at: float) -> PendingJob:
    """``job`` as it waits again once preempted: the same request, submit time and sequence."""
    return PendingJob(
        job.job_id, job.queue, job.flavor, job.gpus, job.priority, submitted_at,
        job.declared_runtime_s, job.seq,
    )  # fmt: skip


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


@dataclass(frozen=True, slots=True)
class Reserved:
    """What a waiting job's victims free is measured against (module docstring): the nodes
    of the pool that carry reservations, and when the job would end if it started as its
    victims' notice runs out (``end``); ``grace`` is the notice period."""

    nodes: Mapping[str, NodeSlot]
    end: float
    now: float
    grace: float

    def release(self, job: RunningJob) -> float:
        """When ``job``'s GPUs come free as the pass's releases count them."""
        if job.notice_at is not None:
            return max(self.now, job.notice_at + self.grace)
        return max(self.now, job.started_at + job.declared_runtime_s)

    def limits(
        self, node: NodeSlot, released: list[tuple[float, int]]
    ) -> Iterator[tuple[Reservation, int]]:
        """Each reservation of ``node`` the waiting job would overlap, with the GPUs it
        leaves the job there: its slack plus the GPUs of the victims (``released``: their
        (release, GPUs) on the node) that it did not count on, released after it starts."""
        for r in node.reservations:
            if self.end > r.start:
                late = sum(g for at, g in released if at > r.start)
                yield r, r.slack[node.node_id] + late

    def usable(self, node: NodeSlot, freed: int, released: list[tuple[float, int]]) -> int:
        """GPUs of ``node`` the waiting job may take: its free ones and ``freed`` (the
        victims'), within every reservation it would overlap (``limits``)."""
        return min([node.free_count + freed, *(room for _, room in self.limits(node, released))])

    def conflicts(
        self, node: NodeSlot, per_node: int, released: list[tuple[float, int]]
    ) -> list[Reservation]:
        """The reservations of ``node`` that stop the waiting job taking ``per_node`` there."""
        return [r for r, room in self.limits(node, released) if room < per_node]


@dataclass
class _Freeing:
    """GPUs that the chosen victims would free, kept incrementally: per shape, how many nodes
    the waiting job could take it on (``have``)."""

    pool: FlavorPool
    shapes: tuple[Shape, ...]
    reserved: Reserved | None = None
    nodes: dict[str, int] = field(default_factory=dict)
    queues: dict[str, int] = field(default_factory=dict)
    have: list[int] = field(default_factory=list)
    released: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.have = [
            self.pool.count_at_least(per) if per <= self.pool.capacity else 0
            for _, per in self.shapes
        ]
        if self.reserved is not None:  # free GPUs reserved for others do not count
            # = ``self._count(free, self.usable(node))`` with nothing freed yet, inlined: a
            # pass at 10,000 nodes makes it for about 100,000 reserved nodes.
            end = self.reserved.end
            for node in self.reserved.nodes.values():
                free = len(node.free)
                if not free:  # (a full node counts for no shape either way)
                    continue
                usable, node_id = free, node.node_id
                for r in node.reservations:
                    if end > r.start and r.slack[node_id] < usable:
                        usable = r.slack[node_id]
                if usable < free:
                    self._count(free, usable)

    def usable(self, node: NodeSlot) -> int:
        freed = self.nodes.get(node.node_id, 0)
        if self.reserved is None or not node.reservations:
            return node.free_count + freed
        return self.reserved.usable(node, freed, self.released.get(node.node_id, []))

    def _count(self, before: int, after: int) -> None:
        """A node's usable GPUs went from ``before`` to ``after``: recount it per shape."""
        for i, (_, per_node) in enumerate(self.shapes):
            if before < per_node <= after:
                self.have[i] += 1
            elif after < per_node <= before:
                self.have[i] -= 1

    def change(self, job: RunningJob, sign: int) -> None:
        self.queues[job.queue] = self.queues.get(job.queue, 0) + sign * job.gpus
        release = self.reserved.release(job) if self.reserved is not None else 0.0
        for node_id, gpus in job.placement.items():
            node = self.pool.nodes.get(node_id)
            if node is None:
                continue
            before = self.usable(node)
            self.nodes[node_id] = self.nodes.get(node_id, 0) + sign * len(gpus)
            if self.reserved is not None and node.reservations:
                mine = self.released.setdefault(node_id, [])
                if sign > 0:
                    mine.append((release, len(gpus)))
                else:
                    mine.remove((release, len(gpus)))
            self._count(before, self.usable(node))

    def fits(self) -> bool:
        return any(have >= count for have, (count, _) in zip(self.have, self.shapes, strict=True))


def select(
    candidates: list[Candidate],
    pool: FlavorPool,
    shapes: tuple[Shape, ...],
    quota_ok: Callable[[Mapping[str, int]], bool],
    reclaimable: Mapping[str, int],
    reserved: Reserved | None = None,
    admits: Callable[[Sequence[Candidate]], bool] | None = None,
) -> list[Candidate] | None:
    """The victims to free for a blocked job (see module docstring), or None.

    ``quota_ok(freed)`` says whether the job fits its quota once ``freed`` (queue -> GPUs)
    are released; ``reclaimable`` caps what reclaim may take from each queue; ``reserved``,
    when given, keeps the job off GPUs it would take from a reservation (module docstring);
    ``admits`` (``Preemptor.admits``), when given, judges the victims taken together: when
    it refuses the set chosen without it, or none was found (a candidate it would refuse
    may have used up what reclaim may take from a queue), the choice is made again
    skipping each candidate with which the set would be refused (a refused set stays
    refused as victims of other teams are added, and dropping them keeps one admitted),
    and that set or None is the answer: None too when dropping a victim of the waiting
    job's own team, not needed to fit, left the set refused (its own share higher again;
    no victim is taken only to lower it). Only a reclaim victim in the first tier
    re-queued is ever refused with others, so without a reclaim candidate whose order is
    tested there is nothing to choose again.
    """
    ordered = sorted(candidates, key=_by_key)[:MAX_CANDIDATES]
    capped: list[Candidate] = []
    chosen = _choose(ordered, _Freeing(pool, shapes, reserved), quota_ok, reclaimable, capped)
    if admits is None or (chosen is not None and admits(chosen)):
        return chosen
    # None with no candidate left out for a queue's cap: all of them would not do, nor
    # would any set of them (more victims never make a job fit less).
    if chosen is None and not capped:
        return None
    if not any(c.kind == "reclaim" and c.order is not None for c in ordered):
        return chosen
    freeing = _Freeing(pool, shapes, reserved)
    return _choose(ordered, freeing, quota_ok, reclaimable, capped, admits)


def _choose(
    ordered: list[Candidate],
    freeing: _Freeing,
    quota_ok: Callable[[Mapping[str, int]], bool],
    reclaimable: Mapping[str, int],
    capped: list[Candidate],
    admits: Callable[[Sequence[Candidate]], bool] | None = None,
) -> list[Candidate] | None:
    """``select``'s choice among ``ordered``: add victims until the job fits, then drop
    those not needed; with ``admits``, skip each with which the set would be refused.
    ``capped`` gets the candidates left out because their queue's cap was reached."""
    taken: dict[str, int] = {}
    chosen: list[Candidate] = []
    judged = False  # whether the set holds a reclaim victim whose order is tested
    for candidate in ordered:
        job = candidate.job
        lent = candidate.kind == "reclaim"
        if lent and taken.get(job.queue, 0) >= reclaimable.get(job.queue, 0):
            capped.append(candidate)
            continue
        if admits is not None and candidate.kind is not None:
            mine = lent and candidate.order is not None
            if (judged or mine) and not admits([*chosen, candidate]):
                continue
            judged = judged or mine
        if lent:
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
    if judged and admits is not None and not admits(chosen):
        # A victim of the waiting job's own team dropped, its share is higher again: no
        # victim is kept only to lower it, and no refused set is taken.
        return None
    return chosen


def reserved_conflicts(
    chosen: list[Candidate], pool: FlavorPool, shapes: tuple[Shape, ...], reserved: Reserved
) -> list[Reservation]:
    """The reservations that keep the waiting job off what it would count on with ``chosen``
    (victims that would let it fit were reservations ignored), by job id: on each node of
    the victims or with a reservation where it could take its smallest part but for them."""
    released: dict[str, list[tuple[float, int]]] = {}
    freed: dict[str, int] = {}
    for c in chosen:
        for node_id, gpus in c.job.placement.items():
            released.setdefault(node_id, []).append((reserved.release(c.job), len(gpus)))
            freed[node_id] = freed.get(node_id, 0) + len(gpus)
    per_node = min(per for _, per in shapes)
    found: dict[str, Reservation] = {}
    for node_id in sorted(set(released) | set(reserved.nodes)):
        node = pool.nodes.get(node_id)
        if node is not None and node.free_count + freed.get(node_id, 0) >= per_node:
            for r in reserved.conflicts(node, per_node, released.get(node_id, [])):
                found[r.job_id] = r
    return [found[k] for k in sorted(found)]


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
    preemptor: Preemptor | None = None,
    outgoing: Mapping[tuple[str, str], int] | None = None,
) -> tuple[list[Candidate], dict[str, int]]:
    """Candidate victims for a job of ``queue``/``flavor`` and what reclaim may take per
    queue (see module docstring); jobs in ``claimed`` (victims already chosen) are left out,
    and, given the waiting job as ``preemptor``, jobs that would stand before it once
    re-queued (without it, no job is left out for its order).

    ``outgoing`` ((queue, flavor) -> how many GPUs less it will hold once the preemptions
    are played out, ``PolicyState.outgoing``: its jobs under notice and the victims given
    notice earlier in the pass, less what its jobs that preempted will take): what a lender
    borrows, what reclaim may take from it and ``Candidate.rest`` are counted from what it
    holds less that. None: less its jobs under notice (``rest_of``).

    ``memo`` (job id -> its priority value and whether it is eligible) and ``made`` (the
    candidates of one queue and flavor, per kind and priority or borrowed GPUs, before
    ``claimed`` is taken out) may be kept across the calls of one pass over the same
    ``running``: a candidate is made of the job, its class, ``now`` and the priority or
    borrowed GPUs it is judged against (for reclaim, ``rest`` is the borrowed GPUs plus the
    queue's nominal quota), none of which changes for a key during a pass."""
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

    # The reclaim candidates of every borrower in turn, ``claimed`` taken out at the end:
    # once for them all, not once per borrower (a try that may reclaim meets some 40).
    lending: list[Candidate] = []

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
                order = preemptor.order(job) if preemptor is not None else None
                own.append(Candidate(job, "priority", victim_key(job, value, now), order))
        own.sort(key=_by_key)  # (``select`` sorts again: sorted runs make that cheap)
    if preemptor is not None and own:
        # Only jobs it stands before in their queue's order (module docstring; what
        # ``Preemptor.admits`` tests of one priority victim, without its dicts).
        mine = preemptor.key()
        found += [c for c in unclaimed(own) if c.order is None or mine < c.order]
    else:
        found += unclaimed(own)
    reclaimable: dict[str, int] = {}
    cohort = quota.queues[queue].cohort
    if within_nominal and cohort is not None:
        for other, _ in quota.borrowers(cohort, flavor, exclude=queue):
            # What it borrows once the preemptions are played out (``outgoing``; ``quota``
            # counts what it holds now until the pass is applied). Counted from ``quota``, a
            # queue whose borrowed GPUs were all reclaimed for one job still "borrowed" them
            # for the next, which took the queue's own quota.
            theirs = running.get((other, flavor), ())
            if outgoing is None:
                rest = rest_of(quota, other, flavor, theirs)
            else:
                rest = quota.used(other, flavor) - outgoing.get((other, flavor), 0)
            borrowed = rest - quota.nominal(other, flavor)
            if borrowed <= 0:
                continue
            reclaimable[other] = borrowed
            # (``borrowed`` fixes ``rest`` too: the key says all a candidate is made of)
            lent = made.get(("reclaim", other, flavor, borrowed))
            if lent is None:
                lent = made[("reclaim", other, flavor, borrowed)] = []
                # Re-queued, a victim may be in the first tier only where its queue has a
                # nominal quota (taken together with others, it may then: ``admits``).
                ordered = preemptor is not None and quota.nominal(other, flavor) > 0
                for job in theirs:
                    value, ok = judged(job)
                    oversize = job.gpus > borrowed
                    if ok and not (oversize and now < oversize_until(job, config)):
                        key = victim_key(job, value, now, oversize=oversize)
                        order = preemptor.order(job) if preemptor and ordered else None
                        lent.append(Candidate(job, "reclaim", key, order, rest))
                lent.sort(key=_by_key)
                # Those in the first tier re-queued alone: the only ones a job may not take
                # by themselves (most of the time none).
                made[("alone", other, flavor, borrowed)] = [
                    c for c in lent if next(first_tier_again(quota, (c,)), None) is not None
                ]
            alone = made[("alone", other, flavor, borrowed)]
            if preemptor is not None and alone:
                spared = {c.job.job_id for c in alone if not preemptor.admits(quota, (c,))}
                lending += [c for c in lent if c.job.job_id not in spared]
            else:
                lending += lent
    found += unclaimed(lending)
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
