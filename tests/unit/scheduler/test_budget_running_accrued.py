"""A running job's cost is not counted twice against a budget that reserves: what billing
said is spent counts what each of its running allocations (``accruing``) accrued up to when
it was measured (``spent_at``), so such a job is reserved only its worst case from then on;
any other running job (started after, or said by a billing that does not say them) is
reserved whole, which is safe."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from tests.unit.scheduler.test_budget_reservations import HOUR, hour_job, reserving_budget, started
from tests.unit.scheduler.test_convert import NOW, member
from trainyard_platform.services.scheduler.budget_holds import ALL_RUNNING, fit, reserving

TEAM = {"team": "team-a", "project": "vision"}


def runner(job_id: str, ran: timedelta, node: str = "n1", **more: Any) -> dict[str, Any]:
    """One allocation of a 1-GPU job of an hour (2.50 at worst) granted ``ran`` before NOW,
    and started then (unless ``more`` says otherwise)."""
    at = NOW - ran
    row = {"gpus": 1, "max_runtime_seconds": HOUR, "granted_at": at, "started_at": at}
    return member(job_id, node, [0], **{**row, **TEAM, **more})


def state(**more: Any) -> dict[str, Any]:
    """5.00, of which 1.25 is spent: what r1 accrued in its first half hour."""
    return reserving_budget("team-a", **{"amount": "5.000000", "spent": "1.250000", **more})


def reserved_before(queued: str, budget: dict[str, Any], *members: dict[str, Any]) -> Decimal:
    """What ``fit`` says is reserved before the third of three queued jobs of 2.50 each
    (which never fits): by the running ``members`` and the queued jobs before it that fit."""
    jobs = [hour_job(f"{queued}{i}", "qa", seq=i, **TEAM) for i in range(3)]
    by_job: dict[str, list[dict[str, Any]]] = {}
    for m in members:
        by_job.setdefault(m["job_id"], []).append(m)
    unfit = fit(jobs, by_job, reserving([budget], NOW))
    return unfit[f"{queued}2"].reserved


def test_a_running_job_billing_counts_is_reserved_only_what_it_may_still_cost() -> None:
    # r1 ran 30 min at spent_at: 1.25 is in spent, 1800 s left at 2.50 an hour = 1.25.
    # Before, it was reserved its whole 2.50 as well: 1.25 + 2.50 + 2.50 > 5.00.
    budget = state(spent_at=NOW, accruing=["r1-n1"])
    assert reserved_before("a", budget, runner("r1", timedelta(minutes=30))) == Decimal("3.750000")
    placed, _, _ = started(budget, running=[runner("r1", timedelta(minutes=30))])
    assert placed == ["a0"]  # 1.25 spent + 1.25 left of r1 + 2.50: exactly 5.00


def test_it_counts_from_when_spent_was_measured_not_from_now() -> None:
    # Measured 10 min after r1's grant (r1 has run 30 min by NOW): 50 min left then.
    budget = state(spent_at=NOW - timedelta(minutes=20), accruing=["r1-n1"])
    # 3000 s at 2.50 an hour = 2.083333..., rounded up to a micro-unit (no queued job fits).
    assert reserved_before("a", budget, runner("r1", timedelta(minutes=30))) == Decimal("2.083334")


def test_only_whole_seconds_run_are_taken_off() -> None:
    budget = state(spent_at=NOW, accruing=["r1-n1"])
    ran = timedelta(minutes=30, microseconds=999_999)  # 1800.999999 s: 1800 whole
    assert reserved_before("a", budget, runner("r1", ran)) == Decimal("3.750000")


def test_a_job_past_its_max_runtime_is_reserved_nothing_more() -> None:
    budget = state(spent_at=NOW, accruing=["r1-n1"])
    over = runner("r1", timedelta(hours=3))
    assert reserved_before("a", budget, over) == Decimal("2.500000")  # a0's: it fits
    placed, _, _ = started(budget, running=[over])
    assert placed == ["a0"]  # 1.25 spent + 0 + 2.50


def test_a_job_billing_did_not_count_is_reserved_whole() -> None:
    old = state()  # a billing from before spent_at: as before, whole
    late = state(spent_at=NOW - timedelta(minutes=40), accruing=[])  # granted after it
    no_list = state(spent_at=NOW, accruing=None)  # too many running allocations to name
    for budget in (old, late, no_list):
        running = runner("r1", timedelta(minutes=30))
        assert reserved_before("a", budget, running) == Decimal("2.500000")  # none fits
        placed, _, _ = started(budget, running=[running])
        assert placed == []


def test_a_gang_counts_only_when_billing_counted_each_of_its_allocations() -> None:
    gang = [
        runner("g1", timedelta(minutes=30), node="n1", gpus=2),
        runner("g1", timedelta(minutes=30), node="n2", gpus=2),
    ]
    half = state(spent_at=NOW, accruing=["g1-n1"])
    assert reserved_before("a", half, *gang) == Decimal("5.000000")  # 2 GPUs for an hour
    both = state(spent_at=NOW, accruing=["g1-n1", "g1-n2"])
    assert reserved_before("a", both, *gang) == Decimal("2.500000")  # the half hour left


def test_a_state_of_an_earlier_month_counts_each_job_from_the_month_s_start() -> None:
    # NOW is 2025-03-01 12:00; billing last said February's state (whatever it counted).
    february = state(month="2025-02", spent="4.000000", spent_at=None, accruing=None)
    reserve = reserving([february], NOW)[("team-a", "")]
    assert reserve["spent"] == "0.000000" and reserve["accruing"] == ALL_RUNNING
    assert reserve["spent_at"] == datetime(2025, 3, 1, tzinfo=UTC)
    # Granted 30 min before the month: 30 min of its hour is left in March (1.25).
    before = runner("r1", timedelta(hours=12, minutes=30))
    assert reserved_before("a", february, before) == Decimal("1.250000") + Decimal("2.500000")
    # Granted in March: nothing of it was spent at the month's start; whole.
    assert reserved_before("a", february, runner("r1", timedelta(minutes=30))) == Decimal("5")


def test_it_counts_from_the_job_s_start_not_its_grant() -> None:
    # Granted 30 min before NOW, started 10 min later (its image, its checkpoint): the
    # runner's limit runs from the start, so r1 may run 40 min more, 1.666667 at worst.
    budget = state(spent_at=NOW, accruing=["r1-n1"])
    staged = runner("r1", timedelta(minutes=30), started_at=NOW - timedelta(minutes=20))
    assert reserved_before("a", budget, staged) == Decimal("1.666667")


def test_a_job_not_started_yet_is_reserved_whole() -> None:
    # Billing counts its time since the grant, but all of its max_runtime_seconds may
    # still run once it starts.
    budget = state(spent_at=NOW, accruing=["r1-n1"])
    staging = runner("r1", timedelta(minutes=30), started_at=None)
    assert reserved_before("a", budget, staging) == Decimal("2.500000")
    gang = [
        runner("g1", timedelta(minutes=30), node="n1"),
        runner("g1", timedelta(minutes=30), node="n2", started_at=None),
    ]
    both = state(spent_at=NOW, accruing=["g1-n1", "g1-n2"])
    assert reserved_before("a", both, *gang) == Decimal("2.500000")


def test_a_start_said_before_its_grant_counts_from_the_grant() -> None:
    # A node whose clock is behind (or lies) says it started an hour before its grant.
    budget = state(spent_at=NOW, accruing=["r1-n1"])
    early = runner("r1", timedelta(minutes=30), started_at=NOW - timedelta(minutes=90))
    assert reserved_before("a", budget, early) == Decimal("3.750000")
