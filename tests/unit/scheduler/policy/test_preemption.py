"""Preemption: reclaim of lent quota, priority within a queue, minimum runtime, victim choice."""

from __future__ import annotations

from dataclasses import replace

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import Node, PolicyConfig, RunningJob

from .builders import HOUR, NOW, node, pending, queue, running, snap

COHORT = (queue("a", nominal=8, cohort="c"), queue("b", nominal=8, cohort="c"))


def borrowed_cluster(
    started: float = NOW - HOUR, priority: str = "normal"
) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]]:
    """b uses its own node and 6 GPUs of a's quota on n2 in three jobs."""
    nodes = (node("n1"), node("n2"))
    run = (
        running("b-own", "b", {"n1": 8}, started=started, priority=priority),
        running("b1", "b", {"n2": 2}, started=started, priority=priority),
        running("b2", "b", {"n2": 2}, started=started, priority=priority),
        running("b3", "b", {"n2": 2}, started=started, priority=priority),
    )
    return nodes, run


def test_reclaim_preempts_borrowers_to_return_quota() -> None:
    nodes, run = borrowed_cluster()
    d = schedule(snap(nodes, COHORT, (pending("a-job", "a", gpus=6),), run))
    assert d.placements == ()
    victims = sorted(p.job_id for p in d.preemptions)
    assert len(victims) == 2 and set(victims) <= {"b1", "b2", "b3"}  # 2 free + 4 reclaimed
    assert {p.kind for p in d.preemptions} == {"reclaim"}
    assert all(p.for_job_id == "a-job" for p in d.preemptions)
    e = d.explanations["a-job"]
    assert e.reason.startswith(
        "freeing GPUs held by jobs running on borrowed quota (2 team-b jobs)"
    )
    assert e.blocking == "team-b"  # the victims are team b's: a's user never sees their ids
    assert not any(v in e.reason for v in victims)
    assert e.estimated_start == NOW + PolicyConfig().grace_s


def test_reclaim_never_takes_a_queues_own_quota() -> None:
    nodes = (node("n1"), node("n2"))
    run = (running("b-own", "b", {"n1": 8}), running("a-own", "a", {"n2": 8}))
    d = schedule(snap(nodes, COHORT, (pending("x", "a", gpus=1),), run))
    assert d.preemptions == ()


def test_minimum_runtime_protects_borrowers_and_says_when_reclaim_comes() -> None:
    nodes, run = borrowed_cluster(started=NOW - 600, priority="guarded")  # min runtime 30 min
    d = schedule(snap(nodes, COHORT, (pending("a-job", "a", gpus=8),), run))
    assert d.preemptions == ()
    e = d.explanations["a-job"]
    # Guarded jobs may be preempted 30 min after their start (20 min from now) + 5 min grace.
    assert e.reason == "team-b borrows 6 of your 8 a100 quota; reclaim expected in ~25 min"
    assert e.blocking == "b"
    assert e.estimated_start == NOW - 600 + 1800 + 300


def test_a_borrower_that_may_not_be_preempted_is_not_said_to_be_reclaimed() -> None:
    # Seen on a local stack: team b's `high` (not preemptible) jobs borrowed team a's quota
    # and a's job was told "reclaim expected in ~30 min" -- no reclaim was coming, only
    # their declared ends.
    nodes, run = borrowed_cluster(priority="pinned")
    d = schedule(snap(nodes, COHORT, (pending("a-job", "a", gpus=6),), run))
    assert d.preemptions == ()
    e = d.explanations["a-job"]
    assert e.reason == (
        "team-b borrows 6 of your 8 a100 quota; it returns as their jobs end, expected in ~9.0 h"
    )
    assert e.estimated_start is not None and e.estimated_start > NOW


