"""Quota: nominal quota, cohorts, borrowing and lending limits."""

from __future__ import annotations

from dataclasses import replace

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.quota import QuotaBook

from .builders import node, pending, queue, running, snap


def test_queue_without_cohort_stops_at_its_nominal_quota() -> None:
    s = snap(
        (node("n1"), node("n2")),
        (queue("a", nominal=8),),
        (pending("big", gpus=4),),
        (running("r1", "a", {"n1": 6}),),
    )
    d = schedule(s)
    assert d.placements == ()
    e = d.explanations["big"]
    assert e.reason.startswith("queue a uses 6 of its 8 a100 quota (jobs r1)")
    assert e.blocking == "r1"
    assert e.suggestion == "asking for 2 GPUs would let it start now"


def test_borrowing_from_idle_cohort_peer() -> None:
    s = snap(
        (node("n1"), node("n2")),
        (queue("a", nominal=4, cohort="c"), queue("b", nominal=12, cohort="c")),
        (pending("j", "a", gpus=8),),
    )
    (p,) = schedule(s).placements
    assert p.job_id == "j" and p.borrowed


def test_within_nominal_is_not_borrowing() -> None:
    s = snap(
        (node("n1"),),
        (queue("a", nominal=8, cohort="c"), queue("b", nominal=8, cohort="c")),
        (pending("j", "a", gpus=8),),
    )
    (p,) = schedule(s).placements
    assert not p.borrowed


def test_borrowing_limit_holds() -> None:
    s = snap(
        (node("n1"), node("n2")),
        (queue("a", nominal=4, cohort="c", borrowing_limit=2), queue("b", 12, cohort="c")),
        (pending("j", "a", gpus=8), pending("k", "a", gpus=6, seq=1)),
    )
    d = schedule(s)
    assert [p.job_id for p in d.placements] == ["k"]
    assert "can never hold more than 6" in d.explanations["j"].reason


def test_lending_limit_caps_what_others_borrow() -> None:
    s = snap(
        (node("n1"), node("n2")),
        (queue("a", nominal=4, cohort="c"), queue("b", nominal=12, cohort="c", lending_limit=2)),
        (pending("j", "a", gpus=8), pending("k", "a", gpus=6, seq=1)),
    )
    d = schedule(s)
    assert [p.job_id for p in d.placements] == ["k"]  # 4 own + 2 lent
    assert "can never hold more than 6" in d.explanations["j"].reason


def test_cohort_with_nothing_idle_names_who_uses_it() -> None:
    s = snap(
        (node("n1"), node("n2")),
        (queue("a", nominal=8, cohort="c"), queue("b", nominal=8, cohort="c")),
        (pending("j", "a", gpus=2),),
        (running("ra", "a", {"n1": 8}), running("rb", "b", {"n2": 8})),
    )
    e = schedule(s).explanations["j"]
    assert e.reason.startswith(
        "queue a uses 8 of its 8 a100 quota and its cohort has 0 idle to lend "
        "(the rest is used by b with 8)"
    )
    assert e.blocking == "b"


def test_quota_book_reclaim_and_borrow_verdicts() -> None:
    book = QuotaBook(
        [
            queue("a", nominal=8, cohort="c"),
            queue("b", nominal=8, cohort="c", borrowing_limit=6),
        ]
    )
    book.add("b", "a100", 14)  # b borrows 6 of a's 8
    assert book.borrowed("b", "a100") == 6
    v = book.check("a", "a100", 4)
    assert (v.kind, v.excess) == ("reclaim", 2)
    assert book.check("a", "a100", 2).ok
    assert book.check("b", "a100", 1).kind == "borrow_limit"
    assert book.check("a", "a100", 4, freed={"b": 2}).ok
    book.remove("b", "a100", 14)
    assert book.pool("c", "a100") == (16, 0)


# --- a job reclaim could never take back does not borrow -------------------------------------


def test_a_job_of_a_class_that_is_not_preemptible_never_borrows() -> None:
    """Seen in a review as a hostile tenant: any member may pick a class that is never
    preempted; with it, a job borrowed an idle team's quota, and the lender's own jobs,
    within their nominal quota, waited for its whole runtime (reclaim can never take it)."""
    s = snap(
        (node("n1"),),
        (queue("a", nominal=4, cohort="c"), queue("b", nominal=4, cohort="c")),
        (
            pending("first", "a", gpus=4, priority="pinned"),
            pending("second", "a", gpus=4, priority="pinned", seq=1),
        ),
    )
    d = schedule(s)
    assert [(p.job_id, p.borrowed) for p in d.placements] == [("first", False)]
    assert d.explanations["second"].reason.startswith(
        "queue a uses 4 of its 4 a100 quota (jobs first) (its priority class is not "
        "preemptible, so it never borrows)"
    ), d.explanations["second"].reason
    # The same jobs of a preemptible class borrow b's idle quota, as before.
    preemptible = replace(s, pending=tuple(replace(j, priority="normal") for j in s.pending))
    placed = schedule(preemptible).placements
    assert [(p.job_id, p.borrowed) for p in placed] == [("first", False), ("second", True)]


def test_a_job_that_never_borrows_still_reclaims_its_own_nominal_quota() -> None:
    s = snap(
        (node("n1"),),
        (queue("a", nominal=4, cohort="c"), queue("b", nominal=4, cohort="c")),
        (pending("mine", "a", gpus=4, priority="pinned"),),
        (running("b1", "b", {"n1": 4}), running("b2", "b", {"n1": 4})),
    )
    d = schedule(s)
    assert [p.for_job_id for p in d.preemptions] == ["mine"]
    assert d.preemptions[0].job_id in ("b1", "b2")


def test_a_job_larger_than_its_nominal_quota_that_never_borrows_can_never_start() -> None:
    s = snap(
        (node("n1"),),
        (queue("a", nominal=4, cohort="c"), queue("b", nominal=4, cohort="c")),
        (pending("big", "a", gpus=8, priority="pinned"),),
    )
    e = schedule(s).explanations["big"]
    assert e.reason == (
        "needs 8 a100 GPUs but priority class pinned is not preemptible, so its jobs never "
        "borrow and queue a holds at most its nominal quota of 4"
    )
    assert e.suggestion == "ask for at most 4 GPUs"


def test_the_verdicts_of_jobs_that_may_and_may_not_borrow_are_kept_apart() -> None:
    book = QuotaBook((queue("a", nominal=4, cohort="c"), queue("b", nominal=4, cohort="c")))
    book.add("a", "a100", 4)
    assert book.check("a", "a100", 2).ok
    refused = book.check("a", "a100", 2, borrows=False)
    assert (refused.kind, refused.excess) == ("nominal_full", 2)
    assert book.check("a", "a100", 2).ok  # (the memo of one is not the other's)
    assert (book.ceiling("a", "a100"), book.ceiling("a", "a100", borrows=False)) == (8, 4)
    assert book.check("a", "a100", 2, freed={"a": 2}, borrows=False).ok
