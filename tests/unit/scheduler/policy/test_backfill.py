"""Backfill: later jobs may start ahead of a blocked one only without delaying it."""

from __future__ import annotations

import heapq
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.scheduler.policy import backfill, schedule
from trainyard_platform.services.scheduler.policy.backfill import FluidEstimate
from trainyard_platform.services.scheduler.policy.model import (
    Node,
    PendingJob,
    PolicyConfig,
    RunningJob,
)
from trainyard_platform.services.scheduler.policy.packing import FlavorPool, NodeSlot

from .builders import HOUR, NOW, node, pending, queue, running, snap

QUEUES = (queue("a", nominal=100), queue("b", nominal=100))
# These scenarios are about a blocked head and what may pass it: jobs are considered in
# submit order, without the policy's preference for smaller declared jobs.
FIFO = PolicyConfig(size_weight=0)


def blocked_head() -> tuple[tuple[Node, ...], tuple[RunningJob, ...], PendingJob]:
    """n1 busy for another hour, n2 half busy for 10 min; a 16-GPU head waits for both."""
    nodes = (node("n1"), node("n2"))
    run = (
        running("long", "b", {"n1": 8}, started=NOW - HOUR, runtime=2 * HOUR),
        running("short", "b", {"n2": 4}, started=NOW - 600, runtime=1200),
    )
    head = pending("head", "a", gpus=16, at=NOW - 900, seq=0)
    return nodes, run, head


def test_head_gets_a_reservation_and_an_estimated_start() -> None:
    nodes, run, head = blocked_head()
    d = schedule(snap(nodes, QUEUES, (head,), run), FIFO)
    e = d.explanations["head"]
    assert e.estimated_start == NOW + HOUR  # when "long" reaches its declared end
    assert "expected start in ~1.0 h" in e.reason


def test_short_job_backfills_without_delaying_the_head() -> None:
    nodes, run, head = blocked_head()
    short = pending("fits", "a", gpus=4, at=NOW - 60, seq=1, runtime=HOUR / 2)
    d = schedule(snap(nodes, QUEUES, (head, short), run), FIFO)
    assert [p.job_id for p in d.placements] == ["fits"]
    assert d.explanations["head"].estimated_start == NOW + HOUR


def test_long_job_must_not_delay_the_head() -> None:
    nodes, run, head = blocked_head()
    long = pending("too-long", "a", gpus=4, at=NOW - 60, seq=1, runtime=3 * HOUR)
    d = schedule(snap(nodes, QUEUES, (head, long), run), FIFO)
    assert d.placements == ()
    e = d.explanations["too-long"]
    assert e.reason.startswith("the free a100 GPUs it fits on are reserved for job head")
    assert "; expected start in ~" in e.reason
    assert e.blocking == "head"
    assert e.suggestion == "a declared max runtime under 1.0 h would let it start now"


def test_a_long_job_may_use_the_slack_of_a_reservation() -> None:
    # n1 has 16 GPUs: 12 busy for 10 more min, 4 free. The head needs 12 there at +10 min,
    # so 4 are spare even then: a long 4-GPU job may take them, a fifth GPU may not.
    nodes = (node("n1", 16),)
    run = (running("r", "b", {"n1": 12}, started=NOW - 600, runtime=1200),)
    head = pending("head", "a", gpus=12, at=NOW - 900, seq=0)
    spare = pending("spare", "a", gpus=4, at=NOW - 60, seq=1, runtime=10 * HOUR)
    d = schedule(snap(nodes, QUEUES, (head, spare), run), FIFO)
    assert [p.job_id for p in d.placements] == ["spare"]
    assert d.explanations["head"].estimated_start == NOW + 600


