"""Incremental decisions equal a full pass also around the first tier's idle-queue rule.

``QuotaBook.first_tier`` orders an idle queue's gang larger than its whole nominal quota with
the jobs within their quota, and ``Incremental.arrival_is_isolated`` relies on a job only
ever leaving the first tier during a pass. The streams here add to the property worlds of
``test_incremental`` one or two queues that hold nothing at first, with small nominal quotas
(0 in a flavor at times), in a cohort or not, and send them gangs larger than their nominal
quota (some aged past ``ageing_s``), jobs within it, late low-priority jobs, jobs ending
(some queues start with a job running, so their use drops to nothing), nodes joining and
leaving; some running jobs are under a preemption notice from the start. After every event,
``Incremental``'s decisions must equal a full pass over the test's own copy of the cluster.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.incremental import Incremental
from trainyard_platform.services.scheduler.policy.model import (
    Node,
    PendingJob,
    PolicyConfig,
    Queue,
)

from .builders import CLASSES
from .test_incremental import INCREMENTAL_SETTINGS, START, Model, late_jobs
from .test_properties import FLAVORS, World, worlds

REACHED: Counter[str] = Counter()
Event = tuple[str, object]


@st.composite
def idle_job(draw: st.DrawFn, queue: Queue, seq: int, over: bool) -> PendingJob:
    """A job of ``queue``: a gang larger than its nominal quota of the flavor (``over``), or
    one within it."""
    flavor = draw(st.sampled_from(FLAVORS))
    nominal = queue.nominal.get(flavor, 0)
    if over or nominal == 0:
        gpus = nominal + draw(st.sampled_from([1, 2, 4, 6, 8]))
    else:
        gpus = draw(st.integers(1, nominal))
    return PendingJob(
        f"g{seq}",
        queue.name,
        flavor,
        gpus,
        draw(st.sampled_from([c.name for c in CLASSES])),
        START - draw(st.sampled_from([0.0, 60.0, 1800.0, 5000.0])),
        draw(st.sampled_from([600.0, 3600.0, 12 * 3600.0])),
        20_000 + seq,
    )


@st.composite
def idle_runs(draw: st.DrawFn) -> tuple[World, PolicyConfig, list[Event], int]:
    world = draw(worlds())
    idle = [
        Queue(
            f"idle{k}",
            f"idle-team{k}",
            draw(st.sampled_from(["c1", "c1", "c2", None])),
            {f: draw(st.integers(0, 4)) for f in FLAVORS},
            {f: draw(st.integers(0, 8)) for f in FLAVORS} if draw(st.booleans()) else {},
            {},
            1.0,
        )
        for k in range(draw(st.integers(1, 2)))
    ]
    # Some idle queues start with a small job among the first jobs, which the first pass may
    # start: ending it later drops their use back to nothing.
    starters = [
        replace(draw(idle_job(q, 900 + k, over=False)), priority="high", job_id=f"start{k}")
        for k, q in enumerate(idle)
        if draw(st.booleans())
    ]
    world = replace(world, queues=[*world.queues, *idle], jobs=[*starters, *world.jobs])
    config = PolicyConfig(min_runtime_s=60.0, reservations=draw(st.sampled_from([0, 1, 2, 8])))
    events: list[Event] = []
    for i in range(draw(st.integers(2, 14))):
        kinds = ["over", "over", "within", "within", "late", "end", "end", "join"]
        kind = draw(st.sampled_from(kinds))
        if kind in ("over", "within"):
            queue = draw(st.sampled_from(idle))
            events.append(("arrive", draw(idle_job(queue, i, over=kind == "over"))))
        elif kind == "late":
            events.append(("arrive", draw(late_jobs(world, i))))
        elif kind == "join":
            size = draw(st.sampled_from([2, 4, 8]))
            events.append(("join", Node(f"new{i}", draw(st.sampled_from(FLAVORS)), size, "t9")))
        else:
            events.append((kind, draw(st.integers(0, 1 << 16))))
    return world, config, events, draw(st.integers(0, 3))


@settings(INCREMENTAL_SETTINGS, max_examples=150)
@given(idle_runs())
def idle_queue_runs(run: tuple[World, PolicyConfig, list[Event], int]) -> None:
    world, config, events, noticed = run
    model = Model(world, config)
    # Every ``noticed``-th running job (by id) is under a preemption notice from the start.
    if noticed:
        for job_id in sorted(model.running)[::noticed]:
            model.running[job_id] = replace(model.running[job_id], notice_at=START - 120.0)
    idle = {q.name: q for q in world.queues if q.name.startswith("idle")}
    inc = Incremental(model.snapshot(), config)
    for kind, what in events:
        if kind == "arrive":
            assert isinstance(what, PendingJob)
            if what.job_id in model.pending or what.job_id in model.running:
                continue
            queue = idle.get(what.queue)
            state = inc.state
            over = (
                queue is not None
                and state.quota.used(what.queue, what.flavor) == 0
                and what.gpus > queue.nominal.get(what.flavor, 0)
            )
            model.pending[what.job_id] = what
            before = inc.isolated
            decisions = inc.arrive(what)
            if over:
                REACHED["idle gang " + ("isolated" if inc.isolated > before else "passed")] += 1
        elif kind == "end":
            if not model.running:
                continue
            assert isinstance(what, int)
            job_id = sorted(model.running)[what % len(model.running)]
            if model.running[job_id].queue in idle:
                REACHED["an idle queue's job ended"] += 1
            model.end(job_id)
            decisions = inc.end(job_id)
        else:
            assert isinstance(what, Node)
            if what.node_id in model.nodes:
                continue
            model.nodes[what.node_id] = what
            decisions = inc.node_joined(what)
        assert decisions == schedule(model.snapshot(), config), f"after {kind} {what}"


def test_incremental_equals_a_full_pass_around_idle_queues_with_gangs_over_quota() -> None:
    REACHED.clear()
    idle_queue_runs()
    # The floors are far below what a run reaches (derandomized).
    for what, at_least in (
        ("idle gang isolated", 20),
        ("idle gang passed", 50),
        ("an idle queue's job ended", 5),
    ):
        assert REACHED[what] >= at_least, REACHED
