"""One scheduling pass over a snapshot: ``schedule`` and the arrival fast path.

Contract of ``schedule(snapshot, config)`` (pure and deterministic: equal snapshots, in any
tuple order, give equal decisions):
1. Pending jobs are considered one at a time: within a queue by priority, declared size
   (``config.size_weight``), ageing and submit time (``fairshare.queue_key``); across queues
   the head with the lowest standing goes next -- first jobs that stay within their queue's
   nominal quota (and an idle queue's job larger than that quota: ``QuotaBook.first_tier``),
   then borrowers; within each, by fair share, priority level, size and
   waiting time (``fairshare``). Standings are recomputed as jobs are placed, so teams take
   turns.
2. A job starts now when its quota allows it (``quota``) and a gang shape fits on free GPUs
   (``packing``) without delaying any reservation (``backfill``). Its GPUs are then busy for
   every later job of the pass.
3. Otherwise it waits. The first waiting job of each queue and flavor may preempt (per
   ``preemption``): victims get a notice; the job starts in a later pass once they left
   (it preempts only for GPUs it could then take without delaying a reservation made
   earlier in the pass, ``preemption.Reserved``; else its explanation names them). The
   first ``config.reservations`` jobs of each flavor blocked for GPUs (free GPUs, or the
   shared pool of a full cohort) get a reservation that later jobs may not delay. A job that
   would fit, within its quota, once the GPUs being freed are free (held by no running job:
   an ended job whose runner is still stopping it, ``Node.teams``) waits for them and
   preempts no one: they come free without a victim, and one chosen then would be one too
   many (the victim its own notice already stopped, say). The GPUs it waits for are its
   own for the rest of the pass (``PolicyState.freeing``). A job that
   has waited ``ageing_s`` for its queue's own quota (nominal or borrowing limit) holds that
   quota: later jobs of its queue and flavor wait behind it (no starvation by a stream of
   smaller jobs).
4. Every waiting job gets an ``Explanation``: its position among the waiting jobs of its
   queue (in the order above), a reason naming the blocking constraint and its holders, a
   suggestion when a smaller or shorter request would start now, and an estimated start.

A pass pauses Python's cyclic garbage collector while it runs (``collector_paused``): it
keeps a ``Waiting`` and an ``Explanation`` per waiting job, and at 100,000 pending jobs
those hundreds of thousands of new objects set off several full collections, each walking
every object of the process. Reference counting still frees what the pass drops meanwhile.
A pass that leaves more than ``COLLECT_AFTER`` new objects ends with one collection of the
young and middle generations, which walks them once, in the pass, and moves what survives
to the oldest generation, rather than leaving them all to the first collection after it
(during an arrival on the fast path, say); a smaller pass leaves them to the collector's
usual course. Not a full collection: that would also walk every older object of the
process (the snapshot, the kept state), about three times as long at 100,000 pending.

``PolicyState`` keeps the pass's state so that ``decide_arrival`` can decide a new job in
about a millisecond: it starts it now when quota and free GPUs allow without delaying any
reservation (the same test a pass applies to a backfill candidate), else explains why it
waits; the next full pass reconsiders it with everyone else.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import heapq
import operator
from collections.abc import Generator, Mapping, Sequence, Set
from dataclasses import dataclass

from trainyard_platform.services.scheduler.policy import backfill
from trainyard_platform.services.scheduler.policy.fairshare import (
    FairShare,
    class_levels,
    size_levels,
)
from trainyard_platform.services.scheduler.policy.model import (
    DEFAULT_PRIORITY,
    Decisions,
    Explanation,
    PendingJob,
    Placement,
    PolicyConfig,
    Preemption,
    PriorityClass,
    RunningJob,
    Snapshot,
)
from trainyard_platform.services.scheduler.policy.packing import FlavorPool, NodeSlot, Shape
from trainyard_platform.services.scheduler.policy.preemption import (
    Candidate,
    Preemptor,
    Reserved,
    candidates_for,
    notice,
    reserved_conflicts,
    select,
)
from trainyard_platform.services.scheduler.policy.quota import QuotaBook, Verdict
from trainyard_platform.services.scheduler.policy.reasons import explain_all
from trainyard_platform.services.scheduler.policy.validation import (
    Invalid,
    usable_shapes,
    why_invalid,
)

HeapKey = tuple[int, float, float, int, str]
Orders = Mapping[str, tuple[Sequence[PendingJob], Sequence[float]]]
"""Queue -> its pending jobs in order and the first part of each one's ``queue_key``."""
_by_job_id = operator.attrgetter("job_id")
Entry = tuple[int, float, float, int, str, int, str]
"""A queue's entry in a pass's heap: its next job's ``HeapKey``, then the count of
placements when it was computed and the queue's name. Flat, not (key, count, name): the
heap compares entries about ten times per job (500 queues), and a nested key made each
comparison compare the keys twice (once for equality, once for order), for the same
order."""


