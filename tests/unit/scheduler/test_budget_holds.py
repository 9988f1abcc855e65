"""A spent budget holds its team's (or project's) queued jobs: kept from the policy, told
why, released by a new month, a raised budget, or a policy that lets them run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.unit.scheduler.test_convert import HALF_LIFE, NOW, queue, rows, waiting
from trainyard_platform.services.scheduler.budget_holds import hold_of, holding, holds_queued
from trainyard_platform.services.scheduler.convert import build_snapshot, pending_notes
from trainyard_platform.services.scheduler.policy.engine import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig


def budget(team: str, project: str = "", **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "team": team,
        "project": project,
        "month": "2025-03",
        "amount": "100.000000",
        "spent": "101.500000",
        "currency": "USD",
        "policy": "refuse",
        "on_exhausted": "finish",
    }
    return {**row, **more}


def jobs() -> list[dict[str, Any]]:
    return [
        waiting("a1", "qa", seq=1, team="team-a", project="vision"),
        waiting("a2", "qa", seq=2, team="team-a", project="nlp"),
        waiting("z1", implicit_queue_z(), seq=3, team="team-z", project="default"),
    ]


def implicit_queue_z() -> str:
    return "default:team-z"


def snapshot_rows(*budgets: dict[str, Any]) -> Any:
    return rows(
        pending=jobs(),
        budgets=list(budgets),
        queues=[queue("qa", "team-a", "c1"), queue(implicit_queue_z(), "team-z", implicit=True)],
    )


def test_a_spent_team_budget_holds_every_queued_job_of_the_team_and_says_why() -> None:
    built = build_snapshot(snapshot_rows(budget("team-a")), NOW, HALF_LIFE)
    assert [j.job_id for j in built.snapshot.pending] == ["z1"]  # the policy never sees them
    assert [r["job_id"] for r in built.budget_held] == ["a1", "a2"]
    decisions = schedule(built.snapshot, PolicyConfig())
    assert [p.job_id for p in decisions.placements] == ["z1"]
    notes = pending_notes(decisions, built)
    held = notes["a1"]
    assert held.reason == (
        "held: the budget of team team-a is spent (101.500000 of 100.000000 USD spent in "
        "2025-03); queued jobs do not start until it is raised or the month ends "
        "(2025-04-01 00:00 UTC)"
    )
    assert held.blocking == "budget of team team-a"
    assert held.suggestion is not None and "raise the budget" in held.suggestion
    assert held.estimated_start == datetime(2025, 4, 1, tzinfo=UTC)
    assert (notes["a1"].position, notes["a2"].position) == (1, 2)


def test_a_spent_project_budget_holds_only_that_project() -> None:
    built = build_snapshot(snapshot_rows(budget("team-a", "vision")), NOW, HALF_LIFE)
    assert [r["job_id"] for r in built.budget_held] == ["a1"]
    assert {j.job_id for j in built.snapshot.pending} == {"a2", "z1"}
    note = pending_notes(schedule(built.snapshot, PolicyConfig()), built)["a1"]
    assert note.reason.startswith("held: the budget of project vision of team-a is spent")


def test_a_new_month_releases_the_hold() -> None:
    next_month = datetime(2025, 4, 1, tzinfo=UTC)
    built = build_snapshot(snapshot_rows(budget("team-a")), next_month, HALF_LIFE)
    assert built.budget_held == ()
    assert {j.job_id for j in built.snapshot.pending} == {"a1", "a2", "z1"}
    # The last instant of the month still holds.
    before = build_snapshot(
        snapshot_rows(budget("team-a")), next_month - timedelta(microseconds=1), HALF_LIFE
    )
    assert [r["job_id"] for r in before.budget_held] == ["a1", "a2"]


def test_only_policies_that_hold_queued_jobs_hold_them() -> None:
    assert holds_queued("refuse", "finish")
    assert holds_queued("warn", "stop") and holds_queued("deprioritize", "stop")
    assert not holds_queued("warn", "finish") and not holds_queued("deprioritize", "finish")
    for policy in ("warn", "deprioritize"):
        built = build_snapshot(snapshot_rows(budget("team-a", policy=policy)), NOW, HALF_LIFE)
        assert built.budget_held == ()


def test_the_team_s_budget_names_the_hold_before_the_project_s() -> None:
    holds = holding([budget("team-a", "vision"), budget("team-a")], NOW)
    hold = hold_of("team-a", "vision", holds)
    assert hold is not None and hold["project"] == ""
    assert hold_of("team-b", "vision", holds) is None
    assert hold_of("team-a", None, holding([budget("team-a", "vision")], NOW)) is None


def test_a_budget_that_stops_names_its_running_jobs_once_each() -> None:
    from trainyard_platform.services.scheduler.budget_holds import stops

    def running(job_id: str, team: str, project: str, **more: Any) -> list[dict[str, Any]]:
        row = {"team": team, "project": project, "job_status": "RUNNING", "notice_at": None}
        return [{**row, **more}]

    holds = holding(
        [budget("team-a", on_exhausted="stop", policy="warn"), budget("team-b", "nlp")], NOW
    )
    jobs = {
        "a-run": running("a-run", "team-a", "vision"),
        "a-leaving": running("a-leaving", "team-a", "vision", notice_at=NOW),
        "a-cancel": running("a-cancel", "team-a", "vision", job_status="CANCELLING"),
        "a-victim": running("a-victim", "team-a", "vision"),
        "b-run": running("b-run", "team-b", "nlp"),  # finish: runs on
        "c-run": running("c-run", "team-c", "x"),
    }
    (stopped,) = stops(jobs, holds, leaving=["a-victim"])
    assert stopped[0] == "a-run"
    assert stopped[1].startswith("budget_exhausted: the budget of team team-a is spent (")
    assert stops(jobs, holding([budget("team-a", on_exhausted="stop")], next_month()), ()) == []


def next_month() -> datetime:
    return datetime(2025, 4, 1, tzinfo=UTC)
