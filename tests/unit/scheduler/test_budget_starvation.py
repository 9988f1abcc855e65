"""A large queued job of a budget that reserves does not wait for ever behind smaller later
jobs of the same budget: once it has waited the policy's ``ageing_s`` (since submission),
the jobs after it in the start order reserve behind it, so what the budget's running jobs
free when they end is kept for it, not taken by the next small job."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tests.unit.scheduler.test_budget_holds import implicit_queue_z
from tests.unit.scheduler.test_budget_reservations import HOUR, hour_job, reserving_budget
from tests.unit.scheduler.test_convert import HALF_LIFE, NOW, member, queue, rows
from trainyard_platform.services.scheduler.convert import build_snapshot, pending_notes
from trainyard_platform.services.scheduler.policy.engine import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig

TEAM = {"team": "team-a", "project": "vision"}


def small(i: int, at: datetime) -> dict[str, Any]:
    """1 GPU for an hour: 2.50 at worst."""
    return hour_job(f"s{i}", "qa", seq=10 + i, submitted_at=at, **TEAM)


def running(job_id: str, granted_at: datetime) -> dict[str, Any]:
    return member(
        job_id,
        "n2",
        [0],
        gpus=1,
        queue="qa",
        priority_class="normal",
        max_runtime_seconds=HOUR,
        granted_at=granted_at,
        **TEAM,
    )


def simulate(passes: int) -> tuple[list[list[str]], Any]:
    """A pass every 30 minutes; a small job arrives before each and runs an hour. The large
    job (4 GPUs for an hour: 10.00 at worst, the whole budget) was queued first."""
    big = hour_job("big", "qa", gpus=4, seq=1, submitted_at=NOW - timedelta(minutes=10), **TEAM)
    pending = [big]
    on = [("s0", NOW - timedelta(minutes=30))]  # a small job of the team already running
    started: list[list[str]] = []
    last = None
    for k in range(passes):
        now = NOW + timedelta(minutes=30 * k)
        on = [(j, at) for j, at in on if at + timedelta(hours=1) > now]  # the hour is up
        pending.append(small(k + 1, now - timedelta(minutes=1)))
        snapshot_rows = rows(
            budgets=[reserving_budget("team-a", amount="10.000000")],
            queues=[queue("qa", "team-a", "c1"), queue(implicit_queue_z(), "team-z", True)],
            pending=pending,
            running=[running(j, at) for j, at in on],
        )
        built = build_snapshot(snapshot_rows, now, HALF_LIFE)
        decisions = schedule(built.snapshot, PolicyConfig())
        placed = sorted(p.job_id for p in decisions.placements)
        started.append(placed)
        pending = [j for j in pending if j["job_id"] not in placed]
        on += [(j, now) for j in placed]
        last = (built, decisions)
    return started, last


def test_a_large_job_starts_once_it_has_waited_the_ageing_time() -> None:
    # Before, a small job started every pass beside the one still running (5.00 of 10.00
    # reserved), and the large job, needing all 10.00, never found the budget free.
    started, _ = simulate(8)
    assert ["big"] in started
    # Aged at the third pass (70 min): no small job starts past it then, and when the
    # running one's hour is up, it starts.
    assert started[:4] == [["s1"], ["s2"], [], ["big"]]


def test_before_its_ageing_later_jobs_that_fit_start_past_it() -> None:
    started, (built, _) = simulate(2)
    assert started == [["s1"], ["s2"]]
    assert "big" in built.unfit


def test_jobs_behind_an_aged_job_are_told_what_they_wait_for() -> None:
    started, (built, decisions) = simulate(3)
    # Pass 2 (70 min after the large job came): it keeps its room; s3 waits behind it.
    assert started[2] == []
    notes = pending_notes(decisions, built)
    assert notes["s3"].reason == (
        "held: the budget of team team-a cannot cover this job's worst case (2.500000 USD: "
        "its GPUs, CPUs and memory for its max_runtime_seconds and the 30 s kill grace at the "
        "highest prices); "
        "0.000000 of 10.000000 USD is spent in 2025-03 and 12.500000 USD is reserved by jobs "
        "before it, 10.000000 USD of it kept for 1 job queued before it that has waited over "
        "1 h and starts first; it starts when the jobs before it have started and left room, "
        "one of them ends, the budget is raised or the month ends (2025-04-01 00:00 UTC)"
    )
    assert notes["s3"].suggestion == (
        "wait for the jobs before it, or ask a team admin or an operator to raise the budget "
        "(trainyard budget set team-a --amount AMOUNT, or PATCH /v1/budgets/team-a)"
    )
    # The large job itself is told what it waits for: the running job's end.
    assert "is reserved by jobs before it" in notes["big"].reason
    assert "kept for" not in notes["big"].reason


def simulate_high_stream(passes: int) -> list[list[str]]:
    """As ``simulate``, but the small job arriving before each pass is of class ``high``,
    two levels above the large ``normal`` job: the start order of its budget puts each
    before the large job until the large one has waited an ageing (1 h) longer than it."""
    big = hour_job("big", "qa", gpus=4, seq=1, submitted_at=NOW - timedelta(minutes=10), **TEAM)
    big["priority_class"] = "normal"
    pending = [big]
    on = [("s0", NOW - timedelta(minutes=30))]
    started: list[list[str]] = []
    for k in range(passes):
        now = NOW + timedelta(minutes=30 * k)
        on = [(j, at) for j, at in on if at + timedelta(hours=1) > now]
        pending.append({**small(k + 1, now - timedelta(minutes=1)), "priority_class": "high"})
        snapshot_rows = rows(
            budgets=[reserving_budget("team-a", amount="10.000000")],
            queues=[queue("qa", "team-a", "c1"), queue(implicit_queue_z(), "team-z", True)],
            pending=pending,
            running=[running(j, at) for j, at in on],
        )
        built = build_snapshot(snapshot_rows, now, HALF_LIFE)
        placed = sorted(p.job_id for p in schedule(built.snapshot, PolicyConfig()).placements)
        started.append(placed)
        pending = [j for j in pending if j["job_id"] not in placed]
        on += [(j, now) for j in placed]
    return started


def test_a_stream_of_later_higher_class_jobs_does_not_starve_a_large_job() -> None:
    # Before, the budget's start order was class, then arrival: every new high job went
    # before the large normal one, fit beside the one still running (5.00 of 10.00), and
    # the large job, needing all 10.00, never found the budget free however long it waited.
    started = simulate_high_stream(8)
    assert ["big"] in started
    # A high job submitted over an hour after it (the third, at 59 min) goes after it in
    # the order; it has waited its ageing by then and keeps its room, so the third waits,
    # and the large job starts once the second's hour is up.
    assert started[:4] == [["s1"], ["s2"], [], ["big"]]
