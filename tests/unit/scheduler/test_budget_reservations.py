"""A budget that holds queued jobs once spent is not overrun by jobs started together before
it is: each job of its team (or project) is reserved its worst case (its GPUs, CPUs and
memory for its max_runtime_seconds and the runner's kill grace after it, at billing's
highest prices), and a queued job starts
only while its reservation fits beside what is spent and what the jobs before it reserve."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from tests.unit.scheduler.test_budget_holds import budget, implicit_queue_z
from tests.unit.scheduler.test_convert import HALF_LIFE, NOW, member, node, queue, rows, waiting
from trainyard_platform.services.scheduler.budget_holds import (
    holding,
    lowering,
    reservation,
    reserving,
)
from trainyard_platform.services.scheduler.convert import build_snapshot, pending_notes
from trainyard_platform.services.scheduler.policy.engine import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

HOUR = 3600 - KILL_GRACE_SECONDS
"""A ``max_runtime_seconds`` whose attempt (it and the runner's kill grace after it) is an
hour: the worst case a budget reserves."""


def hour_job(job_id: str, queue_name: str = "qa", **more: Any) -> dict[str, Any]:
    """A queued job (``waiting``) whose attempt lasts at most an hour."""
    return waiting(job_id, queue_name, **{"max_runtime_seconds": HOUR, **more})


RATES = {"a100": {"gpu_hour": "2.5", "cpu_hour": "0.1", "memory_gib_hour": "0.01"}}
"""2.50 per GPU-hour: a 1-GPU job of an hour (``waiting``'s) is reserved 2.50."""


def reserving_budget(team: str, project: str = "", **more: Any) -> dict[str, Any]:
    """A budget of 3.00 (room for one such job), nothing spent, under ``refuse``/``finish``."""
    row = budget(team, project, amount="3.000000", spent="0.000000", exhausted=False)
    return {**row, "rates": RATES, **more}


def four_jobs(**more: Any) -> list[dict[str, Any]]:
    return [
        hour_job(f"a{i}", "qa", seq=i, team="team-a", project="vision", **more) for i in range(4)
    ]


def started(*budgets: dict[str, Any], **parts: Any) -> tuple[list[str], Any, Any]:
    parts.setdefault("pending", four_jobs())
    snapshot_rows = rows(
        budgets=list(budgets),
        queues=[queue("qa", "team-a", "c1"), queue(implicit_queue_z(), "team-z", implicit=True)],
        **parts,
    )
    built = build_snapshot(snapshot_rows, NOW, HALF_LIFE)
    decisions = schedule(built.snapshot, PolicyConfig())
    return sorted(p.job_id for p in decisions.placements), built, decisions


def test_jobs_queued_together_start_only_as_far_as_the_budget_covers_their_worst_case() -> None:
    # Four 1-GPU jobs of an hour (2.50 each at worst) against 3.00 of which nothing is spent:
    # before, all four started (10.00 at worst: the budget is said spent only once they
    # have run, and under finish they all run to their end). Now one starts.
    placed, built, decisions = started(reserving_budget("team-a"))
    assert placed == ["a0"]
    assert [r["job_id"] for r in built.budget_held] == ["a1", "a2", "a3"]
    note = pending_notes(decisions, built)["a1"]
    assert note.reason == (
        "held: the budget of team team-a cannot cover this job's worst case (2.500000 USD: "
        "its GPUs, CPUs and memory for its max_runtime_seconds and the 30 s kill grace at the "
        "highest prices); "
        "0.000000 of 3.000000 USD is spent in 2025-03 and 2.500000 USD is reserved by jobs "
        "before it; it starts when one of them ends, the budget is raised or the month ends "
        "(2025-04-01 00:00 UTC)"
    )
    assert note.blocking == "budget of team team-a"
    assert note.estimated_start == datetime(2025, 4, 1, tzinfo=UTC)


def test_the_kill_grace_after_the_limit_is_reserved_too() -> None:
    # A job at its max_runtime_seconds is sent SIGTERM and killed only after the runner's
    # kill grace, holding (and billed) its GPUs until then. Before, a budget that covered
    # the limit alone started it: 2.50 for the hour, 0.020834 more for the grace unbounded.
    at_limit = hour_job("a0", team="team-a", project="vision", max_runtime_seconds=3600)
    assert reservation(at_limit, RATES) == Decimal("2.520834")  # 3630 s at 2.50 an hour
    exact = reserving_budget("team-a", amount="2.500000")
    placed, built, _ = started(exact, pending=[at_limit])
    assert placed == [] and [r["job_id"] for r in built.budget_held] == ["a0"]
    placed, _, _ = started(reserving_budget("team-a", amount="2.520834"), pending=[at_limit])
    assert placed == ["a0"]


def test_running_jobs_keep_their_reservation_until_they_end() -> None:
    running = [
        member("r1", "n1", [0], gpus=1, team="team-a", project="vision", max_runtime_seconds=HOUR)
    ]
    placed, built, _ = started(reserving_budget("team-a"), running=running)
    assert placed == [] and len(built.budget_held) == 4  # 2.50 reserved: 0.50 left
    placed, _, _ = started(reserving_budget("team-a", amount="5.000000"), running=running)
    assert placed == ["a0"]


def test_what_billing_said_is_spent_counts_with_the_reservations() -> None:
    placed, _, _ = started(reserving_budget("team-a", amount="10", spent="5.000001"))
    assert placed == ["a0"]  # 5.000001 + 2.5 fits in 10; one more does not


def test_the_team_s_and_the_project_s_budget_must_each_fit() -> None:
    placed, _, _ = started(
        reserving_budget("team-a", amount="100"), reserving_budget("team-a", "vision", amount="5")
    )
    assert placed == ["a0", "a1"]
    placed, _, _ = started(reserving_budget("team-a", "nlp", amount="0"))  # another project
    assert placed == ["a0", "a1", "a2", "a3"]


def test_the_job_that_would_start_first_reserves_first() -> None:
    jobs = four_jobs()
    jobs[3]["priority_class"] = "high"
    placed, _, _ = started(reserving_budget("team-a"), pending=jobs)
    assert placed == ["a3"]


def test_cpus_and_memory_count_at_their_rates_rounded_up() -> None:
    job = hour_job("a0", "qa", gpus=2, cpus_per_gpu=8, memory_gib_per_gpu=64)
    job["max_runtime_seconds"] = 1801 - KILL_GRACE_SECONDS
    # 2 x (2.5 + 8 x 0.1 + 64 x 0.01) = 7.88 per hour, for 1801 s: 3.942188...
    assert reservation(job, RATES) == Decimal("3.942189")
    assert reservation({**job, "gpu_flavor": "h100"}, RATES) == 0  # no price: billed nothing


def test_a_budget_without_rates_or_that_holds_nothing_reserves_nothing() -> None:
    old = {k: v for k, v in reserving_budget("team-a").items() if k != "rates"}
    for row in (
        old,  # said by a billing from before rates
        reserving_budget("team-a", policy="warn"),  # warn and finish: bounds nothing
    ):
        assert reserving([row], NOW) == {}
        placed, _, _ = started(row)
        assert placed == ["a0", "a1", "a2", "a3"]
    assert reserving([reserving_budget("team-a", policy="warn", on_exhausted="stop")], NOW)


def test_a_new_month_reserves_from_the_whole_amount_before_billing_says_it() -> None:
    # Said spent last month (exhausted): this month it holds nothing whole, but still
    # reserves, with nothing spent yet.
    last = reserving_budget("team-a", month="2025-02", spent="7.000000", exhausted=True)
    (budget,) = reserving([last], NOW).values()
    assert (budget["month"], budget["spent"]) == ("2025-03", "0.000000")
    placed, built, _ = started(last)
    assert placed == ["a0"] and built.holds == {}


def test_a_job_whose_worst_case_exceeds_the_amount_waits_in_this_month_and_the_next() -> None:
    # docs/operations.md, "Upgrade" (the scheduler's 0013): only a raise lets it start.
    short = {"amount": "2.000000"}  # below one job's 2.50
    for row in (
        reserving_budget("team-a", **short),
        reserving_budget("team-a", month="2025-02", spent="2.000000", exhausted=True, **short),
    ):
        placed, built, _ = started(row, pending=four_jobs()[:1])
        assert placed == []
        assert [r["job_id"] for r in built.budget_held] == ["a0"]
    placed, _, _ = started(reserving_budget("team-a", amount="2.500000"), pending=four_jobs()[:1])
    assert placed == ["a0"]


def test_a_job_whose_worst_case_is_more_than_the_whole_budget_is_told_it_never_starts() -> None:
    # 4 GPUs for 10 h at 2.50: 100.00 at worst, against a budget of 3.00 a month. No job
    # ending, no new month lets it start; before, it was told it would start when one of
    # the jobs before it ended or the month ended, and given the next month as its start.
    big = hour_job("big", "qa", seq=0, team="team-a", project="vision", gpus=4)
    big["max_runtime_seconds"] = 36000 - KILL_GRACE_SECONDS
    placed, built, decisions = started(reserving_budget("team-a"), pending=[big])
    assert placed == []
    note = pending_notes(decisions, built)["big"]
    assert note.reason == (
        "held: this job's worst case (100.000000 USD: its GPUs, CPUs and memory for its "
        "max_runtime_seconds and the 30 s kill grace at the highest prices) is more than the "
        "whole budget of team team-a (3.000000 USD a month): it cannot start while the budget is this size"
    )
    assert note.suggestion == (
        "lower max_runtime_seconds to at most 1050 (what the budget covers at these prices), "
        "or ask a team admin or an operator to raise the budget to at least 100.000000 USD "
        "(trainyard budget set team-a --amount 100.000000, or PATCH /v1/budgets/team-a)"
    )
    assert note.blocking == "budget of team team-a"
    assert note.estimated_start is None


def test_a_state_billing_said_of_the_next_month_holds_and_reserves_now() -> None:
    # Billing's clock a little ahead of the scheduler's at midnight: the state it says of
    # April (one row per budget: March's is replaced) arrives while the scheduler's clock is
    # still in March. Before, that state held nothing and reserved nothing (another month),
    # so every queued job of the team started until the scheduler's clock caught up.
    late = datetime(2025, 3, 31, 23, 59, 59, 900000, tzinfo=UTC)
    april = reserving_budget("team-a", month="2025-04")
    assert set(reserving([april], late)) == {("team-a", "")}
    spent = budget("team-a", month="2025-04", exhausted=True)
    assert set(holding([spent], late)) == {("team-a", "")}
    lowers = budget("team-a", month="2025-04", exhausted=True, policy="deprioritize")
    assert set(lowering([lowers], late)) == {("team-a", "")}


def test_a_job_that_waits_for_what_is_spent_is_not_told_to_wait_for_jobs_that_do_not_exist() -> (
    None
):
    # 1.00 of 3.00 spent, nothing running or queued before it: 2.00 is left, the job needs
    # 2.50. No job ending frees room, so it is told what does (a raise, the month's end, or
    # a max_runtime_seconds that fits in what is left); before, it was told to wait for
    # 'one of them' to end and that '0 USD is reserved by jobs before it'.
    placed, built, decisions = started(
        reserving_budget("team-a", spent="1.000000"), pending=four_jobs()[:1]
    )
    assert placed == []
    note = pending_notes(decisions, built)["a0"]
    assert note.reason == (
        "held: the budget of team team-a cannot cover this job's worst case (2.500000 USD: "
        "its GPUs, CPUs and memory for its max_runtime_seconds and the 30 s kill grace at the "
        "highest prices); "
        "1.000000 of 3.000000 USD is spent in 2025-03 and nothing is reserved by other jobs; "
        "it starts when the budget is raised or the month ends (2025-04-01 00:00 UTC)"
    )
    assert note.suggestion == (
        "lower max_runtime_seconds to at most 2850 (what is left of the budget covers), or "
        "ask a team admin or an operator to raise the budget "
        "(trainyard budget set team-a --amount AMOUNT, or PATCH /v1/budgets/team-a)"
    )
    assert note.estimated_start == datetime(2025, 4, 1, tzinfo=UTC)
    # With jobs before it, it is told to wait for them too, and what fits beside them.
    placed, built, decisions = started(reserving_budget("team-a", amount="4.000000"))
    assert placed == ["a0"]
    assert pending_notes(decisions, built)["a1"].suggestion == (
        "wait for the team's running jobs to end, lower max_runtime_seconds to at most 2130 "
        "(what is left of the budget covers), or ask a team admin or an operator to raise "
        "the budget (trainyard budget set team-a --amount AMOUNT, or PATCH /v1/budgets/team-a)"
    )


def test_a_job_no_ready_node_can_hold_reserves_nothing_in_the_pass() -> None:
    # The first job asks for a flavor no ready node has (its nodes drained, lost, or
    # cordoned), or more GPUs of its flavor than all ready nodes hold: it cannot start in
    # this pass, nor in any until such nodes come. Before, it took the budget's room all the
    # same, and every later job of the team waited behind it, told to wait for the jobs
    # before it, for as long as those nodes were away.
    rates = {**RATES, "h100": {"gpu_hour": "2.5"}}
    for first, amount in (
        (hour_job("first", "qa", seq=0, team="team-a", project="vision", gpu_flavor="h100"), "3"),
        (hour_job("first", "qa", gpus=9, seq=0, team="team-a", project="vision"), "24"),  # 8 ready
    ):
        # Room for the first (2.50, or 9 x 2.50) or the second (2.50), not both.
        then = hour_job("then", "qa", seq=1, team="team-a", project="vision")
        placed, built, _ = started(
            reserving_budget("team-a", amount=amount, rates=rates), pending=[first, then]
        )
        assert placed == ["then"]
        assert built.unfit == {}
    # A cordoned node takes no new job: its GPUs do not count.
    cordoned = [{**node("n1"), "cordoned": True}, {**node("n2"), "cordoned": True}]
    only = hour_job("only", "qa", seq=0, team="team-a", project="vision")
    before = hour_job("before", "qa", seq=0, team="team-a", project="vision")
    _, built, _ = started(reserving_budget("team-a"), pending=[before, only], nodes=cordoned)
    assert built.unfit == {}
