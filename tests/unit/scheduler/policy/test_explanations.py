"""Explanations: every waiting job gets a position, a reason naming the holder, a suggestion
when a smaller or shorter request would start now, and an estimated start."""

from __future__ import annotations

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.explain import duration, names

from .builders import HOUR, NOW, node, pending, queue, running, snap


def test_capacity_reason_names_the_holders_another_teams_by_its_team_only() -> None:
    """A team reads its jobs' reasons: its own jobs by id, another team's by team alone."""
    nodes = (node("n1"),)
    queues = (queue("a", 16), queue("b", 16))
    run = (
        running("rb", "b", {"n1": 3}, started=NOW - HOUR, runtime=2 * HOUR),
        running("ra", "a", {"n1": 3}, started=NOW - HOUR, runtime=2 * HOUR),
    )
    d = schedule(snap(nodes, queues, (pending("j", "a", 4),), run))
    e = d.explanations["j"]
    assert e.reason == (
        "needs 4 a100 GPUs on one node; the largest free block is 2 on n1; the rest is held "
        "by ra and a team-b job; expected start in ~1.0 h"
    )
    assert e.blocking == "ra, team-b"
    assert "rb" not in e.reason + e.blocking
    assert e.suggestion == "asking for 2 GPUs would let it start now"
    assert e.estimated_start == NOW + HOUR


def test_positions_count_waiting_jobs_per_queue_in_order() -> None:
    nodes = (node("n1", 1),)
    queues = (queue("a", 8, cohort="c"), queue("b", 8, cohort="c"))
    jobs = (
        pending("a1", "a", 1, at=NOW - 50, seq=1),
        pending("a2", "a", 1, at=NOW - 40, seq=2),
        pending("b1", "b", 1, at=NOW - 30, seq=3),
        pending("a3", "a", 1, at=NOW - 20, seq=4),
    )
    d = schedule(snap(nodes, queues, jobs))
    assert [p.job_id for p in d.placements] == ["a1"]
    assert {k: e.position for k, e in d.explanations.items()} == {"a2": 1, "a3": 2, "b1": 1}


def test_every_waiting_job_has_a_reason_and_estimates_follow_queue_order() -> None:
    nodes = (node("n1", 4),)
    run = (running("r", "a", {"n1": 4}, started=NOW, runtime=HOUR),)
    jobs = tuple(pending(f"j{i}", "a", 4, at=NOW - 100 + i, seq=i, runtime=HOUR) for i in range(3))
    d = schedule(snap(nodes, (queue("a", 100),), jobs, run))
    starts = [d.explanations[f"j{i}"].estimated_start for i in range(3)]
    assert starts == [NOW + HOUR, NOW + 2 * HOUR, NOW + 3 * HOUR]


def test_requests_that_can_never_run_say_why_and_what_would() -> None:
    nodes = (node("n1", 8), node("n2", 8))
    queues = (queue("a", 8),)
    jobs = (
        pending("no-queue", "nope", 1),
        pending("zero", "a", 0),
        pending("no-flavor", "a", 1, flavor="h100"),
        pending("too-big", "a", 32),
        pending("odd", "a", 11),
        pending("over-quota", "a", 16),
    )
    e = schedule(snap(nodes, queues, jobs)).explanations
    assert e["no-queue"].reason == "queue nope does not exist; resubmit to an existing queue"
    assert e["zero"].reason == "asks for 0 GPUs; a job needs at least 1"
    assert e["no-flavor"].reason == "no ready node has h100 GPUs"
    assert e["no-flavor"].suggestion == "flavors with ready nodes: a100"
    assert e["too-big"].reason == "needs 32 a100 GPUs; all ready a100 nodes together have 16"
    assert e["odd"].reason.startswith("needs 11 a100 GPUs, which cannot be split")
    assert e["odd"].suggestion == "ask for 10 GPUs"
    assert e["over-quota"].reason == (
        "needs 16 a100 GPUs but queue a can never hold more than 8 (its quota plus what it "
        "may borrow)"
    )
    assert e["over-quota"].suggestion == "ask for at most 8 GPUs"
    assert all(x.estimated_start is None for x in e.values())


def test_text_helpers() -> None:
    assert names(["a"]) == "a"
    assert names(["a", "b"]) == "a and b"
    assert names(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
    assert [duration(s) for s in (5, 720, 5400, 3 * 86400)] == [
        "~5 s",
        "~12 min",
        "~1.5 h",
        "~3.0 d",
    ]


def test_nothing_free_names_the_holders() -> None:
    nodes = (node("n1", 4),)
    run = (running("r", "a", {"n1": 4}, started=NOW, runtime=HOUR),)
    d = schedule(snap(nodes, (queue("a", 100),), (pending("j", "a", 2),), run))
    assert d.explanations["j"].reason == (
        "needs 2 a100 GPUs on one node; no a100 GPU is free; they are held by r; "
        "expected start in ~1.0 h"
    )