@dataclass(slots=True)
class Waiting:
    """Why a job could not start in this pass (turned into an ``Explanation`` at the end)."""

    job: PendingJob
    kind: str
    """invalid | quota | held | capacity | reserved | behind | preempting"""
    position: int = 0
    text: str = ""
    """(invalid) the finished reason."""
    blocking: str = ""
    """(invalid) what stands in the way."""
    suggestion: str | None = None
    """(invalid) what to change."""
    verdict: Verdict | None = None
    shape: Shape = (1, 1)
    reservation: backfill.Reservation | None = None
    conflicts: Sequence[backfill.Reservation] = ()
    holder: PendingJob | None = None
    """(held) the starving job of the same queue and flavor that holds the quota."""
    victims: Sequence[str] = ()
    victim_kind: str = ""
    start: float | None = None
    reserved_ahead: Sequence[backfill.Reservation] = ()
    """(capacity, quota) reservations of jobs ahead that kept it from preempting: the GPUs
    its victims would free are theirs for part of its runtime (``preemption.Reserved``)."""


class PolicyState:
    """The cluster as one pass sees it; built from a ``Snapshot`` (see module docstring)."""

    def __init__(self, snapshot: Snapshot, config: PolicyConfig | None = None):
        self.now = snapshot.now
        self.config = config or PolicyConfig()
        self.classes = {c.name: c for c in snapshot.priority_classes}
        self._borrowing = {c.name: c.preemptible for c in snapshot.priority_classes}
        """Class name -> whether its jobs may borrow (``borrows``; asked of every job)."""
        self._level = class_levels(snapshot.priority_classes)
        self.quota = QuotaBook(snapshot.queues)
        by_flavor: dict[str, list[NodeSlot]] = {}
        for n in snapshot.nodes:
            by_flavor.setdefault(n.flavor, []).append(
                NodeSlot(n.node_id, n.topology, n.gpu_count, n.used)
            )
        self.pools = {f: FlavorPool(f, nodes) for f, nodes in sorted(by_flavor.items())}
        self.running: dict[tuple[str, str], list[RunningJob]] = {}
        self.leaving: dict[str, list[RunningJob]] = {}
        """Flavor -> its jobs under notice in the snapshot. A victim given notice in this pass
        is not added: it is ``_claimed``, which every reader of this leaves out."""
        self.holding: dict[tuple[str, str], list[tuple[float, int, str]]] = {}
        self.outgoing: dict[tuple[str, str], int] = {}
        """(queue, flavor) -> how many GPUs less it will hold once the preemptions are played
        out: its jobs under notice in the snapshot and its victims given notice in this pass,
        less the GPUs of its jobs that preempted in this pass (they take theirs once their
        victims have left). ``quota`` counts what the queue holds now until the pass is
        applied; what a lender borrows for reclaim is counted from this
        (``preemption.candidates_for``)."""
        self.team_of_job: dict[str, str] = {}
        held: dict[str, int] = {}
        for r in sorted(snapshot.running, key=_by_job_id):
            self._admit_running(r, held)
        running_ids = {r.job_id for r in snapshot.running}
        self.freeing: dict[str, dict[str, int]] = {}
        """Flavor -> node id -> its GPUs being freed (held by no running job) that no job
        of the pass waits for yet (``_waits_for_freeing``)."""
        for n in snapshot.nodes:  # holders whose GPUs are being freed: named as any job
            for job_id, team in n.teams.items():
                self.team_of_job.setdefault(job_id, team)
            if n.teams:
                freeing = sum(  # (a GPU past the node's count, shrunk since, is none)
                    1
                    for index, holder in n.used.items()
                    if holder not in running_ids and index < n.gpu_count
                )
                if freeing:
                    self.freeing.setdefault(n.flavor, {})[n.node_id] = freeing
        cluster_gpus = sum(p.total for p in self.pools.values())
        self.fair = FairShare(
            self.quota.queues.values(),
            snapshot.usage,
            held,
            self.config.half_life_s,
            cluster_gpus,
            self.config.fair_share,
        )
        self.pending = sorted(snapshot.pending, key=_by_job_id)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting: list[Waiting] = []
        self.reservations: dict[str, list[backfill.Reservation]] = {}
        self.reserved_nodes: dict[str, dict[str, NodeSlot]] = {}
        """Flavor -> the nodes that carry a reservation made in this pass (a blocked job's or
        a preemptor's hold): the nodes whose free GPUs a preemptor may not count on alone."""
        self._positions: dict[str, int] = {}
        self._tried: set[tuple[str, str]] = set()
        self._claimed: set[str] = set()
        self._holds: dict[tuple[str, str], PendingJob] = {}
        self._shape_cache: dict[tuple[str, int, int | None], tuple[Shape, ...]] = {}
        self._invalid_cache: dict[tuple[str, str, int, int | None, bool], Invalid | None] = {}
        self._request_cache: dict[
            tuple[str, str, int, int | None, bool], tuple[Invalid | None, tuple[Shape, ...]]
        ] = {}
        self._no_fit: dict[tuple[str, tuple[Shape, ...]], tuple[int, float]] = {}
        self._fit_now: dict[
            tuple[str, Shape], tuple[int, tuple[backfill.Reservation, ...], float]
        ] = {}
        self._gang_limits: dict[tuple[str, int], tuple[int, list[float]]] = {}
        """(flavor, GPUs per node) -> the pool's version and the sorted limits of the nodes
        with that many free (``_find``)."""
        self._level_cache: dict[tuple[str, int, float], float] = {}
        self._judged: dict[str, tuple[int, bool]] = {}
        self._candidates: dict[tuple[str, str, str, int], list[Candidate]] = {}
        # What ``incremental`` needs to know about the pass's course (see there).
        self.queue_order: dict[str, list[PendingJob]] = {}
        """Queue -> its pending jobs in the order the pass considered them."""
        self.queue_keys: dict[str, list[float]] = {}
        """Queue -> the first part of the ``queue_key`` of each job of ``queue_order``."""
        self._decided: list[str] | None = []
        """Job ids in the order of their decisions (the step of the n-th is n), until
        ``decided_at`` is first read; then None and that mapping is kept instead."""
        self._decided_at: dict[str, int] = {}
        self.tried_at: dict[tuple[str, str], int] = {}
        """(queue, flavor) -> the step of its one try to preempt."""
        self.reservations_full_at: dict[str, int] = {}
        """Flavor -> the step at which its last reservation (``config.reservations``) went."""
        self._step = 0
        self._placed_by_team: dict[str, int] = {}
        """Team -> jobs placed for it in this pass (each changed its fair share)."""

    # --- building ------------------------------------------------------------------------

    def _admit_running(self, r: RunningJob, held: dict[str, int]) -> None:
        queue = self.quota.queues.get(r.queue)
        team = queue.team if queue is not None else r.queue
        self.team_of_job[r.job_id] = team
        held[team] = held.get(team, 0) + r.gpus
        self.quota.add(r.queue, r.flavor, r.gpus)
        if r.notice_at is not None:
            end = max(self.now, r.notice_at + self.config.grace_s)
            self.leaving.setdefault(r.flavor, []).append(r)
            key = (r.queue, r.flavor)
            self.outgoing[key] = self.outgoing.get(key, 0) + r.gpus
        else:
            end = max(self.now, r.started_at + r.declared_runtime_s)
        self.running.setdefault((r.queue, r.flavor), []).append(r)
        self.holding.setdefault((r.queue, r.flavor), []).append((end, r.gpus, r.job_id))
        pool = self.pools.get(r.flavor)
        for node_id, indices in sorted(r.placement.items()):
            node = pool.nodes.get(node_id) if pool is not None else None
            if node is not None:
                backfill.add_release(node, end, len(indices))

    @property
    def decided_at(self) -> dict[str, int]:
        """Job id -> the step (count of ``decide`` calls) of its decision."""
        return self._settle()

    def _settle(self) -> dict[str, int]:
        """``decided_at``, made from the order of decisions if not yet made, and kept from
        then on. Only a kept pass is read for it (``incremental``): ``run`` makes it at
        its end, since made at the first read it would fall on the first arrival after
        the pass (25 ms at 10,000 nodes); ``schedule`` drops the state and never makes it
        (a mapping of 100,000 job ids made as the pass went took about 3% of the pass)."""
        if self._decided is not None:
            self._decided_at.update((j, n) for n, j in enumerate(self._decided, 1))
            self._decided = None
        return self._decided_at

    @property
    def claimed(self) -> Set[str]:
        """Ids of the running jobs chosen as victims in this pass (given notice in it, or
        under notice before and counted on by a job of it): no later job counts on them."""
        return self._claimed

    def priority(self, name: str) -> PriorityClass:
        return self.classes.get(name, DEFAULT_PRIORITY)

    def borrows(self, job: PendingJob) -> bool:
        """Whether ``job`` may borrow its cohort's quota: only a job reclaim can take back,
        i.e. one of a preemptible class (``quota``: the lender would never get it back)."""
        return self._borrowing.get(job.priority, DEFAULT_PRIORITY.preemptible)

    def level(self, job: PendingJob) -> float:
        """The job's priority level, less what its declared size costs it (``size_levels``).
        Cached per kind of request: a pass asks it for every job several times."""
        key = (job.priority, job.gpus, job.declared_runtime_s)
        level = self._level_cache.get(key)
        if level is None:
            size = size_levels(job.gpus, job.declared_runtime_s, self.config.size_weight)
            level = self._level_cache[key] = self._level[self.priority(job.priority).value] - size
        return level

    # --- the pass ------------------------------------------------------------------------

    def run(self) -> Decisions:
        """Decide every pending job once, in order (see module docstring), and make what a
        kept pass is read for (``decided_at``) before returning."""
        with collector_paused():
            self.decide_all()
            return self.decisions()

    def decide_all(self, orders: Orders | None = None) -> None:
        """``run`` without explaining the waiting jobs: their ``Waiting`` records are kept
        (``waiting``), and ``decisions`` explains them when asked (``incremental`` explains
        a kept pass at the first read of its explanations). ``orders``: every queue's
        pending jobs already in their order with their keys (``queue_order`` and
        ``queue_keys`` of a pass over the same pending jobs, the same priority classes and
        ``config``; ``incremental`` keeps them from pass to pass), instead of sorting them
        again; ignored unless they hold as many jobs as the snapshot's known queues."""
        with collector_paused():
            self._run(orders)
            self._settle()

    def _run(self, known: Orders | None = None) -> None:
        ageing = max(self.config.ageing_s, 1e-9)
        queues: dict[str, list[PendingJob]] = {}
        queued = 0
        for job in self.pending:
            if job.queue not in self.quota.queues:
                self.decide(job)
                continue
            if known is None:
                queues.setdefault(job.queue, []).append(job)
            else:
                queued += 1
        # Per queue, its jobs in order and the first part of their ``queue_key``
        # (``submitted_at / ageing - level``), which is also the job's part of its standing
        # (``_standing``): computed once per job, not at every push.
        orders: dict[str, list[float]] = {}
        if known is not None and sum(len(jobs) for jobs, _ in known.values()) != queued:
            known = None  # not the same jobs: they are sorted here
            for job in self.pending:
                if job.queue in self.quota.queues:
                    queues.setdefault(job.queue, []).append(job)
        if known is not None:
            for name, (jobs, keys) in known.items():
                if jobs:
                    queues[name], orders[name] = list(jobs), list(keys)
        else:
            levels = self._level_cache
            for name, jobs in queues.items():
                keyed = []
                for j in jobs:
                    level = levels.get((j.priority, j.gpus, j.declared_runtime_s))
                    if level is None:
                        level = self.level(j)  # fills the cache
                    # = queue_key(j.submitted_at, level, j.seq, j.job_id, ageing), inlined;
                    # flat, then the job (a nested key would be compared twice per comparison)
                    keyed.append(
                        (j.submitted_at / ageing - level, j.submitted_at, j.seq, j.job_id, j)
                    )
                keyed.sort()  # job ids are unique, so no two keys are equal: jobs never compared
                jobs[:] = [k[4] for k in keyed]
                orders[name] = [k[0] for k in keyed]
        # Entries carry the number of placements made when their key was computed: keys only
        # change when something is placed, so an entry from the same count is still exact.
        heap: list[Entry] = []
        cursor: dict[str, int] = {}
        for name, jobs in sorted(queues.items()):
            cursor[name] = 0
            self.queue_order[name] = jobs
            self.queue_keys[name] = orders[name]
            heap.append((*self._standing(jobs[0], ageing, orders[name][0]), 0, name))
        heapq.heapify(heap)
        placements = self.placements
        heappop, heappushpop = heapq.heappop, heapq.heappushpop
        decide = self.decide
        first_tier = self.quota.first_tier
        share = self.fair.share
        queue_of = self.quota.queues
        shares: dict[str, float] = {}
        """Queue -> its share when its team's count of placements was ``charged[queue]``."""
        charged: dict[str, int] = {}
        team_of = {name: q.team for name, q in queue_of.items()}
        placed_by = self._placed_by_team

        def standing(job: PendingJob, order: float) -> Entry:  # = _standing, inlined
            # A share changes only when its team places a job (``fair.charge``).
            name = job.queue
            n = placed_by.get(team_of[name], 0)
            if charged.get(name) != n:
                shares[name] = share(queue_of[name])
                charged[name] = n
            tier = 0 if first_tier(name, job.flavor, job.gpus) else 1
            return (
                tier,
                shares[name] + order,
                job.submitted_at,
                job.seq,
                job.job_id,
                len(placements),
                name,
            )

        # A queue's next entry goes in with ``heappushpop``, which pushes it and pops the
        # smallest as one step and skips the heap when it is the smallest itself (a third
        # of the time at 500 queues: the same queue goes again): the same order as a push
        # and then a pop, since no two keys are equal (each holds its job's id).
        entry = heappop(heap) if heap else None
        while entry is not None:
            name = entry[6]
            at = cursor[name]
            jobs = queues[name]
            if entry[5] != len(placements):
                fresh = standing(jobs[at], orders[name][at])
                if fresh[:5] != entry[:5] and heap and fresh[:5] > heap[0][:5]:
                    entry = heappushpop(heap, fresh)
                    continue
            decide(jobs[at])
            at = cursor[name] = at + 1
            if at < len(jobs):
                entry = heappushpop(heap, standing(jobs[at], orders[name][at]))
            else:
                entry = heappop(heap) if heap else None

    def _standing(self, job: PendingJob, ageing: float, order: float | None = None) -> HeapKey:
        """The job's standing (lower goes first; module docstring). ``order`` is
        ``job.submitted_at / ageing - self.level(job)`` when the caller has it."""
        quota = self.quota
        tier = 0 if quota.first_tier(job.queue, job.flavor, job.gpus) else 1
        if order is None:
            order = job.submitted_at / ageing - self.level(job)
        share = self.fair.share(quota.queues[job.queue])
        return (tier, share + order, job.submitted_at, job.seq, job.job_id)

    def decide(self, job: PendingJob, quick: bool = False) -> Placement | None:
        """Start ``job`` now if the rules allow, else record why it waits. ``quick`` (the
        arrival fast path) neither preempts nor reserves."""
        self._step += 1
        if self._decided is not None:
            self._decided.append(job.job_id)
        else:
            self._decided_at[job.job_id] = self._step
        borrows = self.borrows(job)
        request = (job.queue, job.flavor, job.gpus, job.gpus_per_node, borrows)
        known = self._request_cache.get(request)
        if known is None:
            self.invalid(job)  # fills _invalid_cache[request]
            bad = self._invalid_cache[request]
            known = self._request_cache[request] = (
                bad,
                self.shapes(job, self.pools[job.flavor]) if bad is None else (),
            )
        bad, shapes = known
        if bad is not None:
            self._wait(
                Waiting(
                    job,
                    "invalid",
                    text=bad.reason,
                    blocking=bad.blocking,
                    suggestion=bad.suggestion,
                )
            )
            return None
        pool = self.pools[job.flavor]
        verdict = self.quota.check(job.queue, job.flavor, job.gpus, borrows=borrows)
        waiting: Waiting
        if verdict.kind != "ok":  # = not verdict.ok
            # The commonest case at scale, taken apart from the rest: the same steps as for
            # any other waiting job below, less those that cannot apply to it.
            waiting = Waiting(job, "quota", verdict=verdict, shape=shapes[0])
            if not quick:
                self._quota_wait(job, pool, shapes, waiting, verdict)
            self._wait(waiting)
            return None
        end = self.now + job.declared_runtime_s
        if (job.queue, job.flavor) in self._holds:
            holder = self._holds[(job.queue, job.flavor)]
            waiting = Waiting(job, "held", verdict=verdict, shape=shapes[0], holder=holder)
        elif not self.config.backfill and self.reservations.get(job.flavor):
            first = self.reservations[job.flavor][0]
            waiting = Waiting(job, "behind", reservation=first, shape=shapes[0])
        else:
            found = self._find(pool, shapes, end)
            if found is not None:
                return self._place(job, pool, found[0], found[1], end, verdict.borrowing)
            waiting = Waiting(job, "capacity", verdict=verdict, shape=shapes[0])
            for shape in shapes:
                conflicts = self._conflicts(pool, shape, end)
                if conflicts:  # it fits now, but only on GPUs reserved for someone ahead
                    waiting.kind, waiting.shape, waiting.conflicts = "reserved", shape, conflicts
                    break
        if quick:
            self._wait(waiting)
            return None
        # Its quota allows it (else ``_quota_wait``): held, behind, capacity or reserved.
        if waiting.kind == "capacity" and (job.queue, job.flavor) not in self._tried:
            self._try_preempt(job, pool, shapes, waiting)
        if (
            waiting.kind in ("capacity", "reserved")
            and len(self.reservations.get(job.flavor, ())) < self.config.reservations
        ):  # (the count is checked here too: once they are all taken, most jobs come here)
            self._reserve(job, pool, shapes, waiting)
        self._wait(waiting)
        return None

    def _quota_wait(
        self,
        job: PendingJob,
        pool: FlavorPool,
        shapes: tuple[Shape, ...],
        waiting: Waiting,
        verdict: Verdict,
    ) -> None:
        """``decide``'s steps for a job its quota does not allow now (``waiting``, of kind
        "quota"), but recording it: it may preempt, hold its queue's quota or reserve."""
        if (job.queue, job.flavor) not in self._tried:
            self._try_preempt(job, pool, shapes, waiting)
            if waiting.kind == "preempting":
                return  # it holds what it preempted for (``_try_preempt``)
        kind = verdict.kind
        if kind == "cohort_full":
            # A full cohort is a shortage of GPUs shared by every queue in it, not of the
            # queue's own quota: holding the queue's quota would only stop its own later jobs
            # while other queues take the GPUs. Such a job gets a reservation that backfill
            # respects, as a job short of free GPUs does (simulated on the gangs-over-quota
            # stress trace, holds left 12% of the GPUs idle: docs/scheduling.md).
            if len(self.reservations.get(job.flavor, ())) < self.config.reservations:
                self._reserve(job, pool, shapes, waiting)
        elif (
            waiting.kind == "quota"
            and kind in ("nominal_full", "borrow_limit")
            and self.now - job.submitted_at >= self.config.ageing_s
        ):
            # A job starving for its queue's own quota keeps later jobs of the queue from
            # taking the quota it waits for; without this, a stream of small jobs could
            # starve it.
            self._holds.setdefault((job.queue, job.flavor), job)

    def _reserve(
        self, job: PendingJob, pool: FlavorPool, shapes: tuple[Shape, ...], waiting: Waiting
    ) -> None:
        taken = self.reservations.get(job.flavor)
        if taken is None:
            taken = self.reservations[job.flavor] = []
        if len(taken) < self.config.reservations:
            reservation = backfill.reserve(
                pool, job.job_id, shapes, job.declared_runtime_s, self.now
            )
            if reservation is not None:
                self._reserved_on(pool, reservation)
                taken.append(reservation)
                waiting.reservation = reservation
                if len(taken) == self.config.reservations:
                    self.reservations_full_at[job.flavor] = self._step

    def insert_waiting(self, waiting: Waiting, index: int, ahead: int, decided_at: int) -> None:
        """Record ``waiting`` as decided at step ``decided_at`` (a lower bound of it), at
        ``index`` of its queue's order, with ``ahead`` waiting jobs of the queue before it:
        a job ``incremental`` proved changes nothing else the pass decided."""
        job = waiting.job
        self._positions[job.queue] = self._positions.get(job.queue, 0) + 1
        waiting.position = ahead + 1
        self.waiting.append(waiting)
        self.decided_at[job.job_id] = decided_at
        self.queue_order[job.queue].insert(index, job)
        ageing = max(self.config.ageing_s, 1e-9)
        self.queue_keys[job.queue].insert(index, job.submitted_at / ageing - self.level(job))

    def invalid(self, job: PendingJob) -> Waiting | None:
        """Why ``job`` can never start as asked, or None (cached per kind of request)."""
        borrows = self.borrows(job)
        key = (job.queue, job.flavor, job.gpus, job.gpus_per_node, borrows)
        if key not in self._invalid_cache:
            pool = self.pools.get(job.flavor)
            shapes = self.shapes(job, pool) if pool is not None else ()
            self._invalid_cache[key] = why_invalid(job, self.quota, self.pools, shapes, borrows)
        found = self._invalid_cache[key]
        if found is None:
            return None
        return Waiting(
            job, "invalid", text=found.reason, blocking=found.blocking, suggestion=found.suggestion
        )

    def shapes(self, job: PendingJob, pool: FlavorPool) -> tuple[Shape, ...]:
        """The job's usable gang shapes (cached per flavor and request)."""
        key = (job.flavor, job.gpus, job.gpus_per_node)
        shapes = self._shape_cache.get(key)
        if shapes is None:
            shapes = self._shape_cache[key] = usable_shapes(job, pool)
        return shapes

    def _find(
        self, pool: FlavorPool, shapes: tuple[Shape, ...], end: float
    ) -> tuple[list[NodeSlot], int] | None:
        """Nodes for the first of ``shapes`` that fits now without delaying a reservation.

        A search that failed is remembered with its pool's ``version`` and ``end``: while the
        pool is unchanged (no GPUs taken, no reservation made: each bumps the version), a
        search for the same shapes ending at ``end`` or later fails too, because
        ``backfill.allows`` only refuses more nodes as ``end`` grows and a search fails when
        too few nodes are allowed (one node; ``count`` in a domain or in all).

        A gang search that failed also leaves, for its pool's ``version`` and GPUs per node,
        the sorted limits (``_limit``) of the nodes with that many free: a later gang of
        that many per node, ending at any ``end``, is allowed on as many nodes as have a
        limit of at least ``end``, and fails without a search when they are fewer than its
        node count (``find`` gives only nodes it is allowed on). At 10,000 nodes, about 800
        failing gang searches a pass walked every node with room (often twice: in one
        domain, then across), at about 190 distinct versions and sizes."""
        key = (pool.flavor, shapes)
        failed = self._no_fit.get(key)
        if failed is not None and failed[0] == pool.version and end >= failed[1]:
            return None

        # (a partial, not a closure: it is called for every reserved node a search meets)
        allow = functools.partial(backfill.allows, end=end)
        for shape in shapes:
            count, per_node = shape
            if count > 1:
                limits = self._gang_limits.get((pool.flavor, per_node))
                if (
                    limits is not None
                    and limits[0] == pool.version
                    and len(limits[1]) - bisect.bisect_left(limits[1], end) < count
                ):
                    continue  # fewer than ``count`` nodes allow it: ``find`` fails
            nodes = pool.find(shape, allow)
            if nodes is not None:
                return nodes, shape[1]
            if count > 1:
                self._gang_limits[(pool.flavor, per_node)] = (
                    pool.version,
                    sorted(_limit(node, per_node) for node in pool.with_free(per_node)),
                )
        if failed is None or failed[0] != pool.version or end < failed[1]:
            self._no_fit[key] = (pool.version, end)
        return None

    def _conflicts(
        self, pool: FlavorPool, shape: Shape, end: float
    ) -> tuple[backfill.Reservation, ...]:
        """The reservations (by job id) that a job of ``shape`` ending at ``end`` would
        delay on the nodes it fits on now when reservations are ignored (``pool.find``).

        Those nodes, and which of their reservations lack the slack for ``shape`` (``r`` is
        delayed on a node when ``end > r.start`` and its slack there is short), are kept
        while the pool's ``version`` is unchanged: they read the free GPUs, the reservations
        and their slack, which only ``take`` (after ``commit``) and ``reserve`` change, and
        both bump the version. Only the test against ``end`` is made per job."""
        key = (pool.flavor, shape)
        kept = self._fit_now.get(key)
        if kept is None or kept[0] != pool.version:
            nodes = pool.find(shape)
            found: dict[str, backfill.Reservation] = {}
            for node in nodes or ():
                for r in node.reservations:
                    if r.slack[node.node_id] < shape[1]:
                        found[r.job_id] = r
            short = tuple(found[k] for k in sorted(found))
            # The latest start among them: a job ending after it delays them all, so the
            # answer is the kept tuple itself, found without a test per reservation (at
            # 10,000 nodes, for 24,000 of the 35,000 calls of a pass).
            latest = max((r.start for r in short), default=float("-inf"))
            kept = self._fit_now[key] = (pool.version, short, latest)
        _, short, latest = kept
        if end > latest:
            return short
        return tuple(r for r in short if end > r.start)

    def _place(
        self,
        job: PendingJob,
        pool: FlavorPool,
        nodes: list[NodeSlot],
        per_node: int,
        end: float,
        borrowed: bool,
    ) -> Placement:
        for node in nodes:
            backfill.commit(node, per_node, end)
            backfill.add_release(node, end, per_node)
        gpus = pool.take(nodes, per_node, job.job_id)
        placement = Placement(job.job_id, gpus, borrowed)
        self.placements.append(placement)
        self.quota.add(job.queue, job.flavor, job.gpus)
        team = self.quota.queues[job.queue].team
        self.team_of_job[job.job_id] = team
        self.fair.charge(team, job.gpus)
        self._placed_by_team[team] = self._placed_by_team.get(team, 0) + 1
        self.holding.setdefault((job.queue, job.flavor), []).append((end, job.gpus, job.job_id))
        return placement

    def _wait(self, waiting: Waiting) -> None:
        queue = waiting.job.queue
        self._positions[queue] = waiting.position = self._positions.get(queue, 0) + 1
        self.waiting.append(waiting)

    # --- preemption ----------------------------------------------------------------------

    def _try_preempt(
        self, job: PendingJob, pool: FlavorPool, shapes: tuple[Shape, ...], waiting: Waiting
    ) -> None:
        key = (job.queue, job.flavor)
        if key in self._tried:
            return
        self._tried.add(key)
        self.tried_at[key] = self._step
        if self._waits_for_freeing(job, pool, shapes):
            return
        leaving = [r for r in self.leaving.get(job.flavor, ()) if r.job_id not in self._claimed]
        if not self.config.preemption and not leaving:
            return
        within = self.quota.within_nominal(job.queue, job.flavor, job.gpus)
        running: Mapping[tuple[str, str], list[RunningJob]] = (
            self.running if self.config.preemption else {}
        )
        # Only jobs it would stand before once re-queued (no victim starts again first).
        preemptor = Preemptor(job, self.level, self.fair, max(self.config.ageing_s, 1e-9))
        found, reclaimable = candidates_for(
            self.quota,
            job.queue,
            job.flavor,
            self.priority(job.priority).value,
            within,
            running,
            leaving,
            self.priority,
            self.config,
            self.now,
            self._judged,
            self._candidates,
            # A job already chosen as a victim in this pass frees its GPUs once: it must not
            # be chosen again for another waiting job (nor its GPUs counted twice).
            self._claimed,
            preemptor,
            self.outgoing,
        )
        if not found:
            return

        def quota_ok(freed: Mapping[str, int]) -> bool:
            return self.quota.check(job.queue, job.flavor, job.gpus, freed, self.borrows(job)).ok

        def admits(victims: Sequence[Candidate]) -> bool:  # ... nor taken together
            return preemptor.admits(self.quota, victims)

        # Only what it could start on as its victims leave: not GPUs reserved, for part of
        # its runtime, for a job decided before it (``preemption.Reserved``).
        on = self.reserved_nodes.get(job.flavor)
        grace = self.config.grace_s
        reserved = (
            Reserved(on, self.now + grace + job.declared_runtime_s, self.now, grace) if on else None
        )
        chosen = select(found, pool, shapes, quota_ok, reclaimable, reserved, admits)
        if chosen is None:
            if reserved is not None:  # would it have preempted but for them? (its reason)
                ignoring = select(found, pool, shapes, quota_ok, reclaimable, None, admits)
                if ignoring is not None:
                    waiting.reserved_ahead = reserved_conflicts(ignoring, pool, shapes, reserved)
            return
        # It will hold its GPUs once its victims have left (priority: in its victims' queue).
        mine = (job.queue, job.flavor)
        self.outgoing[mine] = self.outgoing.get(mine, 0) - job.gpus
        ends = []
        for c in chosen:
            self._claimed.add(c.job.job_id)
            if c.kind is None:  # already leaving: its notice ends on its own clock
                assert c.job.notice_at is not None
                ends.append(c.job.notice_at + self.config.grace_s)
                continue
            ends.append(self.now + self.config.grace_s)
            self._leaves_at(pool, c.job, self.now + self.config.grace_s)
            # Its queue holds it no more for later reclaims of the pass (``outgoing``).
            gone = (c.job.queue, c.job.flavor)
            self.outgoing[gone] = self.outgoing.get(gone, 0) + c.job.gpus
            reason = notice(
                job, self.priority(job.priority), c, self.priority(c.job.priority), self.now
            )
            self.preemptions.append(Preemption(c.job.job_id, job.job_id, c.kind, reason))
        kinds = {c.kind for c in chosen}
        waiting.kind = "preempting"
        waiting.victims = sorted(c.job.job_id for c in chosen)
        waiting.victim_kind = (
            "leaving" if kinds == {None} else "priority" if "priority" in kinds else "reclaim"
        )
        waiting.start = max(ends)
        # It holds what it preempted for: the GPUs free now and those its victims free are
        # reserved for it (outside the ``reservations`` count), so that no later job -- a
        # victim re-queued, say -- takes them meanwhile and makes it preempt again. Only
        # its victims' nodes and those with room now are searched: at 10,000 nodes a
        # search of the whole pool per preemption made the pass four times slower.
        among = {n.node_id: n for n in pool.with_free(min(per for _, per in shapes))}
        for c in chosen:
            for node_id in c.job.placement:
                node = pool.nodes.get(node_id)
                if node is not None:
                    among[node_id] = node
        waiting.reservation = backfill.reserve(
            pool, job.job_id, shapes, job.declared_runtime_s, self.now, among.values()
        )
        if waiting.reservation is not None:
            self._reserved_on(pool, waiting.reservation)

    def _waits_for_freeing(
        self, job: PendingJob, pool: FlavorPool, shapes: tuple[Shape, ...]
    ) -> bool:
        """Whether ``job`` fits, within its quota, once the GPUs being freed on its flavor's
        nodes are free: then it waits for them (they are taken from ``freeing`` for the rest
        of the pass, so that two jobs never wait for the same ones) instead of preempting."""
        freeing = self.freeing.get(job.flavor)
        if not freeing:
            return False
        if not self.quota.check(job.queue, job.flavor, job.gpus, {}, self.borrows(job)).ok:
            return False  # its quota, not the GPUs, keeps it waiting: reclaim may apply
        for count, per in shapes:
            ready = {n.node_id for _, n in zip(range(count), pool.with_free(per), strict=False)}
            more = [
                node_id
                for node_id, k in sorted(freeing.items())
                if node_id not in ready
                and pool.nodes[node_id].free_count < per <= pool.nodes[node_id].free_count + k
            ]
            if len(ready) + len(more) < count:
                continue
            for node_id in more[: count - len(ready)]:
                left = freeing[node_id] - (per - pool.nodes[node_id].free_count)
                if left > 0:
                    freeing[node_id] = left
                else:
                    del freeing[node_id]
            return True
        return False

    def _reserved_on(self, pool: FlavorPool, reservation: backfill.Reservation) -> None:
        on = self.reserved_nodes.setdefault(pool.flavor, {})
        for node_id in reservation.nodes:
            on[node_id] = pool.nodes[node_id]

    def _leaves_at(self, pool: FlavorPool, victim: RunningJob, at: float) -> None:
        """A victim given notice in this pass frees its GPUs at ``at`` (the end of its
        notice), not at its declared end: its nodes' releases say so from here on."""
        declared = max(self.now, victim.started_at + victim.declared_runtime_s)
        for node_id, indices in victim.placement.items():
            node = pool.nodes.get(node_id)
            release = (declared, len(indices))
            if node is not None and release in node.releases:  # (as ``_admit_running`` put it)
                node.releases.remove(release)
                backfill.add_release(node, at, len(indices))

    # --- result --------------------------------------------------------------------------

    def decisions(self) -> Decisions:
        explanations = explain_all(self, self.waiting)
        return Decisions(tuple(self.placements), tuple(self.preemptions), explanations)


