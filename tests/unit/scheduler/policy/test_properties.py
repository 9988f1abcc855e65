"""Property tests over random clusters and job streams (Hypothesis).

Each example builds a random cluster (flavors, node sizes, topology domains), queues (nominal
quotas, cohorts, borrowing and lending limits) and a stream of jobs, then runs several passes
on a moving clock, applying each pass's decisions (placements start, preempted jobs leave
after the grace period and requeue, jobs end at their true runtime). Every pass must:
never hand out a GPU twice or one that does not exist; place gangs whole with equal GPUs per
node; keep quotas and borrowing limits; explain every job it does not place; only preempt
eligible jobs; and give equal decisions for a shuffled copy of its snapshot.

Quotas are checked against the independent reference model of
``tests/unit/scheduler/test_quota_reference_model.py``, never against the production
``QuotaBook``: each placement, in the order the pass made it, must fit the quota the
reference model computes at that moment, and say it borrows exactly when it does.

Half of the worlds are *contended* (a small cluster, one cohort, more demand than GPUs,
priorities that outrank each other), and ``target`` steers towards passes that preempt and
borrow. The run is derandomized with a fixed number of examples; the test counts what it
reached (priority preemption, reclaim, borrowing, a cohort's pool filled exactly, gangs) and
fails if any was reached too rarely, so the interesting cases are exercised on every run.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import TypeVar

from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from tests.unit.scheduler.test_quota_reference_model import Reference
from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import (
    DEFAULT_PRIORITY,
    Decisions,
    Node,
    PendingJob,
    PolicyConfig,
    Queue,
    RunningJob,
    Snapshot,
)

from .builders import CLASSES

FLAVORS = ("a100", "h100")
T = TypeVar("T")


@dataclass
class World:
    nodes: list[Node]
    queues: list[Queue]
    jobs: list[PendingJob]
    """The stream: each job arrives at its ``submitted_at``."""
    true_runtime: dict[str, float]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    return draw(st.one_of(general_worlds(), contended_worlds()))


@st.composite
def contended_worlds(draw: st.DrawFn) -> World:
    """A small cluster of one flavor, queues sharing one cohort with quotas about the size of
    the cluster, and more jobs than GPUs, of priorities that outrank each other."""
    nodes = [
        Node(f"n{i}", "a100", draw(st.sampled_from([2, 4, 8])), f"t{i % 2}", {})
        for i in range(draw(st.integers(1, 3)))
    ]
    total = sum(n.gpu_count for n in nodes)
    queues = []
    count = draw(st.integers(2, 3))
    for i in range(count):
        nominal = {"a100": draw(st.integers(0, max(1, 2 * total // count)))}
        borrow = {"a100": draw(st.integers(0, total))} if draw(st.booleans()) else {}
        lend = {"a100": draw(st.integers(0, nominal["a100"]))} if draw(st.booleans()) else {}
        cohort = draw(st.sampled_from(["c1", "c1", "c1", None]))
        queues.append(Queue(f"q{i}", f"team{i}", cohort, nominal, borrow, lend, 1.0))
    jobs = []
    runtimes = {}
    for i in range(draw(st.integers(4, 20))):
        declared = draw(st.sampled_from([600.0, 3600.0, 7200.0]))
        job = PendingJob(
            f"j{i}",
            draw(st.sampled_from([q.name for q in queues])),
            "a100",
            draw(st.sampled_from([1, 1, 2, 2, 4, 8])),
            draw(st.sampled_from(["low", "normal", "high", "guarded", "pinned"])),
            float(draw(st.integers(0, 2000))),
            declared,
            i,
            None,
        )
        jobs.append(job)
        runtimes[job.job_id] = declared / draw(st.sampled_from([1.0, 2.0]))
    return World(nodes, queues, jobs, runtimes)


@st.composite
def general_worlds(draw: st.DrawFn) -> World:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        flavor = draw(st.sampled_from(FLAVORS))
        size = draw(st.sampled_from([1, 2, 4, 8]))
        nodes.append(Node(f"n{i}", flavor, size, f"t{draw(st.integers(0, 2))}", {}))
    queues = []
    for i in range(draw(st.integers(1, 4))):
        cohort = draw(st.sampled_from([None, "c1", "c1", "c2"]))
        nominal = {f: draw(st.integers(0, 12)) for f in FLAVORS}
        borrow = {f: draw(st.integers(0, 8)) for f in FLAVORS if draw(st.booleans())}
        lend = {f: draw(st.integers(0, 8)) for f in FLAVORS if draw(st.booleans())}
        weight = draw(st.sampled_from([0.5, 1.0, 2.0]))
        queues.append(Queue(f"q{i}", f"team{i % 3}", cohort, nominal, borrow, lend, weight))
    jobs = []
    runtimes = {}
    for i in range(draw(st.integers(0, 25))):
        gpus = draw(st.sampled_from([0, 1, 1, 2, 3, 4, 8, 12, 16]))
        per_node = draw(st.sampled_from([None, None, None, 1, 2, 4]))
        declared = draw(st.sampled_from([60.0, 600.0, 3600.0]))
        job = PendingJob(
            f"j{i}",
            draw(st.sampled_from([q.name for q in queues] + ["ghost"])),
            draw(st.sampled_from(FLAVORS)),
            gpus,
            draw(st.sampled_from([c.name for c in CLASSES] + ["unknown"])),
            float(draw(st.integers(0, 2000))),
            declared,
            i,
            per_node,
        )
        jobs.append(job)
        runtimes[job.job_id] = declared / draw(st.sampled_from([1.0, 2.0, 5.0]))
    return World(nodes, queues, jobs, runtimes)


REACHED: Counter[str] = Counter()


EXAMPLE: set[str] = set()
"""The interesting cases the current example reached (for ``target``)."""


def _reached(what: str) -> None:
    REACHED[what] += 1
    EXAMPLE.add(what)
    event(what)


def check_pass(snapshot: Snapshot, decisions: Decisions, config: PolicyConfig) -> None:
    nodes = {n.node_id: n for n in snapshot.nodes}
    pending = {j.job_id: j for j in snapshot.pending}
    taken = {(n.node_id, i) for n in snapshot.nodes for i in n.used}
    placed = set()
    quota = Reference(list(snapshot.queues))
    for r in snapshot.running:
        quota.used[(r.queue, r.flavor)] += r.gpus
    for p in decisions.placements:
        job = pending[p.job_id]
        placed.add(p.job_id)
        # Each placement fits the quota as it stands when it is made (the placements
        # before it in this pass included), and borrows exactly when it goes beyond the
        # nominal quota.
        verdict = quota.check(job.queue, job.flavor, job.gpus)
        assert verdict.kind == "ok", f"{p.job_id} placed over its quota: {verdict}"
        assert p.borrowed == verdict.borrowing, f"{p.job_id} borrowed={p.borrowed}: {verdict}"
        quota.used[(job.queue, job.flavor)] += job.gpus
        cohort = quota.queues[job.queue].cohort
        if p.borrowed:
            _reached("a placement borrowed quota")
        if cohort is not None and job.gpus:
            uses = {q: quota.used[(q, job.flavor)] for q in quota.queues}
            if quota.pool_used(cohort, job.flavor, uses) == quota.pool_size(cohort, job.flavor):
                _reached("a placement filled its cohort's pool exactly")
        counts = {len(ix) for ix in p.gpus.values()}
        assert len(counts) == 1, "a gang has equal GPUs on every node"
        assert sum(len(ix) for ix in p.gpus.values()) == job.gpus, "all of a gang or none"
        if job.gpus_per_node is not None:
            assert counts == {job.gpus_per_node}
        for node_id, indices in p.gpus.items():
            node = nodes[node_id]
            assert node.flavor == job.flavor
            for i in indices:
                assert 0 <= i < node.gpu_count, "a GPU that exists"
                assert (node_id, i) not in taken, "no GPU given twice"
                taken.add((node_id, i))
    assert len(taken) <= sum(n.gpu_count for n in snapshot.nodes)
    assert set(decisions.explanations) == set(pending) - placed, "every waiting job explained"
    positions: dict[str, list[int]] = {}
    for job_id, e in decisions.explanations.items():
        assert e.reason and e.blocking
        positions.setdefault(pending[job_id].queue, []).append(e.position)
    for found in positions.values():
        assert sorted(found) == list(range(1, len(found) + 1))
    running = {r.job_id: r for r in snapshot.running}
    classes = {c.name: c for c in snapshot.priority_classes}
    victims = [pre.job_id for pre in decisions.preemptions]
    assert len(victims) == len(set(victims)), "a job was chosen as a victim twice in one pass"
    for pre in decisions.preemptions:
        victim = running[pre.job_id]
        cls = classes.get(victim.priority)
        assert cls is None or cls.preemptible
        # Anti-thrash, computed here independently of the policy's own function: the class
        # minimum or the doubling floor, whichever is longer, and a bounded count.
        assert victim.preemptions < config.max_preemptions, "preempted once too often"
        protection = max(
            cls.min_runtime_s if cls is not None else 0.0,
            config.min_runtime_s * 2**victim.preemptions,
        )
        assert snapshot.now - victim.started_at >= protection, "preempted while protected"
        if victim.preemptions and config.max_preemptions < NO_THRASH_RULES["max_preemptions"]:
            _reached("a job preempted again")
        assert victim.notice_at is None
        assert pre.for_job_id in decisions.explanations
        blocked = pending[pre.for_job_id]
        assert victim.flavor == blocked.flavor
        if pre.kind == "priority":
            _reached("a priority preemption")
            mine = classes.get(blocked.priority, DEFAULT_PRIORITY)
            theirs = cls or DEFAULT_PRIORITY
            assert victim.queue == blocked.queue, "priority preemption stays in the queue"
            assert theirs.value < mine.value, "only a higher priority preempts"
        else:
            _reached("a reclaim")
            cohort = quota.queues[blocked.queue].cohort
            assert cohort is not None and quota.queues[victim.queue].cohort == cohort
            assert victim.queue != blocked.queue
            # A victim larger than what its queue borrows (at most its use at the end of the
            # pass over its nominal: use only grows in a pass) is spared a while.
            nominal = quota.queues[victim.queue].nominal.get(victim.flavor, 0)
            borrowed = quota.used[(victim.queue, victim.flavor)] - nominal
            if victim.gpus > borrowed:
                _reached("a reclaim of a job larger than what its queue borrows")
                spared = snapshot.now - victim.started_at >= config.oversize_protection_s
                assert spared, "reclaimed a job larger than its queue borrows while spared"


def shuffled(snapshot: Snapshot, rng: random.Random) -> Snapshot:
    def mix(items: tuple[T, ...]) -> tuple[T, ...]:
        return tuple(rng.sample(items, len(items)))

    return replace(
        snapshot,
        nodes=mix(snapshot.nodes),
        queues=mix(snapshot.queues),
        priority_classes=mix(snapshot.priority_classes),
        pending=mix(snapshot.pending),
        running=mix(snapshot.running),
    )


def run_stream(world: World, config: PolicyConfig, seed: int, passes: int = 6) -> int:
    """``passes`` passes 400 s apart over ``world``'s arrivals: jobs end at their true
    runtime or leave after a notice (and requeue), and every pass is checked
    (``check_pass``). Returns how many preemptions hit a job preempted before."""
    again = 0
    rng = random.Random(seed)
    preempted: dict[str, int] = {}
    running: dict[str, RunningJob] = {}
    waiting: dict[str, PendingJob] = {}
    usage: dict[str, float] = {}
    team = {q.name: q.team for q in world.queues}
    arrivals = sorted(world.jobs, key=lambda j: j.submitted_at)
    now = 0.0
    EXAMPLE.clear()
    for _ in range(passes):
        now += 400.0
        # Jobs end (true runtime) or leave after a notice; preempted ones requeue.
        for r in list(running.values()):
            if r.notice_at is not None and now >= r.notice_at + config.grace_s:
                del running[r.job_id]
                waiting[r.job_id] = next(j for j in world.jobs if j.job_id == r.job_id)
            elif now >= r.started_at + world.true_runtime[r.job_id]:
                del running[r.job_id]
            else:
                key = team.get(r.queue, r.queue)
                usage[key] = usage.get(key, 0.0) + 400.0 * r.gpus
        while arrivals and arrivals[0].submitted_at <= now:
            job = arrivals.pop(0)
            waiting[job.job_id] = job
        used: dict[str, dict[int, str]] = {n.node_id: {} for n in world.nodes}
        for r in running.values():
            for node_id, ix in r.placement.items():
                for i in ix:
                    used[node_id][i] = r.job_id
        snapshot = Snapshot(
            now,
            tuple(replace(n, used=used[n.node_id]) for n in world.nodes),
            tuple(world.queues),
            CLASSES,
            tuple(waiting.values()),
            tuple(running.values()),
            dict(usage),
        )
        decisions = schedule(snapshot, config)
        check_pass(snapshot, decisions, config)
        for what, happened in (
            ("a pass placed jobs", decisions.placements),
            ("a pass preempted", decisions.preemptions),
            (
                "a pass placed a multi-node gang",
                [p for p in decisions.placements if len(p.gpus) > 1],
            ),
            ("a pass borrowed quota", [p for p in decisions.placements if p.borrowed]),
        ):
            if happened:
                _reached(what)
        assert schedule(shuffled(snapshot, rng), config) == decisions, "deterministic"
        for p in decisions.placements:
            job = waiting.pop(p.job_id)
            running[job.job_id] = RunningJob(
                job.job_id,
                job.queue,
                job.flavor,
                job.gpus,
                job.priority,
                now,
                job.declared_runtime_s,
                dict(p.gpus),
                None,
                p.borrowed,
                preemptions=preempted.get(job.job_id, 0),
            )
        for pre in decisions.preemptions:
            running[pre.job_id] = replace(running[pre.job_id], notice_at=now)
            again += pre.job_id in preempted
            preempted[pre.job_id] = preempted.get(pre.job_id, 0) + 1
            assert preempted[pre.job_id] <= config.max_preemptions, "no job preempted too often"
    return again


STREAM_SETTINGS = settings(
    max_examples=600,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NO_THRASH_RULES = {"min_runtime_s": 0.0, "max_preemptions": 10**6, "oversize_protection_s": 0.0}
"""The anti-thrash rules off, so preemption happens as often as the cases need."""


@STREAM_SETTINGS
@given(world=worlds(), backfill=st.booleans(), seed=st.integers(0, 1000))
def _passes_keep_every_invariant(world: World, backfill: bool, seed: int) -> None:
    base = PolicyConfig(backfill=backfill, grace_s=120.0, ageing_s=600.0, half_life_s=3600.0)
    run_stream(world, replace(base, **NO_THRASH_RULES), seed)
    # Steer towards examples that reach many of the interesting cases at once.
    target(float(len(EXAMPLE)), label="interesting cases reached")


@STREAM_SETTINGS
@given(
    world=contended_worlds(),
    min_runtime_s=st.sampled_from([50.0, 150.0, 300.0]),
    max_preemptions=st.integers(1, 3),
    oversize_protection_s=st.sampled_from([0.0, 200.0, 600.0]),
    seed=st.integers(0, 1000),
)
def _passes_keep_the_anti_thrash_rules(
    world: World,
    min_runtime_s: float,
    max_preemptions: int,
    oversize_protection_s: float,
    seed: int,
) -> None:
    config = PolicyConfig(
        grace_s=120.0,
        ageing_s=600.0,
        half_life_s=3600.0,
        min_runtime_s=min_runtime_s,
        max_preemptions=max_preemptions,
        oversize_protection_s=oversize_protection_s,
    )
    # Ten passes: long enough for a job to meet its bound (placed, preempted, requeued...);
    # steered towards streams where the same jobs are preempted again and again.
    again = run_stream(world, config, seed, passes=10)
    target(float(again), label="preemptions of preempted jobs")


def test_the_anti_thrash_rules_hold_over_a_job_stream() -> None:
    """No victim is protected (its class minimum or the doubling floor) or was preempted
    ``max_preemptions`` times already; no job is preempted more often over the stream."""
    REACHED.clear()
    _passes_keep_the_anti_thrash_rules()
    for what, at_least in (
        ("a pass preempted", 100),
        ("a job preempted again", 30),
        # Low: the examples depend on which modules the run imported (Hypothesis draws
        # constants from them); seen 6 to 61 times, and under 2 once in a whole-suite run.
        ("a reclaim of a job larger than what its queue borrows", 1),
    ):
        assert REACHED[what] >= at_least, f"{what!r} reached {REACHED[what]} times: {REACHED}"


def test_passes_over_a_job_stream_keep_every_invariant() -> None:
    REACHED.clear()
    _passes_keep_every_invariant()
    # The floors are far below what a run reaches (derandomized, a run's examples still
    # differ a little with what else the process imported; the fewest seen: 58 priority
    # preemptions, 14 multi-node gangs; 319 reclaims in the one run counted since the
    # oversize spare, off here with the other rules).
    for what, at_least in (
        ("a pass placed jobs", 300),
        ("a pass preempted", 100),
        ("a priority preemption", 20),
        ("a reclaim", 20),
        ("a pass borrowed quota", 100),
        ("a placement filled its cohort's pool exactly", 100),
        ("a pass placed a multi-node gang", 5),
    ):
        assert REACHED[what] >= at_least, f"{what!r} reached {REACHED[what]} times: {REACHED}"
