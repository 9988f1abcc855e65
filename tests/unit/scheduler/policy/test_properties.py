"""Property tests over random clusters and job streams (Hypothesis).

Each example builds a random cluster (flavors, node sizes, topology domains), queues (nominal
quotas, cohorts, borrowing and lending limits) and a stream of jobs, then runs several passes
on a moving clock, applying each pass's decisions (placements start, preempted jobs leave
after the grace period and requeue, jobs end at their true runtime). Every pass must:
never hand out a GPU twice or one that does not exist; place gangs whole with equal GPUs per
node; keep quotas and borrowing limits; explain every job it does not place; only preempt
eligible jobs; and give equal decisions for a shuffled copy of its snapshot.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TypeVar

from hypothesis import event, given, settings
from hypothesis import strategies as st

from services.scheduler.policy import schedule
from services.scheduler.policy.model import (
    Decisions,
    Node,
    PendingJob,
    PolicyConfig,
    Queue,
    RunningJob,
    Snapshot,
)
from services.scheduler.policy.quota import QuotaBook

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


def check_pass(snapshot: Snapshot, decisions: Decisions) -> None:
    nodes = {n.node_id: n for n in snapshot.nodes}
    pending = {j.job_id: j for j in snapshot.pending}
    taken = {(n.node_id, i) for n in snapshot.nodes for i in n.used}
    placed = set()
    book = QuotaBook(snapshot.queues)
    for r in snapshot.running:
        book.add(r.queue, r.flavor, r.gpus)
    before = {(q.name, f): book.used(q.name, f) for q in snapshot.queues for f in FLAVORS}
    for p in decisions.placements:
        job = pending[p.job_id]
        placed.add(p.job_id)
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
        book.add(job.queue, job.flavor, job.gpus)
    assert len(taken) <= sum(n.gpu_count for n in snapshot.nodes)
    for q in snapshot.queues:
        for f in FLAVORS:
            used = book.used(q.name, f)
            if used > before[(q.name, f)]:  # the pass added to it: it must be within limits
                assert used <= q.nominal.get(f, 0) + book.borrowing_limit(q.name, f)
                if q.cohort is not None:
                    size, pool_used = book.pool(q.cohort, f)
                    assert pool_used <= size, "the cohort lends no more than it has"
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
        assert cls is None or snapshot.now - victim.started_at >= cls.min_runtime_s
        assert victim.notice_at is None
        assert pre.for_job_id in decisions.explanations


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


@settings(max_examples=100, deadline=None)
@given(world=worlds(), backfill=st.booleans(), seed=st.integers(0, 1000))
def test_passes_over_a_job_stream_keep_every_invariant(
    world: World, backfill: bool, seed: int
) -> None:
    config = PolicyConfig(backfill=backfill, grace_s=120.0, ageing_s=600.0, half_life_s=3600.0)
    rng = random.Random(seed)
    running: dict[str, RunningJob] = {}
    waiting: dict[str, PendingJob] = {}
    usage: dict[str, float] = {}
    team = {q.name: q.team for q in world.queues}
    arrivals = sorted(world.jobs, key=lambda j: j.submitted_at)
    now = 0.0
    for _ in range(6):
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
        check_pass(snapshot, decisions)
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
                event(what)
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
            )
        for pre in decisions.preemptions:
            running[pre.job_id] = replace(running[pre.job_id], notice_at=now)
