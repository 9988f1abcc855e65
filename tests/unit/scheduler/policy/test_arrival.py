"""The arrival fast path and determinism of the pass."""

from __future__ import annotations

import random

from trainyard_platform.services.scheduler.policy import PolicyState, decide_arrival, schedule
from trainyard_platform.services.scheduler.policy.model import Snapshot

from .builders import HOUR, NOW, node, pending, queue, running, snap

QUEUES = (queue("a", 100, cohort="c"), queue("b", 100, cohort="c"))


def test_arrival_starts_on_free_gpus_and_updates_the_state() -> None:
    state = PolicyState(snap((node("n1", 4),), QUEUES))
    state.run()
    first = decide_arrival(state, pending("x", "a", 3))
    assert [(p.job_id, p.gpus) for p in first.placements] == [("x", {"n1": (0, 1, 2)})]
    second = decide_arrival(state, pending("y", "a", 3, seq=1))
    assert second.placements == ()
    assert second.explanations["y"].reason.startswith("needs 3 a100 GPUs on one node")


def test_arrival_never_delays_a_reservation() -> None:
    nodes = (node("n1"), node("n2"))
    run = (running("long", "b", {"n1": 8}, runtime=2 * HOUR), running("half", "b", {"n2": 4}))
    state = PolicyState(snap(nodes, QUEUES, (pending("head", "a", 16),), run))
    state.run()
    late = decide_arrival(state, pending("late", "a", 4, runtime=20 * HOUR, seq=1))
    assert late.placements == ()
    assert late.explanations["late"].blocking == "head"
    quick = decide_arrival(state, pending("quick", "a", 4, runtime=60, seq=2))
    assert [p.job_id for p in quick.placements] == ["quick"]


def test_arrival_respects_quota() -> None:
    state = PolicyState(snap((node("n1"),), (queue("a", 2),)))
    state.run()
    d = decide_arrival(state, pending("x", "a", 4))
    assert d.placements == ()
    assert "can never hold more than 2" in d.explanations["x"].reason


def test_the_pass_does_not_depend_on_input_order() -> None:
    nodes = tuple(node(f"n{i}", 8, topology=f"r{i % 3}") for i in range(8))
    run = tuple(
        running(
            f"r{i}",
            "ab"[i % 2],
            {f"n{i}": 1 + i % 8},
            started=NOW - 100 * i,
            runtime=HOUR * (1 + i),
        )
        for i in range(6)
    )
    jobs = tuple(
        pending(
            f"j{i}",
            "ab"[i % 2],
            [1, 2, 4, 8, 16, 3][i % 6],
            at=NOW - i * 37,
            seq=i,
            priority=["low", "normal", "high"][i % 3],
        )
        for i in range(40)
    )
    base = snap(nodes, QUEUES, jobs, run, usage={"team-a": 1e6})
    expected = schedule(base)
    rng = random.Random(3)
    for _ in range(5):
        shuffled = Snapshot(
            base.now,
            tuple(rng.sample(base.nodes, len(base.nodes))),
            tuple(rng.sample(base.queues, len(base.queues))),
            tuple(rng.sample(base.priority_classes, len(base.priority_classes))),
            tuple(rng.sample(base.pending, len(base.pending))),
            tuple(rng.sample(base.running, len(base.running))),
            base.usage,
        )
        assert schedule(shuffled) == expected
