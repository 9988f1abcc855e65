"""Gang placement, best fit that keeps whole nodes free, topology preference."""

from __future__ import annotations

import pytest

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.packing import job_shapes

from .builders import node, pending, queue, running, snap

BIG = (queue("a", nominal=1000),)


@pytest.mark.parametrize(
    ("gpus", "per_node", "capacity", "shapes"),
    [
        (4, None, 8, ((1, 4),)),
        (8, None, 8, ((1, 8),)),
        (16, None, 8, ((2, 8), (4, 4))),
        (12, None, 8, ((2, 6), (3, 4), (4, 3))),
        (64, None, 8, ((8, 8), (16, 4))),
        (7, None, 4, ()),
        (8, 2, 8, ((4, 2),)),
        (8, 3, 8, ()),
        (8, 16, 8, ()),
        (0, None, 8, ()),
    ],
)
def test_job_shapes(
    gpus: int, per_node: int | None, capacity: int, shapes: tuple[tuple[int, int], ...]
) -> None:
    assert job_shapes(gpus, per_node, capacity) == shapes


def test_gang_spans_nodes_with_equal_parts() -> None:
    d = schedule(snap((node("n1"), node("n2"), node("n3")), BIG, (pending("g", gpus=16),)))
    (p,) = d.placements
    assert {k: len(v) for k, v in p.gpus.items()} == {"n1": 8, "n2": 8}


def test_gang_is_all_or_nothing() -> None:
    nodes = (node("n1"), node("n2"))
    run = (running("r", "a", {"n2": 3}),)
    d = schedule(snap(nodes, BIG, (pending("g", gpus=16),), run))
    assert d.placements == ()
    assert d.explanations["g"].reason.startswith(
        "needs 16 a100 GPUs as 2 nodes x 8; the largest free block is 8 on n1; "
        "the rest is held by r"
    )


def test_big_gang_falls_back_to_smaller_equal_parts() -> None:
    nodes = tuple(node(f"n{i}") for i in range(4))
    run = tuple(running(f"r{i}", "a", {f"n{i}": 4}) for i in range(4))
    d = schedule(snap(nodes, BIG, (pending("g", gpus=16),), run))
    (p,) = d.placements
    assert sorted(len(v) for v in p.gpus.values()) == [4, 4, 4, 4]


def test_explicit_gpus_per_node_is_honoured() -> None:
    d = schedule(snap((node("n1"), node("n2")), BIG, (pending("g", gpus=4, per_node=2),)))
    (p,) = d.placements
    assert {k: len(v) for k, v in p.gpus.items()} == {"n1": 2, "n2": 2}


def test_best_fit_keeps_a_whole_node_free() -> None:
    nodes = (node("n1"), node("n2"), node("n3"))
    run = (running("r2", "a", {"n2": 4}), running("r3", "a", {"n3": 6}))
    d = schedule(snap(nodes, BIG, (pending("small", gpus=2), pending("mid", gpus=4, seq=1)), run))
    placed = {p.job_id: set(p.gpus) for p in d.placements}
    assert placed == {"small": {"n3"}, "mid": {"n2"}}  # n1 stays whole


def test_partly_used_node_preferred_over_whole_one_of_equal_free_count() -> None:
    nodes = (node("a-whole", 4), node("b-part", 8))
    run = (running("r", "a", {"b-part": 4}),)
    d = schedule(snap(nodes, BIG, (pending("j", gpus=4),), run))
    assert set(d.placements[0].gpus) == {"b-part"}


def test_multi_node_gang_prefers_one_topology_domain() -> None:
    nodes = (
        node("n1", topology="rack-1"),
        node("n2", topology="rack-2"),
        node("n3", topology="rack-2"),
        node("n4", topology="rack-3"),
    )
    d = schedule(snap(nodes, BIG, (pending("g", gpus=16),)))
    assert set(d.placements[0].gpus) == {"n2", "n3"}


def test_gang_picks_tightest_domain_that_holds_it() -> None:
    nodes = (
        *(node(f"big{i}", topology="rack-big") for i in range(4)),
        *(node(f"small{i}", topology="rack-small") for i in range(2)),
    )
    d = schedule(snap(nodes, BIG, (pending("g", gpus=16),)))
    assert set(d.placements[0].gpus) == {"small0", "small1"}


def test_gang_spans_domains_when_none_holds_it() -> None:
    nodes = (node("n1", topology="r1"), node("n2", topology="r2"), node("n3", topology="r2"))
    d = schedule(snap(nodes, BIG, (pending("g", gpus=24),)))
    assert set(d.placements[0].gpus) == {"n1", "n2", "n3"}


def test_gpus_placed_earlier_in_the_pass_are_never_given_again() -> None:
    jobs = tuple(pending(f"j{i}", gpus=3, seq=i) for i in range(4))
    d = schedule(snap((node("n1"),), BIG, jobs))
    given = [(n, i) for p in d.placements for n, ix in p.gpus.items() for i in ix]
    assert len(given) == len(set(given)) == 6
