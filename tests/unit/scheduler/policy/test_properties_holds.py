"""Property tests of the preemption rules added for issue 16 (Hypothesis).

``test_properties`` checks every pass over job streams (GPUs, quotas, explanations, that
every victim was eligible, determinism under a shuffle of the snapshot's tuples) and
``test_incremental`` that incremental decisions equal a full pass. This file states what
those leave out, each against a model computed here from the snapshot, never with the
policy's own functions:

- **Victim choice** (docs/scheduling.md, "Which job goes"): for a job waiting alone, its
  victims are taken in the documented order (jobs under notice first; for reclaim, jobs no
  bigger than what their queue borrows, its jobs under notice gone, before bigger ones;
  reclaim takes from a queue only while it borrows so counted; then the least work lost in
  exact seconds; GPU-seconds of the whole gang; lowest priority; youngest; id), so the
  candidates ordered before its last victim would not have let it start; every victim is
  needed (none can be spared with the others still enough); the victims are enough; it
  stands before each of them once all of them have left and are re-queued (rule 6 for the
  set; a candidate that would break that for the set before it is skipped); and a job that
  preempts nobody could not have started with every admissible victim gone.
- **Victims taken together** (``set_worlds``): a lender's jobs reclaimed together, after
  which its queue may be back in the first tier; the victim choice above holds, and no
  victim starts again before its preemptor.
- **The preemptor's hold** ("The job that preempts holds what it preempted for"): after a
  pass that preempts, the next pass at the moment its victims have left -- nothing else
  having changed: no arrival, every job ending at its declared end -- starts every job that
  preempted, unless a job decided before it in that pass took what it needed.
- **Determinism** beyond the order of the snapshot's tuples: the order of the mappings
  inside them (a node's GPUs in use, a running job's placement, the usage by team).
- **Incremental = full pass** on states that carry the anti-thrash rules' inputs (jobs
  under notice, preempted before, checkpointed, some still protected), which the
  incremental property worlds lack.

Every world is derandomized with a fixed number of examples; each test counts the cases it
reached and fails if one was reached too rarely.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.unit.scheduler.test_quota_reference_model import Reference
from trainyard_platform.services.scheduler.policy import PolicyState, schedule
from trainyard_platform.services.scheduler.policy.incremental import Incremental
from trainyard_platform.services.scheduler.policy.model import (
    DEFAULT_PRIORITY,
    Decisions,
    Node,
    PendingJob,
    PolicyConfig,
    PriorityClass,
    Queue,
    RunningJob,
    Snapshot,
)

from .builders import CLASSES
from .test_properties import shuffled

K = TypeVar("K")
V = TypeVar("V")
NOW = 50_000.0
FLAVOR = "a100"
CLASS = {c.name: c for c in CLASSES}
SETTINGS = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
REACHED: Counter[str] = Counter()
Ranked = tuple[tuple[int, int, float, float, int, float, str], RunningJob, str]
"""A candidate victim: its place in the documented order, the job, and its kind."""


def _reached(what: str) -> None:
    REACHED[what] += 1
    event(what)


def assert_reached(*floors: tuple[str, int]) -> None:
    """Each interesting case was reached at least so often (see the module docstring).

    The floors are a third or less of the counts seen: derandomized Hypothesis still draws
    constants from the project's modules imported, so the examples (and the counts) change
    with the project's code (one floor of 40 was met 56 times with some modules imported
    and 36 with others); tests/conftest.py imports them all before any test, so a file run
    alone draws what it draws in the whole suite."""
    for what, at_least in floors:
        assert REACHED[what] >= at_least, f"{what!r} reached {REACHED[what]} times: {REACHED}"


def cls(name: str) -> PriorityClass:
    return CLASS.get(name, DEFAULT_PRIORITY)


# --- worlds: a busy cluster, some jobs under notice, waiting jobs -------------------------


@dataclass
class World:
    snapshot: Snapshot
    config: PolicyConfig


@st.composite
def configs(draw: st.DrawFn) -> PolicyConfig:
    return PolicyConfig(
        grace_s=draw(st.sampled_from([60.0, 300.0])),
        ageing_s=draw(st.sampled_from([600.0, 3600.0])),
        size_weight=draw(st.sampled_from([0.0, 8.0])),
        reservations=draw(st.sampled_from([0, 2, 8])),
        min_runtime_s=draw(st.sampled_from([0.0, 60.0, 300.0])),
        max_preemptions=draw(st.integers(1, 3)),
        oversize_protection_s=draw(st.sampled_from([0.0, 900.0, 4 * 3600.0])),
    )


@st.composite
def running_jobs(
    draw: st.DrawFn,
    nodes: list[Node],
    queues: list[Queue],
    config: PolicyConfig,
    favoured: list[str],
) -> list[RunningJob]:
    """Jobs filling the nodes, mostly of the ``favoured`` queues: some gangs over two nodes,
    random priorities, ages (to the second, some still protected), checkpoints, earlier
    preemptions, and notices."""
    free = {n.node_id: list(range(n.gpu_count)) for n in nodes}
    jobs: list[RunningJob] = []
    spare = draw(st.sampled_from([0, 0, 0, 1, 2]))
    for i in range(24):
        open_nodes = [n for n in sorted(free) if free[n]]
        if sum(len(f) for f in free.values()) <= spare:
            break  # a full cluster, or a few GPUs free
        first = draw(st.sampled_from(open_nodes))
        per = min(len(free[first]), draw(st.sampled_from([1, 1, 1, 2, 4, 8])))
        placement = {first: tuple(free[first][:per])}
        other = [n for n in open_nodes if n != first and len(free[n]) >= per]
        if other and draw(st.integers(0, 4)) == 0:
            second = draw(st.sampled_from(other))
            placement[second] = tuple(free[second][:per])
        for node_id, indices in placement.items():
            free[node_id] = free[node_id][len(indices) :]
        ran = float(draw(st.sampled_from([0, 600, 1800, 7200, 20000])) + draw(st.integers(0, 599)))
        # Often a checkpoint a few seconds to minutes ago: victims then differ by seconds.
        since = draw(st.one_of(st.integers(0, 150), st.integers(0, int(ran)), st.none()))
        checkpoint = None if since is None else NOW - float(min(since, int(ran)))
        notice = None
        if draw(st.integers(0, 5)) == 0:
            notice = NOW - float(draw(st.integers(0, int(config.grace_s) - 1)))
        # Submitted a moment to hours before it started: re-queued, some stand before a
        # younger waiting job of a higher class (ageing) or a larger one (size). Half have
        # no known submit time (``RunningJob.submitted_at`` None: not ordered against the
        # waiting job), so that jobs running for hours are still taken for a higher one.
        waited = float(draw(st.sampled_from([0] * 8 + [60, 600, 4 * 3600])))
        known = draw(st.booleans())
        jobs.append(
            RunningJob(
                f"r{i}",
                draw(st.sampled_from(favoured * 3 + [q.name for q in queues])),
                FLAVOR,
                per * len(placement),
                draw(st.sampled_from(["low", "low", "normal", "normal", "guarded", "pinned"])),
                NOW - ran,
                float(draw(st.sampled_from([1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0]))),
                placement,
                checkpoint,
                False,
                notice,
                draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
                NOW - ran - waited if known else None,
                100 + i,
            )
        )
    return jobs


@st.composite
def worlds(draw: st.DrawFn, waiting: tuple[int, int] = (1, 1)) -> World:
    """One flavor, 1-4 nodes, 2-3 queues, running jobs as ``running_jobs``, and ``waiting``
    pending jobs (min, max); gangs have a fixed shape (``gpus_per_node``). A third of the
    worlds are made for priority preemption (q0 and q1 outside any cohort, each with the
    whole cluster as its quota, the running jobs mostly q0's), a third for reclaim (q0 lends
    the whole cluster to queues of small quotas in its cohort, whose jobs run, and its
    waiting jobs outrank nobody), the rest mixed (quotas about the cluster's size, mostly in
    one cohort, some limits)."""
    config = draw(configs())
    nodes = [
        Node(f"n{i}", FLAVOR, draw(st.sampled_from([2, 4, 8])), f"t{i % 2}", {})
        for i in range(draw(st.integers(1, 4)))
    ]
    total = sum(n.gpu_count for n in nodes)
    kind = draw(st.sampled_from(["priority", "reclaim", "mixed"]))
    queues = []
    count = draw(st.integers(2, 3))
    for i in range(count):
        borrow: dict[str, int] = {}
        lend: dict[str, int] = {}
        if kind == "priority":
            nominal, cohort = {FLAVOR: total}, None
        elif kind == "reclaim":
            nominal, cohort = {FLAVOR: total if i == 0 else draw(st.integers(0, 2))}, "c1"
        else:
            nominal = {FLAVOR: draw(st.integers(0, max(1, 2 * total // count)))}
            if draw(st.integers(0, 3)) == 0:
                borrow = {FLAVOR: draw(st.integers(0, total))}
            if draw(st.booleans()):
                lend = {FLAVOR: draw(st.integers(0, nominal[FLAVOR]))}
            cohort = draw(st.sampled_from(["c1", "c1", "c1", None]))
        queues.append(Queue(f"q{i}", f"team{i}", cohort, nominal, borrow, lend, 1.0))
    favoured = [q.name for q in queues[1:]] if kind == "reclaim" else ["q0"]
    running = draw(running_jobs(nodes, queues, config, favoured))
    used: dict[str, dict[int, str]] = {n.node_id: {} for n in nodes}
    for r in running:
        for node_id, indices in r.placement.items():
            used[node_id].update(dict.fromkeys(indices, r.job_id))
    biggest = max(n.gpu_count for n in nodes)
    pending = []
    for i in range(draw(st.integers(*waiting))):
        per = draw(st.sampled_from([p for p in (1, 2, 4, 8) if p <= biggest]))
        priority = "low" if kind == "reclaim" else draw(st.sampled_from(["normal", "high", "high"]))
        pending.append(
            PendingJob(
                f"p{i}",
                "q0" if kind != "mixed" else draw(st.sampled_from(["q0", "q0", "q1"])),
                FLAVOR,
                per * draw(st.sampled_from([1, 1, 2])),
                priority,
                NOW - float(draw(st.integers(0, 7200))),
                float(draw(st.sampled_from([600.0, 3600.0, 4 * 3600.0]))),
                i,
                per,
            )
        )
    snapshot = Snapshot(
        NOW,
        tuple(replace(n, used=used[n.node_id]) for n in nodes),
        tuple(queues),
        CLASSES,
        tuple(pending),
        tuple(running),
        {f"team{i}": float(draw(st.integers(0, 10**6))) for i in range(count)},
    )
    return World(snapshot, config)


@st.composite
def hold_worlds(draw: st.DrawFn) -> World:
    """The case the hold was made for (seen on a local stack): one queue, its low-priority
    jobs running long past their protection, a few GPUs free, a high-priority job needing
    more than those, and small low-priority jobs waiting too (one GPU; declared runtimes
    shorter and longer than the notice), submitted after it; the running jobs submitted up
    to hours before they started; sometimes another queue's old job, too large for the GPUs
    free, that stands before the high one."""
    # Ageing slow enough that the running jobs (submitted an hour or more ago) mostly stand
    # after the high job once re-queued, so it may preempt them.
    config = replace(
        draw(configs()),
        reservations=draw(st.sampled_from([0, 8])),
        ageing_s=6 * 3600.0,
    )
    nodes = [
        Node(f"n{i}", FLAVOR, draw(st.sampled_from([2, 4])), "t0", {})
        for i in range(draw(st.integers(1, 3)))
    ]
    total = sum(n.gpu_count for n in nodes)
    spare = draw(st.integers(1, min(3, total - 1)))
    free = {n.node_id: list(range(n.gpu_count)) for n in nodes}
    running: list[RunningJob] = []
    while sum(len(f) for f in free.values()) > spare:
        node_id = draw(st.sampled_from([n for n in sorted(free) if free[n]]))
        per = min(len(free[node_id]), draw(st.sampled_from([1, 1, 2])))
        placement = {node_id: tuple(free[node_id][:per])}
        free[node_id] = free[node_id][per:]
        ran = float(draw(st.integers(3600, 4 * 3600)))
        waited = float(draw(st.sampled_from([0, 0, 0, 600, 24 * 3600])))
        running.append(
            RunningJob(
                f"r{len(running)}", "q0", FLAVOR, per, "low", NOW - ran, ran + 3600.0,
                placement, submitted_at=NOW - ran - waited, seq=100 + len(running),
            )
        )  # fmt: skip
    gpus = draw(st.integers(spare + 1, total))
    pending = [PendingJob("p0", "q0", FLAVOR, gpus, "high", NOW - 120.0, 600.0, 0)]
    for i in range(1, draw(st.integers(2, 5))):
        pending.append(
            PendingJob(
                f"p{i}", "q0", FLAVOR, 1, "low", NOW - 60.0,
                float(draw(st.sampled_from([30.0, 600.0, 3600.0]))), i,
            )
        )  # fmt: skip
    if draw(st.integers(0, 2)) > 0:
        # Another team's job waiting for two days, too large for the GPUs free, with
        # nobody to preempt in its queue: it stands before the high one (its team holds
        # nothing, and it has aged), and once the victims have left it is decided first
        # and may take what they freed.
        old = PendingJob("pa", "q1", FLAVOR, draw(st.integers(spare + 1, gpus)), "low",
                         NOW - 48 * 3600.0, 3600.0, 99)  # fmt: skip
        pending.append(old)
    used: dict[str, dict[int, str]] = {n.node_id: {} for n in nodes}
    for r in running:
        for node_id, indices in r.placement.items():
            used[node_id].update(dict.fromkeys(indices, r.job_id))
    snapshot = Snapshot(
        NOW,
        tuple(replace(n, used=used[n.node_id]) for n in nodes),
        (Queue("q0", "team0", None, {FLAVOR: total}), Queue("q1", "team1", None, {FLAVOR: total})),
        CLASSES,
        tuple(pending),
        tuple(running),
        {},
    )
    return World(snapshot, config)


@st.composite
def set_worlds(draw: st.DrawFn) -> World:
    """Rule 6 for victims taken together (``test_victim_sets.py``), varied: queue q0 of a
    cohort waits with one job of up to 8 GPUs; q1 of the same cohort (nominal quota 0-3)
    runs two to four jobs of 1-4 GPUs past their protections, submitted before they
    started, on one or two 8-GPU nodes; q0's team has used a lot, q1's mostly nothing. Reclaimed
    together, q1 may be back within its quota or hold nothing, and its first job
    re-queued may stand before the waiting one."""
    config = replace(
        draw(configs()),
        min_runtime_s=60.0,
        oversize_protection_s=draw(st.sampled_from([0.0, 4 * 3600.0])),
    )
    nodes = [Node(f"n{i}", FLAVOR, 8, "t0", {}) for i in range(draw(st.integers(1, 2)))]
    total = 8 * len(nodes)
    lent = draw(st.integers(0, 3))
    free = {n.node_id: list(range(n.gpu_count)) for n in nodes}
    running: list[RunningJob] = []
    for i in range(draw(st.integers(2, 4))):
        open_nodes = [n for n in sorted(free) if free[n]]
        if not open_nodes:
            break
        node_id = draw(st.sampled_from(open_nodes))
        per = min(len(free[node_id]), draw(st.integers(1, 4)))
        placement = {node_id: tuple(free[node_id][:per])}
        free[node_id] = free[node_id][per:]
        ran = float(draw(st.integers(3600, 6 * 3600)))
        waited = float(draw(st.sampled_from([0, 600, 3600])))
        running.append(
            RunningJob(
                f"r{i}", "q1", FLAVOR, per, "low", NOW - ran, 24 * 3600.0, placement,
                submitted_at=NOW - ran - waited, seq=100 + i,
            )
        )  # fmt: skip
    idle = sum(len(f) for f in free.values())
    gpus = draw(st.integers(min(idle + 1, 8), 8))
    submitted = NOW - float(draw(st.integers(0, 3600)))
    pending = (PendingJob("p0", "q0", FLAVOR, gpus, "low", submitted, 3600.0, 0),)
    used: dict[str, dict[int, str]] = {n.node_id: {} for n in nodes}
    for r in running:
        for node_id, indices in r.placement.items():
            used[node_id].update(dict.fromkeys(indices, r.job_id))
    heavy = 500.0 * 8 * 24 * 3600
    snapshot = Snapshot(
        NOW,
        tuple(replace(n, used=used[n.node_id]) for n in nodes),
        (
            Queue("q0", "team0", "c1", {FLAVOR: total - lent}),
            Queue("q1", "team1", "c1", {FLAVOR: lent}),
        ),
        CLASSES,
        pending,
        tuple(running),
        {"team0": heavy, "team1": draw(st.sampled_from([0.0, 0.0, heavy]))},
    )
    return World(snapshot, config)


# --- the model: who may be taken, in which order, and whether a job then fits -------------


class Model:
    """The snapshot as the documentation describes it, for one waiting job."""

    def __init__(self, snapshot: Snapshot, config: PolicyConfig):
        self.snapshot = snapshot
        self.config = config
        self.quota = Reference(list(snapshot.queues))
        for r in snapshot.running:
            self.quota.used[(r.queue, r.flavor)] += r.gpus
        self.free = {n.node_id: n.gpu_count - len(n.used) for n in snapshot.nodes}

    def fits(self, job: PendingJob, gone: Iterable[RunningJob]) -> bool:
        """Whether ``job`` fits its quota and its gang shape once ``gone`` have left."""
        gone = list(gone)
        freed: Counter[str] = Counter()
        free = dict(self.free)
        for r in gone:
            freed[r.queue] += r.gpus
            for node_id, indices in r.placement.items():
                free[node_id] += len(indices)
        per = job.gpus_per_node or job.gpus
        enough = sum(1 for n in free.values() if n >= per) >= job.gpus // per
        return enough and self.quota.check(job.queue, job.flavor, job.gpus, freed).kind == "ok"

    def protected(self, r: RunningJob) -> bool:
        c = cls(r.priority)
        floor = self.config.min_runtime_s * 2**r.preemptions
        return (
            not c.preemptible
            or r.preemptions >= self.config.max_preemptions
            or self.snapshot.now - r.started_at < max(c.min_runtime_s, floor)
        )

    def order(self, j: PendingJob | RunningJob) -> tuple[float, float, int, str]:
        """Where ``j`` stands (or, running, would stand re-queued) in its queue's order:
        ageing, priority level (its rank among the classes' values) less the size term
        (``size_weight`` levels per factor of ten in declared GPU-hours), submit time,
        sequence, id ("Which job goes first")."""
        assert j.submitted_at is not None
        values = sorted({c.value for c in CLASSES} | {DEFAULT_PRIORITY.value})
        weight = self.config.size_weight
        hours = max(j.gpus * j.declared_runtime_s, 60.0) / 3600.0
        level = values.index(cls(j.priority).value) - weight * math.log10(hours)
        return (j.submitted_at / self.config.ageing_s - level, j.submitted_at, j.seq, j.job_id)

    def share(self, queue: str, less: int = 0) -> float:
        """The fair share of ``queue``'s team in its cohort ("Which job goes first"), with
        ``less`` GPUs fewer held."""
        if not self.config.fair_share:
            return 0.0
        queues = self.snapshot.queues
        mine = next(q for q in queues if q.name == queue)

        def group(q: Queue) -> str:
            return q.cohort if q.cohort is not None else f"queue:{q.name}"

        members = [q for q in queues if group(q) == group(mine)]
        total = sum(max(q.weight, 1e-9) for q in members)
        weight = sum(max(q.weight, 1e-9) for q in members if q.team == mine.team)
        nominal = sum(sum(q.nominal.values()) for q in members)
        cluster = sum(n.gpu_count for n in self.snapshot.nodes)
        per_weight = (nominal or cluster or 1) / total
        team_of = {q.name: q.team for q in queues}
        held = sum(r.gpus for r in self.snapshot.running if team_of.get(r.queue) == mine.team)
        past = self.snapshot.usage.get(mine.team, 0.0) * math.log(2) / self.config.half_life_s
        return (past + held - less) / (weight * per_weight)

    def admits(self, job: PendingJob, victims: Iterable[tuple[RunningJob, str]]) -> bool:
        """Whether ``job`` is ordered before each of ``victims`` (job, kind) once all of
        them have left and are re-queued (a victim set must be, "When a job may be
        preempted", rule 6): in their queue's order for priority; for reclaim, only a victim
        then in the first tier (its queue, its jobs under notice and every victim of the set
        gone, is within its nominal quota with it again, or holds nothing else), by fair
        share (each team's with the set's GPUs of that team gone: the victim's, and the
        waiting job's own) and order."""
        victims = [(r, kind) for r, kind in victims if kind != "leaving"]
        team_of = {q.name: q.team for q in self.snapshot.queues}
        gone: Counter[str] = Counter()
        held: Counter[str] = Counter()
        for r, _ in victims:
            gone[r.queue] += r.gpus
            held[team_of[r.queue]] += r.gpus
        for r, kind in victims:
            if r.submitted_at is None:
                continue
            mine, theirs = self.order(job), self.order(r)
            if kind == "priority":
                if not mine < theirs:
                    return False
                continue
            nominal = self.quota.queues[r.queue].nominal.get(r.flavor, 0)
            # Its queue's use once its jobs under notice and the set have left.
            left = (
                sum(
                    o.gpus
                    for o in self.snapshot.running
                    if o.queue == r.queue and o.flavor == r.flavor and o.notice_at is None
                )
                - gone[r.queue]
            )
            if not (left + r.gpus <= nominal or (left == 0 and nominal > 0)):
                continue  # re-queued, it borrows: ordered after every job within its quota
            first = self.share(job.queue, less=held[team_of[job.queue]]) + mine[0]
            other = self.share(r.queue, less=held[team_of[r.queue]]) + theirs[0]
            if not (first, *mine[1:]) < (other, *theirs[1:]):
                return False
        return True

    def lost(self, r: RunningJob) -> float:
        since = r.started_at
        if r.last_checkpoint_at is not None and r.last_checkpoint_at > since:
            since = r.last_checkpoint_at
        return max(0.0, self.snapshot.now - since)

    def candidates(self, job: PendingJob) -> tuple[list[Ranked], dict[str, int]]:
        """Every job the documentation lets ``job`` take, with its place in the order and
        its kind ("leaving", "priority" or "reclaim"), and what reclaim may take per queue."""
        now = self.snapshot.now
        quota = self.quota
        queue = quota.queues[job.queue]
        mine = quota.used[(job.queue, job.flavor)] + job.gpus <= queue.nominal.get(job.flavor, 0)
        borrowed = {}
        if mine and queue.cohort is not None:
            for name, q in quota.queues.items():
                if name != job.queue and q.cohort == queue.cohort:
                    # What it borrows once its jobs under notice have left ("Reclaim").
                    leaving = sum(
                        r.gpus
                        for r in self.snapshot.running
                        if r.queue == name and r.flavor == job.flavor and r.notice_at is not None
                    )
                    over = quota.used[(name, job.flavor)] - leaving - q.nominal.get(job.flavor, 0)
                    if over > 0:
                        borrowed[name] = over
        found = []
        for r in self.snapshot.running:
            if r.flavor != job.flavor:
                continue
            lost = self.lost(r)
            tail = (lost, lost * r.gpus, cls(r.priority).value, -r.started_at, r.job_id)
            if r.notice_at is not None:
                found.append(((0, 0, *tail), r, "leaving"))
            elif self.protected(r):
                continue
            elif r.queue == job.queue and cls(r.priority).value < cls(job.priority).value:
                if self.admits(job, [(r, "priority")]):
                    found.append(((1, 0, *tail), r, "priority"))
            elif r.queue in borrowed:
                if not self.admits(job, [(r, "reclaim")]):
                    continue
                oversize = r.gpus > borrowed[r.queue]
                if oversize and now - r.started_at < self.config.oversize_protection_s:
                    continue
                found.append(((1, int(oversize), *tail), r, "reclaim"))
        found.sort(key=lambda c: c[0])
        return found, borrowed

    def prefix(
        self,
        job: PendingJob,
        candidates: list[Ranked],
        borrowed: Mapping[str, int],
    ) -> list[RunningJob]:
        """The candidates in order, less the reclaims from a queue no longer borrowing once
        those before them are taken ("only from a queue while it still borrows"), and less
        each candidate that ``job`` would not stand before, or that would put one of those
        before taken before ``job``, once all of them have left (``admits``)."""
        taken: Counter[str] = Counter()
        out: list[tuple[RunningJob, str]] = []
        for _, r, kind in candidates:
            if kind == "reclaim" and taken[r.queue] >= borrowed[r.queue]:
                continue
            if not self.admits(job, [*out, (r, kind)]):
                _reached("a candidate refused with the victims before it")
                continue
            if kind == "reclaim":
                taken[r.queue] += r.gpus
            out.append((r, kind))
        return [r for r, _ in out]


# --- victim choice -----------------------------------------------------------------------


@settings(SETTINGS, max_examples=1000)
@given(world=worlds())
def _victims_of_a_waiting_job(world: World) -> None:
    check_victims(world)


@settings(SETTINGS, max_examples=200)
@given(world=set_worlds())
def _victims_taken_together(world: World) -> None:
    check_victims(world)


def check_victims(world: World) -> None:
    """A waiting job's victims (``worlds`` with one waiting job): see the module docstring."""
    snapshot, config = world.snapshot, world.config
    (job,) = snapshot.pending
    decisions = schedule(snapshot, config)
    if decisions.placements:
        _reached("placed at once")
        return
    model = Model(snapshot, config)
    running = {r.job_id: r for r in snapshot.running}
    found, borrowed = model.candidates(job)
    order = [r.job_id for _, r, _ in found]
    leaving = [r for _, r, kind in found if kind == "leaving"]
    chosen = [running[p.job_id] for p in decisions.preemptions]
    assert all(p.for_job_id == job.job_id for p in decisions.preemptions)
    if not chosen:
        # It preempts nobody: the jobs already leaving are enough, or even every job it may
        # take would not be.
        allowed = model.prefix(job, found, borrowed)
        assert model.fits(job, leaving) or not model.fits(job, allowed), (
            f"{job.job_id} preempts nobody, but taking {[r.job_id for r in allowed]} would "
            "let it start"
        )
        _reached("no victim: leaving enough" if model.fits(job, leaving) else "no victim set")
        return
    for victim in chosen:
        assert victim.job_id in order, f"{victim.job_id} may not be taken"
    kind_of = {r.job_id: kind for _, r, kind in found}
    assert model.admits(job, [(r, kind_of[r.job_id]) for r in chosen]), (
        f"{job.job_id} would not stand before all of {[r.job_id for r in chosen]} re-queued"
    )
    kinds = {p.kind for p in decisions.preemptions}
    _reached(f"{'+'.join(sorted(kinds))} victims: {min(len(chosen), 3)}")
    # Enough: with the jobs already leaving, it fits once its victims have left.
    assert model.fits(job, leaving + chosen), "its victims are not enough"
    # Needed: none could be spared (the jobs already leaving still counted).
    for victim in chosen:
        rest = [r for r in chosen if r is not victim]
        assert not model.fits(job, leaving + rest), f"{victim.job_id} was not needed"
    # In order: the candidates before its last victim would not have been enough.
    last = max(order.index(r.job_id) for r in chosen)
    before = model.prefix(job, found[:last], borrowed)
    assert not model.fits(job, before), (
        f"victims {[r.job_id for r in chosen]}, but {[r.job_id for r in before]} (losing "
        "less work) would have been enough"
    )
    spared = [r for r in before if r.notice_at is None and r not in chosen]
    if spared:
        _reached("a candidate losing less work was spared")
        if any(
            model.lost(r) < 60 and model.lost(r) != model.lost(v) for r in spared for v in chosen
        ):
            _reached("victims told apart by seconds under a minute")


def test_victims_are_needed_enough_and_taken_by_least_work_lost() -> None:
    REACHED.clear()
    _victims_of_a_waiting_job()
    assert_reached(
        ("priority victims: 1", 20),
        ("reclaim victims: 1", 15),
        ("a candidate losing less work was spared", 8),
        ("victims told apart by seconds under a minute", 1),
    )
    REACHED.clear()
    _victims_taken_together()
    assert_reached(
        ("reclaim victims: 3", 6),
    )


# --- the preemptor's hold ----------------------------------------------------------------


def when_notices_end(snapshot: Snapshot, decisions: Decisions, config: PolicyConfig) -> Snapshot:
    """The snapshot at ``now + grace_s`` after ``decisions``, nothing else having happened:
    the jobs it placed run, every job under notice (its victims included) has left and
    waits again (its submit time and sequence kept, as the service keeps them; submitted
    when it started if unknown; its gang's shape kept), jobs whose declared
    end has come have ended, nothing arrived."""
    at = snapshot.now + config.grace_s
    pending = {j.job_id: j for j in snapshot.pending}
    victims = {p.job_id for p in decisions.preemptions}
    running = []
    waiting = [j for j in snapshot.pending if j.job_id in decisions.explanations]
    for r in snapshot.running:
        if r.notice_at is not None or r.job_id in victims:
            per = len(next(iter(r.placement.values())))
            kept = r.submitted_at is not None
            waiting.append(
                PendingJob(
                    r.job_id, r.queue, r.flavor, r.gpus, r.priority,
                    r.submitted_at if r.submitted_at is not None else r.started_at,
                    r.declared_runtime_s, r.seq if kept else 1000 + len(waiting), per,
                )
            )  # fmt: skip
        elif r.started_at + r.declared_runtime_s > at:
            running.append(r)
    for p in decisions.placements:
        job = pending[p.job_id]
        if snapshot.now + job.declared_runtime_s > at:
            running.append(
                RunningJob(
                    job.job_id, job.queue, job.flavor, job.gpus, job.priority, snapshot.now,
                    job.declared_runtime_s, dict(p.gpus), borrowed=p.borrowed,
                )
            )  # fmt: skip
    used: dict[str, dict[int, str]] = {n.node_id: {} for n in snapshot.nodes}
    for r in running:
        for node_id, indices in r.placement.items():
            used[node_id].update(dict.fromkeys(indices, r.job_id))
    return replace(
        snapshot,
        now=at,
        nodes=tuple(replace(n, used=used[n.node_id]) for n in snapshot.nodes),
        pending=tuple(waiting),
        running=tuple(running),
    )


def check_hold(world: World, victims_wait: bool) -> None:
    """After a pass that preempts, the pass at the end of the notices (``when_notices_end``)
    starts every job that preempted, unless a job decided before it in that pass took what
    it needs (it stood higher: the hold is made when the preemptor's turn comes): started,
    or holds what it waits for. ``victims_wait``: and that job is none of its own victims."""
    snapshot, config = world.snapshot, world.config
    decisions = schedule(snapshot, config)
    preemptors = sorted({p.for_job_id for p in decisions.preemptions})
    if not preemptors:
        _reached("no preemption")
        return
    state = PolicyState(when_notices_end(snapshot, decisions, config), config)
    again = state.run()
    started = {p.job_id for p in again.placements}
    queue_of = {r.job_id: r.queue for r in snapshot.running}
    for job_id in preemptors:
        lent = Counter(
            queue_of[p.job_id]
            for p in decisions.preemptions
            if p.for_job_id == job_id and p.kind == "reclaim"
        )
        if any(n >= 2 for n in lent.values()):
            _reached("reclaim victims of one queue taken together")
        if job_id in started:
            _reached("the preemptor started")
            continue
        mine = {p.job_id for p in decisions.preemptions if p.for_job_id == job_id}
        # Jobs decided before it that took what it needs: placed, named as what blocks it
        # (a job holding its queue's quota, say), or holding a reservation (another team's
        # job is not named by its id).
        named = set(again.explanations[job_id].blocking.split(", "))
        reserved = {w.job.job_id for w in state.waiting if w.reservation is not None}
        before = {j for j, at in state.decided_at.items() if at < state.decided_at[job_id]}
        ahead = before & (started | named | reserved)
        assert ahead, (
            f"{job_id} preempted {sorted(mine)}, and when they had left it did not start "
            f"though no job before it did: {again.explanations[job_id].reason}"
        )
        _reached("a job ahead of the preemptor started")
        if victims_wait:
            # (A victim whose submit time the snapshot lacks is not ordered: not tested.)
            known = {r.job_id for r in snapshot.running if r.submitted_at is not None}
            again_first = ahead & mine & known
            assert not again_first, f"{sorted(again_first)} started again before {job_id}"
            if mine & known:
                _reached("victims with known submit times")


@SETTINGS
@given(world=st.one_of(worlds(waiting=(1, 5)), hold_worlds()))
def _preemptors_start_once_their_victims_left(world: World) -> None:
    check_hold(world, victims_wait=False)


@SETTINGS
@given(world=st.one_of(worlds(waiting=(1, 5)), hold_worlds()))
def _victims_wait_for_their_preemptor(world: World) -> None:
    check_hold(world, victims_wait=True)


@settings(SETTINGS, max_examples=200)
@given(world=set_worlds())
def _victims_taken_together_wait(world: World) -> None:
    check_hold(world, victims_wait=True)


def test_a_job_that_preempts_starts_once_its_victims_have_left() -> None:
    REACHED.clear()
    _preemptors_start_once_their_victims_left()
    assert_reached(
        ("the preemptor started", 30),
        ("a job ahead of the preemptor started", 15),
    )


def test_a_victim_does_not_start_again_before_the_job_that_preempted_it() -> None:
    """A re-queued victim keeps its submit time, so with ageing (or a smaller declared size)
    it could stand before the job that preempted it in their queue's order (or, alone in
    its queue, across queues), be decided first in the next pass and start again on the
    GPUs it left. A job preempts only jobs it stands before once re-queued, so it does not."""
    REACHED.clear()
    _victims_wait_for_their_preemptor()
    assert_reached(
        ("the preemptor started", 30),
        ("a job ahead of the preemptor started", 15),
        ("victims with known submit times", 8),
    )
    REACHED.clear()
    _victims_taken_together_wait()
    assert_reached(
        ("the preemptor started", 40),
        ("reclaim victims of one queue taken together", 12),
    )


def test_a_job_preempted_for_a_higher_one_is_not_preempted_again_for_it() -> None:
    """The smallest case, with the default configuration: one GPU; a low job r (submitted
    4 h ago, running for 30 min, declared 1 h) and a high job p submitted now (declared
    1 h). Re-queued, r (waiting 4 h: four levels of ageing against p's lead of three
    priority levels) would stand before p: before the fix p preempted it, r was decided
    first and started again when it had left, and p preempted it again two minutes later
    (its protection, doubled once). Now p waits for r's end and preempts nobody."""
    config = PolicyConfig()
    node = Node("n1", FLAVOR, 1, "t0", {})
    queues = (Queue("q", "team", None, {FLAVOR: 1}),)
    high = PendingJob("p", "q", FLAVOR, 1, "high", NOW, 3600.0, 1)
    low = PendingJob("r", "q", FLAVOR, 1, "low", NOW - 4 * 3600.0, 3600.0, 0)

    def runs(since: float, preempted: int) -> RunningJob:
        return RunningJob("r", "q", FLAVOR, 1, "low", since, 3600.0, {"n1": (0,)},
                          preemptions=preempted, submitted_at=low.submitted_at,
                          seq=low.seq)  # fmt: skip

    first = Snapshot(NOW, (replace(node, used={0: "r"}),), queues, CLASSES, (high,),
                     (runs(NOW - 1800.0, 0),))  # fmt: skip
    decisions = schedule(first, config)
    assert decisions.preemptions == (), "p preempted r, which stands before it re-queued"
    assert decisions.explanations["p"].estimated_start == NOW + 1800.0  # r's declared end
    # Submitted 2 h ago, r stands after p re-queued (two levels of ageing against three):
    # p preempts it, and once r has left, p starts and r waits.
    low = replace(low, submitted_at=NOW - 2 * 3600.0)
    first = replace(first, running=(runs(NOW - 1800.0, 0),))
    assert [p.job_id for p in schedule(first, config).preemptions] == ["r"]
    left = NOW + config.grace_s
    second = replace(first, now=left, nodes=(node,), pending=(high, low), running=())
    placed = [p.job_id for p in schedule(second, config).placements]
    assert placed == ["p"], f"placed {placed}"


# --- determinism: the order of the mappings inside the snapshot ---------------------------


def mixed_inside(snapshot: Snapshot, rng: random.Random) -> Snapshot:
    """``snapshot`` with its tuples shuffled (``test_properties.shuffled``) and the mappings
    inside them in another order: each node's GPUs in use, each running job's placement,
    the usage by team."""

    def mix(mapping: Mapping[K, V]) -> dict[K, V]:
        items = list(mapping.items())
        rng.shuffle(items)
        return dict(items)

    out = shuffled(snapshot, rng)
    return replace(
        out,
        nodes=tuple(replace(n, used=mix(n.used)) for n in out.nodes),
        running=tuple(replace(r, placement=mix(r.placement)) for r in out.running),
        usage=mix(out.usage),
    )


@SETTINGS
@given(world=st.one_of(worlds(waiting=(1, 5)), hold_worlds()), seed=st.integers(0, 1000))
def _same_decisions_whatever_the_order_inside(world: World, seed: int) -> None:
    decisions = schedule(world.snapshot, world.config)
    other = mixed_inside(world.snapshot, random.Random(seed))
    assert schedule(other, world.config) == decisions
    if decisions.preemptions:
        _reached("a pass that preempts")
    if any(len(r.placement) > 1 for r in world.snapshot.running):
        _reached("a gang running over two nodes")


def test_decisions_do_not_depend_on_the_order_of_mappings_in_the_snapshot() -> None:
    REACHED.clear()
    _same_decisions_whatever_the_order_inside()
    assert_reached(("a pass that preempts", 50), ("a gang running over two nodes", 50))


# --- incremental = full pass, with the anti-thrash rules' inputs ---------------------------


Event = tuple[str, object]


@st.composite
def events(draw: st.DrawFn, world: World) -> list[Event]:
    """Arrivals (some large, long and of low priority, queued last: the isolated path), jobs
    ending, nodes joining and leaving."""
    queues = [q.name for q in world.snapshot.queues]
    out: list[Event] = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["arrive", "late", "late", "end", "end", "join", "leave"]))
        if kind in ("arrive", "late"):
            late = kind == "late"
            gpus = draw(st.sampled_from([4, 8, 16] if late else [1, 2, 4]))
            out.append(
                (
                    "arrive",
                    PendingJob(
                        f"e{i}", draw(st.sampled_from(queues)), FLAVOR, gpus,
                        "low" if late else draw(st.sampled_from(["normal", "high"])),
                        world.snapshot.now - (0.0 if late else draw(st.sampled_from([0.0, 4000.0]))),
                        24 * 3600.0 if late else 600.0, 100 + i,
                    ),
                )
            )  # fmt: skip
        elif kind == "join":
            size = draw(st.sampled_from([2, 4, 8]))
            out.append(("join", Node(f"new{i}", FLAVOR, size, "t9")))
        else:
            out.append((kind, draw(st.integers(0, 1 << 16))))
    return out


@SETTINGS
@given(data=st.data())
def _incremental_equals_a_full_pass(data: st.DataObject) -> None:
    world = data.draw(worlds(waiting=(1, 6)))
    config, snapshot = world.config, world.snapshot
    nodes = {n.node_id: n for n in snapshot.nodes}
    pending = {j.job_id: j for j in snapshot.pending}
    running = {r.job_id: r for r in snapshot.running}

    def now() -> Snapshot:
        return replace(
            snapshot,
            nodes=tuple(nodes.values()),
            pending=tuple(pending.values()),
            running=tuple(running.values()),
        )

    inc = Incremental(snapshot, config)
    for kind, what in data.draw(events(world)):
        if kind == "arrive":
            assert isinstance(what, PendingJob)
            pending[what.job_id] = what
            before = inc.isolated
            decisions = inc.arrive(what)
            _reached("an isolated arrival" if inc.isolated > before else "an arrival passed")
        elif kind == "end" and running:
            assert isinstance(what, int)
            job = running.pop(sorted(running)[what % len(running)])
            for node_id, indices in job.placement.items():
                if node_id in nodes:
                    n = nodes[node_id]
                    used = {i: j for i, j in n.used.items() if i not in indices}
                    nodes[node_id] = replace(n, used=used)
            decisions = inc.end(job.job_id)
            _reached("a job under notice ended" if job.notice_at is not None else "a job ended")
        elif kind == "join":
            assert isinstance(what, Node)
            nodes[what.node_id] = what
            decisions = inc.node_joined(what)
            _reached("a node joined")
        elif kind == "leave" and nodes:
            assert isinstance(what, int)
            node_id = sorted(nodes)[what % len(nodes)]
            del nodes[node_id]
            decisions = inc.node_left(node_id)
            _reached("a node left")
        else:
            continue
        assert decisions == schedule(now(), config), f"after {kind} {what}"
        if decisions.preemptions:
            _reached("decisions that preempt")


def test_incremental_decisions_equal_a_full_pass_with_the_anti_thrash_inputs() -> None:
    REACHED.clear()
    _incremental_equals_a_full_pass()
    assert_reached(
        ("an isolated arrival", 30),
        ("an arrival passed", 30),
        ("a job under notice ended", 10),
        ("decisions that preempt", 50),
        ("a node left", 20),
    )