def test_a_long_job_on_the_reserved_node_is_refused() -> None:
    nodes = (node("n1"), node("n2"))
    run = (
        running("long", "b", {"n1": 8}, runtime=2 * HOUR),
        running("short", "b", {"n2": 4}, started=NOW - 600, runtime=1200),
    )
    head = pending("head", "a", gpus=8, at=NOW - 900, seq=0)
    other = pending("other", "a", gpus=4, at=NOW - 60, seq=1, runtime=10 * HOUR)
    d = schedule(snap(nodes, QUEUES, (head, other), run), FIFO)
    assert d.explanations["head"].estimated_start == NOW + 600  # on n2, when "short" ends
    assert d.placements == ()


def test_backfill_off_keeps_everyone_behind_the_blocked_head() -> None:
    nodes, run, head = blocked_head()
    short = pending("fits", "a", gpus=1, at=NOW - 60, seq=1, runtime=60)
    d = schedule(snap(nodes, QUEUES, (head, short), run), replace(FIFO, backfill=False))
    assert d.placements == ()
    assert d.explanations["fits"].reason.startswith("waits behind job head")


def test_reservations_are_limited_per_flavor() -> None:
    nodes, run, head = blocked_head()
    second = pending("second", "a", gpus=16, at=NOW - 800, seq=1)
    long = pending("long-small", "a", gpus=4, at=NOW - 60, seq=2, runtime=3 * HOUR)
    d = schedule(snap(nodes, QUEUES, (head, second, long), run), replace(FIFO, reservations=1))
    assert [p.job_id for p in d.placements] == []  # the head's reservation still protects it
    d = schedule(snap(nodes, QUEUES, (head, second, long), run), replace(FIFO, reservations=0))
    assert [p.job_id for p in d.placements] == ["long-small"]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 16),
    st.lists(st.tuples(st.integers(0, 20), st.integers(1, 8)), max_size=30),
    st.lists(st.tuples(st.integers(1, 24), st.integers(1, 20)), max_size=30),
)
def test_the_fluid_estimate_takes_releases_in_time_order(
    free: int, releases: list[tuple[int, int]], jobs: list[tuple[int, int]]
) -> None:
    """``FluidEstimate`` reads the releases known at the start and those of the jobs in line
    from two places; its estimates are those of one heap of them all (small integer times,
    so that many releases tie)."""
    known = [(NOW + 60.0 * at, gpus) for at, gpus in releases]
    estimate = FluidEstimate(free, known, NOW)
    heap, spare, clock = list(known), free, NOW
    heapq.heapify(heap)
    for gpus, runtime in jobs:
        while spare < gpus and heap:
            at, count = heapq.heappop(heap)
            spare, clock = spare + count, max(clock, at)
        expected = None
        if spare >= gpus:
            spare -= gpus
            heapq.heappush(heap, (clock + 60.0 * runtime, gpus))
            expected = clock
        assert estimate.next_start(gpus, 60.0 * runtime) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("r0", "r1", "r2")),
            st.integers(0, 8),
            st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), max_size=3),
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 9),
)
def test_a_one_node_reservation_takes_the_earliest_node_then_domain_then_id(
    specs: list[tuple[str, int, list[tuple[int, int]]]], per_node: int
) -> None:
    """A shape of one node is reserved on the node free soonest; among those free as soon,
    the first domain by name, then the first node id (what the per-domain candidates of a
    gang come to for one node): checked against ``earliest`` asked of every node."""
    slots = []
    for i, (rack, busy, releases) in enumerate(specs):
        slot = NodeSlot(f"n{i:02d}", rack, 8, {g: "x" for g in range(busy)})
        slot.releases = sorted((NOW + 600.0 * at, gpus) for at, gpus in releases)
        slots.append(slot)
    pool = FlavorPool("a100", slots)
    starts = [(backfill.earliest(n, per_node, NOW), n.topology, n.node_id) for n in slots]
    known = [s for s in starts if s[0] is not None]
    found = backfill.reserve(pool, "job", ((1, per_node),), 600.0, NOW)
    if not known:
        assert found is None
        return
    start, _, node_id = min(known)  # type: ignore[type-var]
    assert found is not None
    assert (found.start, found.nodes) == (start, (node_id,))
