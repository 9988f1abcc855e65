"""first_fit: placement, gang all-or-nothing, reasons, positions, determinism."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.scheduler.policy import (
    NodeState,
    Placement,
    QueuedJob,
    Snapshot,
    Waiting,
    first_fit,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def job(
    job_id: str, gpus: int = 1, flavor: str = "cpu", minute: int = 0, seq: int = 0
) -> QueuedJob:
    return QueuedJob(job_id, "team-a", flavor, gpus, T0 + timedelta(minutes=minute), seq)


def node(node_id: str, count: int = 2, flavor: str = "cpu", **used: int) -> NodeState:
    # used: job id -> how many GPUs it holds, lowest indices first
    taken: dict[int, str] = {}
    for job_id, n in used.items():
        for _ in range(n):
            taken[len(taken)] = job_id
    return NodeState(node_id, flavor, count, taken)


def test_job_goes_to_first_node_with_room() -> None:
    snapshot = Snapshot(
        nodes=(node("n1", 2, j0=2), node("n2", 4, j1=1), node("n3", 8)),
        queue=(job("a", gpus=2),),
    )
    decisions = first_fit(snapshot)
    assert decisions.placements == (Placement("a", "n2", (1, 2)),)
    assert decisions.waiting == ()


def test_gang_is_all_or_nothing() -> None:
    # 2 + 2 free GPUs on two nodes are not 4 on one node.
    snapshot = Snapshot(nodes=(node("n1", 4, x=2), node("n2", 4, y=2)), queue=(job("a", gpus=4),))
    decisions = first_fit(snapshot)
    assert decisions.placements == ()
    assert decisions.waiting == (
        Waiting("a", "needs 4 cpu GPUs; the largest free block is 2 on n1 (2 in use by job x)", 1),
    )


def test_gpus_placed_earlier_in_the_pass_are_in_use() -> None:
    snapshot = Snapshot(
        nodes=(node("n1", 2),), queue=(job("a", 2, minute=0), job("b", 1, minute=1))
    )
    decisions = first_fit(snapshot)
    assert decisions.placements == (Placement("a", "n1", (0, 1)),)
    assert decisions.waiting == (
        Waiting("b", "needs 1 cpu GPUs; the largest free block is 0 on n1 (2 in use by job a)", 1),
    )


def test_flavor_mismatch_reason() -> None:
    snapshot = Snapshot(nodes=(node("n1", 8, "cpu"),), queue=(job("a", 1, "a100"),))
    decisions = first_fit(snapshot)
    assert decisions.placements == ()
    assert decisions.waiting == (Waiting("a", "no ready node has a100 GPUs", 1),)


def test_job_bigger_than_any_node_says_so() -> None:
    snapshot = Snapshot(
        nodes=(node("n1", 2, "h100"), node("n2", 4, "h100")), queue=(job("a", 8, "h100"),)
    )
    (waiting,) = first_fit(snapshot).waiting
    assert waiting.reason == (
        "needs 8 h100 GPUs on one node; the largest ready h100 node (n2) has 4"
    )


def test_reason_names_every_holder_of_the_best_node() -> None:
    snapshot = Snapshot(nodes=(node("n1", 4, p=1, q=2),), queue=(job("a", 2),))
    (waiting,) = first_fit(snapshot).waiting
    assert waiting.reason.endswith("largest free block is 1 on n1 (3 in use by jobs p, q)")


def test_reason_ignores_free_nodes_too_small_for_the_job() -> None:
    snapshot = Snapshot(nodes=(node("big", 8, z=7), node("small", 2)), queue=(job("a", 4),))
    (waiting,) = first_fit(snapshot).waiting
    assert (
        waiting.reason == "needs 4 cpu GPUs; the largest free block is 1 on big (7 in use by job z)"
    )


def test_positions_count_waiting_jobs_per_flavor_in_queue_order() -> None:
    snapshot = Snapshot(
        nodes=(node("n1", 1),),
        queue=(
            job("c1", 1, "cpu", minute=0),
            job("h1", 1, "h100", minute=1),
            job("c2", 1, "cpu", minute=2),
            job("c3", 1, "cpu", minute=3),
            job("h2", 1, "h100", minute=4),
        ),
    )
    decisions = first_fit(snapshot)
    assert decisions.placements == (Placement("c1", "n1", (0,)),)
    assert [(w.job_id, w.position) for w in decisions.waiting] == [
        ("h1", 1),
        ("c2", 1),
        ("c3", 2),
        ("h2", 2),
    ]


def test_small_job_behind_a_big_one_still_fits() -> None:
    snapshot = Snapshot(
        nodes=(node("n1", 2),), queue=(job("big", 4, minute=0), job("small", 1, minute=1))
    )
    decisions = first_fit(snapshot)
    assert decisions.placements == (Placement("small", "n1", (0,)),)
    assert [w.job_id for w in decisions.waiting] == ["big"]


def test_queue_order_is_submit_time_then_sequence() -> None:
    snapshot = Snapshot(
        nodes=(node("n1", 1),),
        queue=(
            job("late", minute=5, seq=1),
            job("second", minute=0, seq=3),
            job("first", minute=0, seq=2),
        ),
    )
    decisions = first_fit(snapshot)
    assert decisions.placements[0].job_id == "first"
    assert [w.job_id for w in decisions.waiting] == ["second", "late"]


def test_zero_gpu_job_never_placed() -> None:
    (waiting,) = first_fit(Snapshot(nodes=(node("n1", 2),), queue=(job("a", 0),))).waiting
    assert "at least 1" in waiting.reason


def test_no_nodes_no_jobs() -> None:
    assert first_fit(Snapshot((), ())).placements == ()


def test_result_does_not_depend_on_input_order() -> None:
    nodes = [node(f"n{i}", 4, j=i % 3) for i in range(6)]
    queue = [job(f"j{i}", gpus=1 + i % 4, minute=i % 5, seq=i) for i in range(20)]
    expected = first_fit(Snapshot(tuple(nodes), tuple(queue)))
    rng = random.Random(7)
    for _ in range(10):
        rng.shuffle(nodes)
        rng.shuffle(queue)
        assert first_fit(Snapshot(tuple(nodes), tuple(queue))) == expected


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 8), min_size=0, max_size=5),
    wants=st.lists(st.integers(1, 9), min_size=0, max_size=12),
)
def test_never_double_books_and_every_job_is_decided_once(
    counts: list[int], wants: list[int]
) -> None:
    nodes = tuple(node(f"n{i}", c) for i, c in enumerate(counts))
    queue = tuple(job(f"j{i}", w, minute=i) for i, w in enumerate(wants))
    decisions = first_fit(Snapshot(nodes, queue))
    decided = [p.job_id for p in decisions.placements] + [w.job_id for w in decisions.waiting]
    assert sorted(decided) == sorted(j.job_id for j in queue)
    booked: set[tuple[str, int]] = set()
    sizes = {n.node_id: n.gpu_count for n in nodes}
    for p in decisions.placements:
        assert len(p.gpu_indices) == wants[int(p.job_id[1:])]  # gang: all GPUs
        for index in p.gpu_indices:
            assert 0 <= index < sizes[p.node_id]
            assert (p.node_id, index) not in booked
            booked.add((p.node_id, index))
