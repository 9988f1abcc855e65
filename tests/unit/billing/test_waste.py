"""The pure waste calculations: waits, pieces per allocation, low-priority holding, pricing
and the success lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from trainyard_platform.services.billing.domain import Price
from trainyard_platform.services.billing.prices import BEGINNING, DatedPrice, PriceSchedule
from trainyard_platform.services.billing.waste import (
    Allocation,
    JobEnd,
    JobWaits,
    Owner,
    Piece,
    Wait,
    allocation_pieces,
    holding_pieces,
    price,
    success_lines,
    waits,
)

T = datetime(2026, 11, 2, 10, tzinfo=UTC)
NOW = T + timedelta(days=10)
OWNER = Owner("ml", "p", "ada", "q", "a100", "j")


def at(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def alloc(
    start: float,
    end: float | None,
    outcome: str | None,
    attempt: int = 1,
    priority: str = "normal",
    owner: Owner = OWNER,
    **measured: object,
) -> Allocation:
    return Allocation(
        allocation_id=f"a{attempt}-{start}",
        owner=owner,
        gpus=2,
        granted_at=at(start),
        ended_at=None if end is None else at(end),
        outcome=outcome,
        attempt=attempt,
        priority=priority,
        **measured,  # type: ignore[arg-type]
    )


def job(*allocations: Allocation, ended: float | None = None, priority: str = "normal") -> JobWaits:
    return JobWaits(OWNER, 2, priority, T, allocations, None if ended is None else at(ended))


def test_a_job_waits_until_its_grant_and_again_after_each_interrupted_attempt() -> None:
    j = job(
        alloc(30, 90, "failed"), alloc(100, 160, "preempted", 2), alloc(170, 200, "succeeded", 3)
    )
    assert waits(j, NOW) == [
        Wait(T, at(30), "q"),
        Wait(at(90), at(100), "q"),
        Wait(at(160), at(170), "q"),
    ]


def test_a_gang_attempt_counts_once_from_its_first_grant_to_its_last_release() -> None:
    gang = [alloc(30, 60, "lost"), alloc(31, 65, "lost")]
    j = job(*gang, alloc(80, 90, "succeeded", 2))
    assert waits(j, NOW) == [Wait(T, at(30), "q"), Wait(at(65), at(80), "q")]


def test_an_open_wait_lasts_until_the_job_ends_or_now() -> None:
    assert waits(job(), NOW) == [Wait(T, NOW, None)]
    assert waits(job(ended=20), NOW) == [Wait(T, at(20), None)]  # cancelled while waiting
    # failed for good at its release: no wait after it
    assert waits(job(alloc(30, 90, "failed"), ended=90), NOW) == [Wait(T, at(30), "q")]
    # running: no wait after its grant
    assert waits(job(alloc(30, None, None)), NOW) == [Wait(T, at(30), "q")]


def test_pieces_of_an_allocation_never_guess_a_missing_measurement() -> None:
    unmeasured = {p.figure for p in allocation_pieces(alloc(0, 60, "succeeded"))}
    assert unmeasured == {"idle_gpus_unmeasured", "input_bound_unmeasured"}
    busy = allocation_pieces(
        alloc(0, 60, "succeeded", gpu_utilization=Decimal(80), data_wait_fraction=Decimal(0))
    )
    assert busy == []
    idle = allocation_pieces(
        alloc(0, 60, "succeeded", gpu_utilization=Decimal("4.9"), data_wait_fraction=Decimal("0.5"))
    )
    assert {p.figure: p.share for p in idle} == {"idle_gpus": 1, "input_bound": Decimal("0.5")}
    assert allocation_pieces(alloc(0, None, None)) == []  # still running: not measured yet


def test_work_lost_since_the_latest_checkpoint_of_the_allocation() -> None:
    failed = allocation_pieces(alloc(0, 60, "failed", last_checkpoint=at(45)))
    lost = next(p for p in failed if p.figure == "lost_work")
    assert (lost.start, lost.end) == (at(45), at(60))
    assert any(p.figure == "failed_attempts" for p in failed)
    preempted = allocation_pieces(alloc(0, 60, "preempted"))
    assert [p.figure for p in preempted if p.figure in ("lost_work", "failed_attempts")] == [
        "lost_work"
    ]
    cancelled = allocation_pieces(alloc(0, 60, "cancelled"))
    assert not [p for p in cancelled if p.figure in ("lost_work", "failed_attempts")]


def test_an_attempt_the_platform_failed_is_the_platform_s_not_a_failed_attempt() -> None:
    """A ``platform_error`` attempt was counted in the team's ``failed_attempts``; it is
    ``platform_failure`` (charged to the platform), whole, instead. The job's own failure,
    or one without a report, stays a failed attempt."""

    def figures(**measured: object) -> set[str]:
        pieces = allocation_pieces(alloc(0, 60, "failed", **measured))
        return {p.figure for p in pieces if p.figure in ("failed_attempts", "platform_failure")}

    assert figures(failure_kind="platform_error") == {"platform_failure"}
    assert figures(failure_kind="user_error") == {"failed_attempts"}
    assert figures() == {"failed_attempts"}
    (whole,) = [
        p
        for p in allocation_pieces(alloc(0, 60, "lost", failure_kind="platform_error"))
        if p.figure == "platform_failure"
    ]
    assert (whole.start, whole.end, whole.gpus) == (at(0), at(60), 2)


def test_holding_counts_only_overlap_with_higher_priority_waits_of_the_flavor() -> None:
    low = alloc(0, 120, "succeeded", priority="low", owner=Owner("v", "p", "cy", "q", "a100", "l"))
    high = JobWaits(
        Owner("ml", "p", "bo", None, "a100", "h"),
        1,
        "high",
        at(60),
        [alloc(90, 100, "succeeded")],
        None,
    )
    other_flavor = JobWaits(Owner("ml", "p", "bo", None, "cpu", "c"), 1, "high", at(0), [], None)
    equal = JobWaits(Owner("ml", "p", "bo", None, "a100", "e"), 1, "low", at(0), [], None)
    (piece,) = holding_pieces([low], [high, other_flavor, equal], NOW)
    assert (piece.start, piece.end, piece.gpus, piece.owner.job) == (at(60), at(90), 2, "l")


def test_price_clips_to_the_range_and_to_now_and_splits_at_a_price_change() -> None:
    book = PriceSchedule.of(
        [
            DatedPrice(BEGINNING, Price("a100", Decimal("2.5"), "USD")),
            DatedPrice(at(30), Price("a100", Decimal("3.5"), "USD")),
        ]
    )
    piece = Piece("queueing", OWNER, "a100", 2, at(0), at(60))
    priced = price(piece, book, T, T + timedelta(days=1), NOW)
    assert priced is not None
    assert priced.gpu_seconds == 7200
    assert priced.cost == Decimal("2.5") + Decimal("3.5")  # 2 GPUs, half an hour at each
    clipped = price(piece, book, at(-60), at(15), NOW)
    assert clipped is not None and clipped.seconds == 900
    assert price(piece, book, at(60), at(120), NOW) is None
    unpriced = price(Piece("queueing", OWNER, "h100", 1, at(0), at(60)), book, T, NOW, NOW)
    assert unpriced is not None and unpriced.cost == 0 and unpriced.gpu_seconds == 3600
    assert unpriced.unpriced_gpu_seconds == 3600
    half = price(
        Piece("input_bound", OWNER, "a100", 1, at(0), at(10), Decimal("0.5")), book, T, NOW, NOW
    )
    assert half is not None and half.gpu_seconds == 300


def test_success_lines_per_day_team_and_queue() -> None:
    ends = [
        JobEnd(OWNER, "succeeded", at(0)),
        JobEnd(OWNER, "failed", at(10)),
        JobEnd(OWNER, "cancelled", at(20)),
        JobEnd(OWNER, "succeeded", at(60 * 24)),
    ]
    first, second = success_lines(ends)
    assert (first.ended, first.succeeded, first.failed, first.cancelled) == (3, 1, 1, 1)
    assert first.rate == Decimal("0.3333")
    assert (second.day, second.rate) == (datetime(2026, 11, 3, tzinfo=UTC), Decimal(1))
