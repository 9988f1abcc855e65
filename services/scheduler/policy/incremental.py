"""Incremental decisions: keep a snapshot and its last pass in memory, apply events to them,
and re-decide only what an event can change.

Contract of ``Incremental`` (pure, no I/O, no clock):
- It holds the current snapshot (``snapshot()``) and ``decisions``, which always equal
  ``schedule(snapshot(), config)`` -- the same placements, preemptions and explanations a
  full pass over the same state gives. Events take effect at the snapshot's clock (``now``
  does not move; a new clock means a new ``Incremental``, i.e. a full pass).
- Events: ``arrive`` (a pending job), ``end`` (a running job ended, its GPUs are free),
  ``node_joined`` and ``node_left``. Each returns the decisions after the event. Bad input
  (an id already known, an unknown id) raises ``ValueError`` naming the field.
- What an event re-decides:
  * An arriving job that cannot change anything the pass decided for other jobs is decided
    alone against the kept state (``arrival_is_isolated``): O(size of its queue's order
    lookup + one explanation), not a pass.
  * Anything else (an arrival that could start, take a reservation, preempt or overtake a
    job of its queue; a job ending; a node joining or leaving) changes free GPUs, quota or
    the order that every later decision of the greedy pass depends on, so the whole pass is
    re-run over the kept snapshot (``full_passes`` counts them).
- Explanations after such a pass are made at their first read: the pass decides and keeps
  each waiting job's ``Waiting`` record, and ``decisions.explanations`` (an ``Explained``
  mapping) explains them all from the pass's end state when any of them is first read, as
  the pass would have then; ``changed`` names them without explaining. An isolated arrival
  on a pass not yet explained adds its own explanation and the moved positions on top,
  leaving the pass's unmade. Explaining is about a third of a pass at scale (~90,000
  waiting jobs): an event's pass returns without it, and whoever reads the explanations
  pays it once. Decisions an event returned stay what they were when later events come
  (the end state they read belongs to their own pass; an isolated arrival's ``Waiting``
  comes after those they explain, and it changes nothing else they read).

Why an isolated arrival changes nothing else (``arrival_is_isolated`` checks each point):
- The pass decides, at each step, the queue head with the lowest current standing
  (``engine.PolicyState.run``; its lazy heap gives the same order as always-fresh keys,
  because standings only grow during a pass).
- A job that is never placed and changes no shared state only takes its queue's head slot
  from the moment its predecessor P in the queue's order is decided until it is decided
  itself. If its standing stays below that of its successor S meanwhile, every other job is
  decided in the same order on the same state: the pass is the old one with the job
  inserted. Same queue, so this holds unless S is in a lower tier
  (``QuotaBook.first_tier``: within its nominal quota, or an idle queue's job larger than
  it) while the job is not: so S must be out of the first tier from the start, or the job
  in it until the end (a job only ever leaves the first tier during a pass).
- It is never placed when its quota verdict is already "no" with the running jobs alone: a
  queue's own use and its cohort's pool use only grow during a pass, so the verdict stays
  "no". It changes no shared state when its queue and flavor tried to preempt by P's
  decision (one try per queue and flavor), when, lacking pooled cohort quota (which asks
  for a reservation), its flavor's reservations were all taken by P's decision, and when
  it has not waited ``ageing_s`` (so holds no quota) or has no successor. A job that can
  never start (invalid) changes nothing either.
- Its explanation reads only the end state of the pass, which it does not change; the
  waiting jobs after it in its queue move one position down.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import replace

from trainyard_platform.services.scheduler.policy.engine import (
    PolicyState,
    Waiting,
    collector_paused,
)
from trainyard_platform.services.scheduler.policy.fairshare import queue_key
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Explanation,
    Node,
    PendingJob,
    PolicyConfig,
    Snapshot,
)
from trainyard_platform.services.scheduler.policy.quota import QuotaBook
from trainyard_platform.services.scheduler.policy.reasons import explain_all, readers_team_of

OWN_QUOTA = ("no_quota", "nominal_full", "borrow_limit")
"""Verdicts about the queue's own quota (its use alone decides them)."""
POOLED = ("reclaim", "cohort_full")
"""Verdicts about the cohort's shared pool."""


