"""Quota: nominal quota, cohorts, borrowing and lending limits."""

from __future__ import annotations

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
