"""The preemption module's own rules, one at a time (found by mutation testing,
``bench/mutation.py``): the victim order, how ``select`` counts the GPUs victims free for a
gang shape (growing and trimming its choice), the cap on what reclaim may take from a queue,
and the notice a victim is told."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from trainyard_platform.services.scheduler.policy.model import (
    PolicyConfig,
    PriorityClass,
    RunningJob,
)
from trainyard_platform.services.scheduler.policy.packing import FlavorPool, NodeSlot, Shape
from trainyard_platform.services.scheduler.policy.preemption import (
    Candidate,
    candidates_for,
    eligible,
    notice,
    protected_until,
    select,
    victim_key,
    work_lost_s,
)
from trainyard_platform.services.scheduler.policy.quota import QuotaBook

from .builders import HOUR, NOW, pending, queue, running

# --- victim order ------------------------------------------------------------------------


def test_victim_key_in_full() -> None:
    job = running("v", "b", {"n1": 2}, started=NOW - 3 * 3600, checkpoint=NOW - 90)
    started = -(NOW - 3 * 3600)
    assert victim_key(job, 5, NOW) == (1, 0, 90.0, 180.0, 5, started, "v")
    assert victim_key(job, 5, NOW, leaving=True) == (0, 0, 90.0, 180.0, 5, started, "v")
    assert victim_key(job, 5, NOW, oversize=True) == (1, 1, 90.0, 180.0, 5, started, "v")


def test_work_lost_counts_seconds_since_the_checkpoint_or_the_start() -> None:
    def lost(since_start: float, since_checkpoint: float | None = None) -> float:
        checkpoint = None if since_checkpoint is None else NOW - since_checkpoint
        job = running("v", "b", {"n1": 1}, started=NOW - since_start, checkpoint=checkpoint)
        assert victim_key(job, 0, NOW)[2:4] == (work_lost_s(job, NOW), work_lost_s(job, NOW))
        return work_lost_s(job, NOW)

    assert [lost(s) for s in (0, 59.5, 60, 3600)] == [0, 59.5, 60, 3600]
    assert lost(3600, since_checkpoint=59) == 59
    # A checkpoint older than this allocation (an earlier attempt's) counts from the start.
    assert lost(120, since_checkpoint=7200) == 120
    # A clock that went backwards loses nothing.
    assert lost(-30) == 0


def test_leaving_jobs_go_first_then_jobs_within_what_their_queue_borrows() -> None:
    def key(job_id: str, **kw: bool) -> tuple[int, int, float, float, int, float, str]:
        return victim_key(running(job_id, "b", {"n1": 1}, started=NOW - 60), 0, NOW, **kw)

    ordered = sorted(
        [key("plain"), key("big", oversize=True), key("leaving", leaving=True)],
    )
    assert [k[-1] for k in ordered] == ["leaving", "plain", "big"]


def test_eligible_needs_a_preemptible_class_its_protection_over_and_no_notice() -> None:
    guarded = PriorityClass("guarded", 5, preemptible=True, min_runtime_s=1800.0)
    pinned = PriorityClass("pinned", 0, preemptible=False)
    config = PolicyConfig(min_runtime_s=300.0, max_preemptions=3)
    job = running("v", "b", {"n1": 1}, started=NOW - 1800)
    assert eligible(job, guarded, config, NOW)
    assert not eligible(job, guarded, config, NOW - 1)
    assert not eligible(job, pinned, config, NOW)
    noticed = running("v", "b", {"n1": 1}, started=NOW - 1800, notice=NOW - 5)
    assert not eligible(noticed, guarded, config, NOW)


def test_protection_is_the_longer_of_the_class_minimum_and_the_doubling_floor() -> None:
    config = PolicyConfig(min_runtime_s=300.0, max_preemptions=3)
    plain = PriorityClass("plain", 0)
    guarded = PriorityClass("guarded", 0, min_runtime_s=1000.0)
    started = NOW - HOUR

    def until(cls: PriorityClass, times: int) -> float:
        job = replace(running("v", "b", {"n1": 1}, started=started), preemptions=times)
        return protected_until(job, cls, config) - started

    assert [until(plain, k) for k in range(3)] == [300.0, 600.0, 1200.0]
    assert [until(guarded, k) for k in range(3)] == [1000.0, 1000.0, 1200.0]
    assert until(plain, 3) == math.inf and until(plain, 7) == math.inf
    assert until(PriorityClass("pinned", 0, preemptible=False), 0) == math.inf
    off = PolicyConfig(min_runtime_s=0.0, max_preemptions=3)
    assert protected_until(running("v", "b", {"n1": 1}, started=started), plain, off) == started


# --- select: counting what victims free ----------------------------------------------------


def _pool(**free: tuple[int, int]) -> FlavorPool:
    """node id -> (capacity, free GPUs); the busy GPUs are the lowest indices."""
    nodes = []
    for node_id, (capacity, n_free) in free.items():
        used = {i: "busy" for i in range(capacity - n_free)}
        nodes.append(NodeSlot(node_id, "r1", capacity, used))
    return FlavorPool("a100", nodes)


def _victim(job_id: str, placement: Mapping[str, int], rank: int, kind: str = "priority"):  # type: ignore[no-untyped-def]
    job = running(job_id, "b", placement)
    # A key of ``victim_key``'s shape that orders victims by ``rank`` alone.
    return Candidate(job, kind, (1, 0, float(rank), 0.0, 0, 0.0, job_id))  # type: ignore[arg-type]


def _chosen(found: list[Candidate] | None) -> list[str] | None:
    return None if found is None else sorted(c.job.job_id for c in found)


def _select(
    candidates: list[Candidate],
    pool: FlavorPool,
    shapes: tuple[Shape, ...],
    quota_ok=lambda freed: True,  # type: ignore[no-untyped-def]
    reclaimable: Mapping[str, int] | None = None,
) -> list[str] | None:
    return _chosen(select(candidates, pool, shapes, quota_ok, reclaimable or {}))


def test_a_whole_free_node_counts_for_a_whole_node_shape() -> None:
    # n1 is free already; only the quota needs victims: one 2-GPU job does.
    pool = _pool(n1=(8, 8), n2=(8, 0))
    victims = [_victim("v1", {"n2": 2}, 1), _victim("v2", {"n2": 2}, 2)]
    assert _select(victims, pool, ((1, 8),), lambda freed: freed.get("b", 0) >= 2) == ["v1"]


def test_a_shape_wider_than_any_node_never_fits() -> None:
    pool = _pool(n1=(8, 8))
    assert _select([_victim("v1", {"n1": 1}, 1)], pool, ((1, 16),)) is None


def test_a_victim_on_a_node_that_left_the_pool_still_frees_its_other_nodes() -> None:
    pool = _pool(n1=(4, 2))
    victim = _victim("v1", {"gone": 2, "n1": 2}, 1)
    assert list(victim.job.placement) == ["gone", "n1"]
    assert _select([victim], pool, ((1, 4),)) == ["v1"]


def test_a_node_that_had_enough_already_is_not_counted_twice() -> None:
    # Two nodes of 4 free GPUs are needed; a already has them, b has 2.
    pool = _pool(a=(8, 4), b=(8, 2))
    victims = [_victim("on-a", {"a": 2}, 1), _victim("on-b", {"b": 2}, 2)]
    assert _select(victims, pool, ((2, 4),)) == ["on-b"]


def test_every_node_reaching_the_shape_counts() -> None:
    # Three nodes of 4 free GPUs are needed; a has them, b and c get there with victims.
    pool = _pool(a=(8, 4), b=(8, 2), c=(8, 2))
    victims = [_victim("on-b", {"b": 2}, 1), _victim("on-c", {"c": 2}, 2)]
    assert _select(victims, pool, ((3, 4),)) == ["on-b", "on-c"]


def test_trimming_drops_victims_not_needed_and_keeps_those_that_are() -> None:
    # x: 2 free, y: 3 free, one node of 4 needed. Growing takes x1 (x -> 3, not enough)
    # then y1 (y -> 4: fits). Trimming keeps y1 (without it nothing fits) and drops x1.
    pool = _pool(x=(8, 2), y=(8, 3))
    victims = [_victim("x1", {"x": 1}, 1), _victim("y1", {"y": 1}, 2)]
    assert _select(victims, pool, ((1, 4),)) == ["y1"]


def test_trimming_a_victim_that_leaves_a_node_at_exactly_the_shape_drops_it() -> None:
    # x: 2 free, one node of 4 needed. Growing takes x1 (x -> 3) then x2 (x -> 5: fits).
    # Trimming keeps x2 (without it x has 3); without x1, x has exactly 4: still fits, so
    # x1 goes.
    pool = _pool(x=(8, 2))
    victims = [_victim("x1", {"x": 1}, 1), _victim("x2", {"x": 2}, 2)]
    assert _select(victims, pool, ((1, 4),)) == ["x2"]
    # When the quota wants 3 GPUs back, both stay.
    assert _select(victims, pool, ((1, 4),), lambda freed: freed.get("b", 0) >= 3) == [
        "x1",
        "x2",
    ]


def test_any_of_several_shapes_may_fit() -> None:
    pool = _pool(a=(8, 2), b=(4, 2))
    victims = [_victim("on-a", {"a": 6}, 1), _victim("on-b", {"b": 2}, 2)]
    # (1, 8) fits once a is free; (2, 4) would need both.
    assert _select(victims, pool, ((2, 4), (1, 8))) == ["on-a"]


# --- select: what reclaim may take ---------------------------------------------------------


def test_reclaim_takes_no_more_from_a_queue_than_it_borrows() -> None:
    pool = _pool(n1=(8, 0))
    jobs = [_victim(f"b{i}", {"n1": 2}, i, kind="reclaim") for i in (1, 2, 3)]

    def wants(gpus: int):  # type: ignore[no-untyped-def]
        return lambda freed: freed.get("b", 0) >= gpus

    # b borrows 2: one job of 2 may be taken, not a second.
    assert _select(jobs, pool, ((1, 2),), wants(2), {"b": 2}) == ["b1"]
    assert _select(jobs, pool, ((1, 2),), wants(4), {"b": 2}) is None
    # b borrows 3: a second job may be taken (2 < 3), a third not.
    assert _select(jobs, pool, ((1, 2),), wants(4), {"b": 3}) == ["b1", "b2"]
    assert _select(jobs, pool, ((1, 2),), wants(6), {"b": 3}) is None
    # b borrows 1: its job of 2 may still be taken (it is the only way to get 1 back).
    assert _select(jobs, pool, ((1, 2),), wants(2), {"b": 1}) == ["b1"]
    # A queue that borrows nothing gives nothing back.
    assert _select(jobs, pool, ((1, 2),), wants(2), {}) is None
    # Priority victims are not capped.
    priority = [_victim(f"p{i}", {"n1": 2}, i) for i in (1, 2)]
    assert _select(priority, pool, ((1, 2),), wants(4), {}) == ["p1", "p2"]


# --- candidates ----------------------------------------------------------------------------


def test_candidates_for_priority_and_reclaim() -> None:
    classes = {
        "low": PriorityClass("low", 0),
        "normal": PriorityClass("normal", 10),
        "high": PriorityClass("high", 20),
    }
    book = QuotaBook([queue("a", nominal=4, cohort="c"), queue("b", nominal=4, cohort="c")])
    runs: dict[tuple[str, str], list[RunningJob]] = {
        ("a", "a100"): [
            running("a-low", "a", {"n1": 1}, priority="low"),
            running("a-high", "a", {"n1": 1}, priority="high"),
        ],
        ("b", "a100"): [
            running("b-small", "b", {"n2": 2}, priority="high"),
            running("b-big", "b", {"n2": 4}, priority="low", started=NOW - 5 * HOUR),
        ],
    }
    book.add("a", "a100", 2)
    book.add("b", "a100", 6)  # b borrows 2
    leaving = [running("gone", "b", {"n2": 1}, notice=NOW - 5)]
    config = PolicyConfig(min_runtime_s=0.0)
    found, reclaimable = candidates_for(
        book, "a", "a100", 10, True, runs, leaving, classes.__getitem__, config, NOW
    )
    kinds = {c.job.job_id: c.kind for c in found}
    assert kinds == {"gone": None, "a-low": "priority", "b-small": "reclaim", "b-big": "reclaim"}
    assert reclaimable == {"b": 2}
    keys = {c.job.job_id: c.key for c in found}
    assert keys["gone"] == victim_key(leaving[0], 10, NOW, leaving=True)  # leaving first
    assert keys["a-low"] == victim_key(runs[("a", "a100")][0], 0, NOW)
    assert keys["b-small"][1] == 0 and keys["b-big"][1] == 1  # bigger than b borrows
    # A job bigger than what its queue borrows is spared in its first hours (4 by default).
    young = dict(runs)
    young[("b", "a100")] = [
        running("b-small", "b", {"n2": 2}, priority="high"),
        running("b-big", "b", {"n2": 4}, priority="low", started=NOW - 4 * HOUR + 1),
    ]
    found, _ = candidates_for(
        book, "a", "a100", 10, True, young, [], classes.__getitem__, config, NOW
    )
    assert {c.job.job_id for c in found if c.kind == "reclaim"} == {"b-small"}
    # Beyond its nominal quota the job reclaims nothing.
    found, reclaimable = candidates_for(
        book, "a", "a100", 10, False, runs, [], classes.__getitem__, config, NOW
    )
    assert {c.job.job_id for c in found} == {"a-low"} and reclaimable == {}


# --- the notice ----------------------------------------------------------------------------


def test_the_notice_names_the_job_the_rule_and_the_work_lost() -> None:
    high = PriorityClass("high", 20)
    normal = PriorityClass("normal", 10)
    job = pending("winner", "a", gpus=2, priority="high")
    loser = running("loser", "a", {"n1": 1}, started=NOW - HOUR)
    victim = Candidate(loser, "priority", (1, 0, 0.0, 0.0, 0, 0.0, "loser"))
    assert notice(job, high, victim, normal, NOW) == (
        "preempted for job winner: priority high outranks normal in queue a; "
        "it loses ~1.0 h of work on 1 GPU since it started"
    )
    saved = running("loser", "b", {"n1": 4}, started=NOW - HOUR, checkpoint=NOW - 720)
    borrower = Candidate(saved, "reclaim", (1, 0, 0.0, 0.0, 0, 0.0, "loser"))
    # Reclaim: the waiting job is another team's; its id is never shown to the victim's owner.
    assert notice(job, high, borrower, normal, NOW) == (
        "preempted to return borrowed quota for a job of queue a: queue b borrows a100 quota "
        "that a needs; it loses ~12 min of work on 4 GPUs since its last checkpoint"
    )


def test_protection_of_a_job_preempted_very_often_does_not_overflow() -> None:
    """With the bound set out of reach, a job preempted 5,000 times is protected for a very
    long (finite) time instead of the pass failing on a float overflow."""
    config = PolicyConfig(min_runtime_s=60.0, max_preemptions=10**6)
    job = replace(running("v", "b", {"n1": 1}, started=NOW - HOUR), preemptions=5000)
    until = protected_until(job, PriorityClass("plain", 0), config)
    assert math.isfinite(until) and until > NOW + 10**18
    assert not eligible(job, PriorityClass("plain", 0), config, NOW)