def test_priority_preemption_within_a_queue() -> None:
    nodes = (node("n1"),)
    queues = (queue("a", nominal=8),)
    run = (
        running("low1", "a", {"n1": 4}, priority="low", started=NOW - 2000),
        running("low2", "a", {"n1": 4}, priority="low", started=NOW - 1000),
    )
    d = schedule(snap(nodes, queues, (pending("hi", "a", gpus=4, priority="high"),), run))
    assert [(p.job_id, p.kind) for p in d.preemptions] == [("low2", "priority")]
    assert "priority high outranks low in queue a" in d.preemptions[0].reason


def test_equal_priority_does_not_preempt() -> None:
    nodes = (node("n1"),)
    run = (running("r", "a", {"n1": 8}, priority="normal"),)
    d = schedule(snap(nodes, (queue("a", 8),), (pending("p", "a", 4, priority="normal"),), run))
    assert d.preemptions == ()


def test_priority_never_preempts_across_queues() -> None:
    nodes = (node("n1"),)
    queues = (queue("a", 8, cohort="c"), queue("b", 0, cohort="c"))
    run = (running("theirs", "a", {"n1": 8}, priority="low"),)
    d = schedule(snap(nodes, queues, (pending("hi", "b", 8, priority="high"),), run))
    assert d.preemptions == ()


def test_non_preemptible_class_is_never_a_victim() -> None:
    nodes = (node("n1"),)
    run = (running("pinned", "a", {"n1": 8}, priority="pinned"),)
    d = schedule(snap(nodes, (queue("a", 8),), (pending("hi", "a", 8, priority="high"),), run))
    assert d.preemptions == ()


def test_preemption_can_be_switched_off() -> None:
    nodes, run = borrowed_cluster()
    config = PolicyConfig(preemption=False)
    d = schedule(snap(nodes, COHORT, (pending("a-job", "a", gpus=6),), run), config)
    assert d.preemptions == ()
    # Nothing is reclaimed with preemption off: the quota comes back as the borrowers end.
    assert d.explanations["a-job"].reason == (
        "team-b borrows 6 of your 8 a100 quota; it returns as their jobs end, expected in ~9.0 h"
    )


def test_victims_lose_least_work_first() -> None:
    nodes = (node("n1", 4),)
    queues = (queue("a", 4),)

    def low(job_id: str, checkpoint: float | None) -> RunningJob:
        return running(
            job_id, "a", {"n1": 1}, priority="low", started=NOW - 5 * HOUR, checkpoint=checkpoint
        )

    run = (
        low("stale-ckpt", NOW - 3600),
        low("fresh-ckpt", NOW - 60),
        low("no-ckpt", None),
        low("older-fresh", NOW - 70),
    )
    d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), run))
    # Seconds count, not whole minutes: fresh-ckpt lost 60 s, older-fresh 70 s.
    assert [p.job_id for p in d.preemptions] == ["fresh-ckpt"]
    assert "it loses ~1 min of work on 1 GPU since its last checkpoint" in d.preemptions[0].reason


def test_at_equal_seconds_lost_the_smaller_gang_goes() -> None:
    """Seconds lost decide first; at equal seconds, the GPU-seconds of the whole gang."""
    nodes = (node("n1", 5),)
    queues = (queue("a", 5),)
    ckpt = NOW - 5 * HOUR
    run = (
        running("single", "a", {"n1": 1}, priority="low", started=ckpt, checkpoint=NOW - 60),
        running("gang", "a", {"n1": 4}, priority="low", started=ckpt, checkpoint=NOW - 60),
    )
    d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), run))
    assert [p.job_id for p in d.preemptions] == ["single"]


def test_under_a_minute_the_work_lost_still_decides() -> None:
    """Seen live: with whole minutes, 10 s and 50 s of lost work tied and the youngest went."""
    nodes = (node("n1", 2),)
    queues = (queue("a", 2),)
    run = (
        running("young", "a", {"n1": 1}, priority="low", started=NOW - HOUR, checkpoint=NOW - 50),
        running("old", "a", {"n1": 1}, priority="low", started=NOW - 2 * HOUR, checkpoint=NOW - 10),
    )
    d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), run))
    assert [p.job_id for p in d.preemptions] == ["old"]