def _limit(node: NodeSlot, gpus: int) -> float:
    """The latest end until which ``backfill.allows`` lets a job take ``gpus`` of ``node``
    now: the earliest start of its reservations whose slack there is under ``gpus`` (a job
    ending after it would delay that one); infinite when there is none."""
    limit = float("inf")
    node_id = node.node_id
    for r in node.reservations:
        if r.slack[node_id] < gpus and r.start < limit:
            limit = r.start
    return limit


COLLECT_AFTER = 100_000
"""New objects (the collector's youngest-generation count) above which a pass ends with a
collection of the young and middle generations (module docstring). The youngest generation is walked at the first
collection after the pass: 100,000 objects take a few milliseconds; the 10,000-node pass
leaves about 400,000. That collection costs a walk of every young object of the process,
which a small pass (the service's usual one) need not pay each time."""


@contextlib.contextmanager
def collector_paused() -> Generator[None, None, None]:
    """Python's cyclic garbage collector off for the block, then on again if it was on,
    after one collection of the young and middle generations (what survives moves to the
    oldest) when the block left more than ``COLLECT_AFTER`` new objects
    (see module docstring); left off if it was off. Measured on the scale benchmark's
    10,000-node pass: without the pause, four full collections and 72 of the middle
    generation, about a sixth of the pass's CPU time; with it, one collection at the end
    (0.11-0.16 s as a full one, 0.04 s of the young and middle generations), and no
    collection after the pass walks the pass's objects until a full one."""
    was = gc.isenabled()
    try:
        gc.disable()  # inside: an interrupt as it returns still finds the collector restored
        yield
    finally:
        if was:
            gc.enable()
            if gc.get_count()[0] > COLLECT_AFTER:
                gc.collect(1)


def schedule(snapshot: Snapshot, config: PolicyConfig | None = None) -> Decisions:
    """One full pass (see module docstring); its state is dropped, so what only a kept
    state is read for is not made (``PolicyState._settle``)."""
    with collector_paused():
        state = PolicyState(snapshot, config)
        state._run()
        decisions = state.decisions()
        # Dropped before the collection ending the pause: the state's objects (a
        # ``Waiting`` per waiting job, the pass's caches) are freed by reference counting
        # instead of walked by it first (at 10,000 nodes: 0.25 -> 0.09 s).
        del state
    return decisions


def decide_arrival(state: PolicyState, job: PendingJob) -> Decisions:
    """Decide a newly arrived job against ``state`` (a pass's state, updated in place):
    start it now if it fits without delaying anyone reserved, else explain why it waits."""
    mark = len(state.waiting)
    placement = state.decide(job, quick=True)
    if placement is not None:
        return Decisions(placements=(placement,))
    return Decisions(explanations=explain_all(state, state.waiting[mark:], quick=True))


__all__ = ["Explanation", "PolicyState", "decide_arrival", "schedule"]