class _Explaining:
    """The explanations of a kept pass's own waiting jobs (the first ``count`` of
    ``state.waiting``), made at the first read and kept. Only what the pass's end state
    holds is read (``reasons.explain_all``), which an isolated arrival leaves as it was: it
    only adds its own ``Waiting`` after these, which ``count`` leaves out."""

    def __init__(self, state: PolicyState):
        self.state = state
        self.count = len(state.waiting)
        self.made: dict[str, Explanation] | None = None
        self._placed: frozenset[str] | None = None

    def get(self) -> dict[str, Explanation]:
        if self.made is None:
            with collector_paused():  # (as in a pass: about 90,000 new objects at scale)
                self.made = explain_all(self.state, self.state.waiting[: self.count])
        return self.made

    def waits(self, job_id: str) -> bool:
        """Whether ``job_id``, a pending job of the pass, waits (it was not placed)."""
        if self._placed is None:
            self._placed = frozenset(p.job_id for p in self.state.placements)
        return job_id not in self._placed


class Explained(Mapping[str, Explanation]):
    """``Decisions.explanations`` of an ``Incremental`` after its own pass: the pass's
    explanations (``_Explaining``, made at the first read of any of them), then for each
    isolated arrival since, the positions it moved and its own explanation. The same
    mapping, read, as the explanations made at once; an event's pass returns without
    explaining ~90,000 waiting jobs nobody may read before the next event."""

    def __init__(
        self,
        explaining: _Explaining,
        moved: Mapping[str, int] | None = None,
        added: Mapping[str, Explanation] | None = None,
    ):
        self._explaining = explaining
        self._moved = dict(moved or {})
        """Job id -> positions it moved down (arrivals ahead of it in its queue)."""
        self._added = dict(added or {})
        """Explanations of the arrivals, in their order."""
        self._made: dict[str, Explanation] | None = None

    @property
    def read(self) -> bool:
        """Whether the pass's explanations have been made."""
        return self._explaining.made is not None

    def _all(self) -> dict[str, Explanation]:
        if self._made is None:
            made = self._explaining.get()
            if self._moved or self._added:
                made = dict(made)
                for job_id, by in self._moved.items():
                    e = made[job_id]
                    made[job_id] = replace(e, position=e.position + by)
                made.update(self._added)
            self._made = made
        return self._made

    def __getitem__(self, job_id: str) -> Explanation:
        return self._all()[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._all()

    def __repr__(self) -> str:
        return repr(self._all())

    def arrived(
        self, order: list[PendingJob], index: int, e: Explanation, job_id: str
    ) -> tuple[Explained, list[str]]:
        """These explanations after an isolated arrival ``job_id`` explained as ``e``, at
        ``index`` of its queue's ``order`` (before it is inserted there), made without
        reading the pass's explanations: the waiting jobs after it move one position down.
        Also the ids whose explanation changed: the arrival's, then those."""
        moved, added = dict(self._moved), dict(self._added)
        changed = [job_id]
        for later in order[index:]:
            later_id = later.job_id
            if later_id in added:
                added[later_id] = replace(added[later_id], position=added[later_id].position + 1)
            elif self._explaining.waits(later_id):
                moved[later_id] = moved.get(later_id, 0) + 1
            else:
                continue
            changed.append(later_id)
        added[job_id] = e
        return Explained(self._explaining, moved, added), changed

    def ahead(self, order: list[PendingJob], index: int) -> int:
        """How many of ``order[:index]`` wait."""
        added, waits = self._added, self._explaining.waits
        return sum(1 for j in order[:index] if j.job_id in added or waits(j.job_id))


class Incremental:
    """A snapshot and its last pass, kept up to date event by event (see module docstring)."""

    __deletable__ = ["state", "decisions"]  # mypyc's leave for ``del`` (``_pass``)

    def __init__(
        self,
        snapshot: Snapshot,
        config: PolicyConfig | None = None,
        state: PolicyState | None = None,
        decisions: Decisions | None = None,
    ):
        """Keep ``snapshot`` and its pass: ``state`` and its ``decisions`` when given (a
        ``PolicyState`` built from ``snapshot`` with ``config`` and what its ``run`` returned,
        as the scheduler's own pass gives them), else a pass run here."""
        self.config = config or PolicyConfig()
        self.now = snapshot.now
        self._queues = snapshot.queues
        self._classes = snapshot.priority_classes
        self._usage = dict(snapshot.usage)
        self._nodes = {n.node_id: n for n in snapshot.nodes}
        self._pending = {j.job_id: j for j in snapshot.pending}
        self._running = {r.job_id: r for r in snapshot.running}
        self.full_passes = 0
        """How many events (the first pass included) needed a whole pass."""
        self.isolated = 0
        """How many arrivals were decided alone (``arrival_is_isolated``)."""
        self._changed: tuple[str, ...] | None = ()
        self._arrived: list[PendingJob] = []
        """Arrivals since the kept pass that it does not hold (each asked for a pass)."""
        self.state: PolicyState
        self.decisions: Decisions
        self._pass(snapshot, state, decisions)

    @property
    def changed(self) -> tuple[str, ...]:
        """Ids of the waiting jobs whose explanation the last event changed (every waiting
        job after a whole pass, in the order of ``decisions.explanations``)."""
        if self._changed is None:
            self._changed = tuple(w.job.job_id for w in self.state.waiting[: self._count])
        return self._changed

    # --- state ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The current state as a snapshot (what ``decisions`` are a pass over)."""
        return Snapshot(
            self.now,
            tuple(self._nodes.values()),
            self._queues,
            self._classes,
            tuple(self._pending.values()),
            tuple(self._running.values()),
            dict(self._usage),
        )

    def _pass(
        self,
        snapshot: Snapshot | None = None,
        state: PolicyState | None = None,
        decisions: Decisions | None = None,
    ) -> Decisions:
        self.full_passes += 1
        snapshot = snapshot or self.snapshot()
        # The quota as the running jobs alone use it: what every verdict of the pass starts
        # from (it only grows from there during the pass).
        self._start_quota = QuotaBook(snapshot.queues)
        for r in snapshot.running:
            self._start_quota.add(r.queue, r.flavor, r.gpus)
        if state is None:
            orders = self._orders()
            # The old pass first goes: its ~100,000 objects would otherwise live through
            # the new pass's collection (``engine.collector_paused``).
            if hasattr(self, "state"):
                del self.state, self.decisions
            state = PolicyState(snapshot, self.config)
            state.decide_all(orders)
            self.decisions = Decisions(
                tuple(state.placements), tuple(state.preemptions), Explained(_Explaining(state))
            )
            self._team_of: dict[str, str] | None = None  # (made at the first arrival)
        else:
            # (Explaining every waiting job again would cost a fifth of a pass.)
            self.decisions = decisions if decisions is not None else state.decisions()
            # Made here, not at the first arrival: the scheduler's fast path keeps such a
            # pass for its arrivals (about 40 ms at 90,000 waiting jobs).
            self._team_of = readers_team_of(state, state.waiting)
        self.state = state
        self._count = len(state.waiting)
        self._changed = None
        return self.decisions

    def _orders(self) -> dict[str, tuple[list[PendingJob], list[float]]] | None:
        """Every queue's pending jobs in order, with their keys, for the next pass: the kept
        pass's (with its isolated arrivals), and the arrivals since, each inserted at its
        ``queue_key``. The order of a queue depends only on its jobs, the priority classes
        and the config, which events do not change; pending jobs only ever arrive."""
        if not hasattr(self, "state"):
            return None
        old = self.state
        orders = {
            name: (list(jobs), list(old.queue_keys[name])) for name, jobs in old.queue_order.items()
        }
        ageing = max(self.config.ageing_s, 1e-9)
        for job in self._arrived:
            if job.queue not in old.quota.queues:
                continue  # (decided apart, in job id order)
            jobs, keys = orders.setdefault(job.queue, ([], []))
            first = job.submitted_at / ageing - old.level(job)
            index = bisect.bisect_left(
                range(len(jobs)),
                (first, job.submitted_at, job.seq, job.job_id),
                key=lambda i: (keys[i], jobs[i].submitted_at, jobs[i].seq, jobs[i].job_id),
            )
            jobs.insert(index, job)
            keys.insert(index, first)
        self._arrived.clear()
        return orders

    def _teams(self) -> dict[str, str]:
        """Job id -> team of every job the kept pass holds, places or explains (made at the
        first isolated arrival after a pass, then kept up to date by them)."""
        if self._team_of is None:
            self._team_of = readers_team_of(self.state, self.state.waiting)
        return self._team_of

    # --- events --------------------------------------------------------------------------

    def knows(self, job_id: str) -> bool:
        """Whether ``job_id`` is pending or running in the kept snapshot."""
        return job_id in self._pending or job_id in self._running

    def arrive(self, job: PendingJob) -> Decisions:
        """A new pending job."""
        if job.job_id in self._pending or job.job_id in self._running:
            raise ValueError(f"job_id: {job.job_id} is already pending or running")
        self._pending[job.job_id] = job
        found = self.arrival_is_isolated(job)
        if found is None:
            self._arrived.append(job)
            return self._pass()
        waiting, index = found
        self.isolated += 1
        state = self.state
        order = state.queue_order[job.queue]
        team_of = self._teams()
        kept = self.decisions.explanations
        if isinstance(kept, Explained) and not kept.read:
            # Not explained yet (an event's pass): the pass's explanations stay unmade.
            ahead = kept.ahead(order, index)
            waiting.position = ahead + 1
            team_of[job.job_id] = state.quota.queues[job.queue].team
            own = explain_all(state, [waiting], team_of=team_of)[job.job_id]
            explained, changed = kept.arrived(order, index, own, job.job_id)
            state.insert_waiting(waiting, index, ahead, state.decided_at[order[index - 1].job_id])
            self.decisions = replace(self.decisions, explanations=explained)
            self._changed = tuple(changed)
            return self.decisions
        explanations = dict(kept)
        ahead = sum(1 for j in order[:index] if j.job_id in explanations)
        changed = [job.job_id]
        for later in order[index:]:
            e = explanations.get(later.job_id)
            if e is not None:
                explanations[later.job_id] = replace(e, position=e.position + 1)
                changed.append(later.job_id)
        # A lower bound of its own step, which is all a later arrival behind it asks for.
        state.insert_waiting(waiting, index, ahead, state.decided_at[order[index - 1].job_id])
        team_of[job.job_id] = state.quota.queues[job.queue].team
        explanations.update(explain_all(state, [waiting], team_of=team_of))
        self.decisions = replace(self.decisions, explanations=explanations)
        self._changed = tuple(changed)
        return self.decisions

    def end(self, job_id: str) -> Decisions:
        """A running job ended (or was stopped): its GPUs and quota are free."""
        job = self._running.pop(job_id, None)
        if job is None:
            raise ValueError(f"job_id: {job_id} is not running")
        for node_id, indices in job.placement.items():
            node = self._nodes.get(node_id)
            if node is not None:
                used = {i: j for i, j in node.used.items() if i not in indices}
                self._nodes[node_id] = replace(node, used=used)
        return self._pass()

    def node_joined(self, node: Node) -> Decisions:
        """A node became ready."""
        if node.node_id in self._nodes:
            raise ValueError(f"node_id: {node.node_id} is already ready")
        self._nodes[node.node_id] = node
        return self._pass()

    def node_left(self, node_id: str) -> Decisions:
        """A node was lost or drained (jobs on it stay running until they are ended)."""
        if self._nodes.pop(node_id, None) is None:
            raise ValueError(f"node_id: {node_id} is not a ready node")
        return self._pass()

    # --- the isolated arrival ------------------------------------------------------------

    def arrival_is_isolated(self, job: PendingJob) -> tuple[Waiting, int] | None:
        """How ``job`` would wait in a full pass and its index in its queue's order, when
        that provably changes nothing else the pass decides (see module docstring); None
        when a pass must decide."""
        state = self.state
        order = state.queue_order.get(job.queue)
        if job.queue not in state.quota.queues or not order:
            return None
        ageing = max(self.config.ageing_s, 1e-9)

        def key(j: PendingJob) -> tuple[float, float, int, str]:
            return queue_key(j.submitted_at, state.level(j), j.seq, j.job_id, ageing)

        index = bisect.bisect_left(order, key(job), key=key)
        if index == 0:
            return None  # first of its queue: nothing of its queue tried before it
        before = state.decided_at[order[index - 1].job_id]
        if index < len(order):
            after = order[index]
            if self._start_quota.first_tier(
                after.queue, after.flavor, after.gpus
            ) and not state.quota.first_tier(job.queue, job.flavor, job.gpus):
                return None  # its successor might go ahead of it across queues
            if self.now - job.submitted_at >= self.config.ageing_s:
                return None  # it might hold its queue's quota against its successors
        invalid = state.invalid(job)
        if invalid is not None:
            return invalid, index
        verdict = self._start_quota.check(
            job.queue, job.flavor, job.gpus, borrows=state.borrows(job)
        )
        if verdict.kind in POOLED:
            full_at = state.reservations_full_at.get(job.flavor)
            if self.config.reservations > 0 and (full_at is None or full_at > before):
                return None  # it might take a reservation
        elif verdict.kind not in OWN_QUOTA:
            # Its quota allows it now: it might start; and if it waits for GPUs, its estimate
            # and those of the jobs after it share one fluid estimate of the flavor.
            return None
        tried_at = state.tried_at.get((job.queue, job.flavor))
        if tried_at is None or tried_at > before:
            return None  # it might be its queue's try to preempt for this flavor
        shape = state.shapes(job, state.pools[job.flavor])[0]
        return Waiting(job, "quota", verdict=verdict, shape=shape), index


__all__ = ["Explained", "Incremental"]