def test_victim_ties_go_to_lowest_priority_then_youngest() -> None:
    nodes = (node("n1", 3),)
    queues = (queue("a", 3),)
    ckpt = NOW - 30
    run = (
        running(
            "normal-young", "a", {"n1": 1}, priority="normal", started=NOW - 700, checkpoint=ckpt
        ),
        running("low-old", "a", {"n1": 1}, priority="low", started=NOW - 900, checkpoint=ckpt),
        running("low-young", "a", {"n1": 1}, priority="low", started=NOW - 800, checkpoint=ckpt),
    )
    d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), run))
    assert [p.job_id for p in d.preemptions] == ["low-young"]
    d2 = schedule(snap(nodes, queues, (pending("hi", "a", 2, priority="high"),), run))
    assert sorted(p.job_id for p in d2.preemptions) == ["low-old", "low-young"]


def test_jobs_already_leaving_are_used_before_new_victims() -> None:
    nodes = (node("n1", 4),)
    queues = (queue("a", 4),)
    run = (
        running("leaving", "a", {"n1": 2}, priority="low", notice=NOW - 60),
        running("other", "a", {"n1": 2}, priority="low"),
    )
    d = schedule(snap(nodes, queues, (pending("hi", "a", 2, priority="high"),), run))
    assert d.preemptions == ()
    e = d.explanations["hi"]
    assert e.reason.startswith("freeing GPUs held by jobs already leaving (leaving)")
    assert e.estimated_start == NOW - 60 + 300


def test_a_victim_is_chosen_once_per_pass_even_when_two_queues_reclaim() -> None:
    # c borrows a's and b's whole quota with one 8-GPU job; a and b each want theirs back.
    queues = (
        queue("a", nominal=4, cohort="c3"),
        queue("b", nominal=4, cohort="c3"),
        queue("c", nominal=0, cohort="c3"),
    )
    run = (running("c-big", "c", {"n1": 8}, started=NOW - HOUR),)
    waiting = (pending("a-job", "a", gpus=4), pending("b-job", "b", gpus=4, seq=2))
    d = schedule(snap((node("n1"),), queues, waiting, run))
    victims = [p.job_id for p in d.preemptions]
    assert victims == ["c-big"]


# --- anti-thrash ---------------------------------------------------------------------------


def test_no_job_is_preempted_before_the_default_minimum_runtime() -> None:
    nodes = (node("n1", 1),)
    queues = (queue("a", 1),)
    config = PolicyConfig(min_runtime_s=300.0)
    for age, preempted in ((299.0, False), (300.0, True)):
        run = (running("low", "a", {"n1": 1}, priority="low", started=NOW - age),)
        d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), run), config)
        assert bool(d.preemptions) is preempted, age
    # While it is protected, the waiting job is told who holds its quota.
    run = (running("low", "a", {"n1": 1}, priority="low", started=NOW - 100),)
    d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), run), config)
    assert d.explanations["hi"].blocking == "low"


def test_a_protected_borrower_delays_the_reclaim_estimate_until_its_protection_ends() -> None:
    nodes, run = borrowed_cluster(started=NOW - 100)
    config = PolicyConfig(min_runtime_s=300.0)
    d = schedule(snap(nodes, COHORT, (pending("a-job", "a", gpus=6),), run), config)
    assert d.preemptions == ()
    assert d.explanations["a-job"].estimated_start == NOW + 200 + config.grace_s


def test_each_preemption_doubles_the_protection_and_the_last_one_is_final() -> None:
    nodes = (node("n1", 1),)
    queues = (queue("a", 1),)
    config = PolicyConfig(min_runtime_s=300.0, max_preemptions=3)

    def preempted(times: int, age: float) -> bool:
        low = running("low", "a", {"n1": 1}, priority="low", started=NOW - age)
        low = replace(low, preemptions=times)
        d = schedule(snap(nodes, queues, (pending("hi", "a", 1, priority="high"),), (low,)), config)
        return bool(d.preemptions)

    assert [preempted(1, age) for age in (599.0, 600.0)] == [False, True]
    assert [preempted(2, age) for age in (1199.0, 1200.0)] == [False, True]
    assert not preempted(3, 10 * HOUR)  # preempted 3 times: it runs to its end


def test_a_borrower_larger_than_what_its_queue_borrows_is_spared_a_while_then_reclaimed() -> None:
    # qb (nominal 4) runs one 8-GPU job: it borrows 4 but reclaiming the job would take qb to
    # 0, below its quota. qa's job within its nominal waits the 4-hour spare out: no notice,
    # and its estimate is the end of the spare plus the grace period.
    queues = (queue("qa", 4, cohort="c"), queue("qb", 4, cohort="c"))
    wait = (pending("qa-own", "qa", 4),)
    young = running("rb", "qb", {"n1": 8}, started=NOW - HOUR, runtime=24 * HOUR)
    d = schedule(snap((node("n1", 8),), queues, wait, (young,)))
    assert d.preemptions == ()
    grace = PolicyConfig().grace_s
    assert d.explanations["qa-own"].estimated_start == NOW + 3 * HOUR + grace
    # Past the spare it is reclaimed as before.
    old = replace(young, started_at=NOW - 4 * HOUR)
    d = schedule(snap((node("n1", 8),), queues, wait, (old,)))
    assert [(p.job_id, p.kind) for p in d.preemptions] == [("rb", "reclaim")]


def _freeing(node_id: str, job_id: str, indices: range, team: str) -> Node:
    """A node whose GPUs ``indices`` are still held by ``job_id``, which ended while its
    runner stops it (the service's ``convert.stopping_holder``)."""
    holder = f"{job_id} (stopping: its GPUs are being freed)"
    return replace(node(node_id), used=dict.fromkeys(indices, holder), teams={job_id: team})


def test_a_job_that_fits_once_the_gpus_being_freed_are_free_preempts_no_one() -> None:
    # low2's notice ran out: its allocation ended, its runner still stops it on GPUs 4-7.
    nodes = (_freeing("n1", "low2", range(4, 8), "team-a"),)
    run = (running("low1", "a", {"n1": 4}, priority="low", started=NOW - 2000),)
    pend = (pending("hi", "a", gpus=4, priority="high"),)
    d = schedule(snap(nodes, (queue("a", nominal=8),), pend, run))
    assert d.preemptions == ()
    assert d.placements == ()
    assert "held by low1 and low2 (stopping: its GPUs are being freed)" in (
        d.explanations["hi"].reason
    )


def test_two_jobs_never_wait_for_the_same_gpus_being_freed() -> None:
    nodes = (_freeing("n1", "gone", range(4, 8), "team-a"), node("n2"))
    queues = (queue("a", nominal=8), queue("b", nominal=12))  # quota for both
    run = (
        running("low-a", "a", {"n1": 4}, priority="low", started=NOW - 2000),
        running("low-b", "b", {"n2": 8}, priority="low", started=NOW - 2000),
    )
    pend = (
        pending("hi-a", "a", gpus=4, priority="high"),
        pending("hi-b", "b", gpus=4, priority="high"),
    )
    d = schedule(snap(nodes, queues, pend, run))
    # One of them waits for the 4 GPUs being freed; the other needs a victim of its queue.
    assert len(d.preemptions) == 1


def test_gpus_being_freed_past_the_count_of_a_node_shrunk_since_are_waited_for_by_no_one() -> None:
    # n1 has 4 GPUs now (its declaration shrank it): GPUs 4-7, still held, never come back.
    nodes = (_freeing("n1", "gone", range(4, 8), "team-a"),)
    nodes = (replace(nodes[0], gpu_count=4),)
    run = (running("low1", "a", {"n1": 4}, priority="low", started=NOW - 2000),)
    d = schedule(
        snap(nodes, (queue("a", nominal=8),), (pending("hi", "a", 4, priority="high"),), run)
    )
    assert [(p.job_id, p.kind) for p in d.preemptions] == [("low1", "priority")]
