"""A spent budget holds its team's (or project's) queued jobs: kept from the policy, told
why, released by a new month, a raised budget, or a policy that lets them run. One that
deprioritizes new jobs instead has its team's waiting jobs at priority low told so."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.unit.scheduler.test_convert import HALF_LIFE, NOW, queue, rows, waiting
from trainyard_platform.services.scheduler.budget_holds import (
    LOWERED_CLASS,
    hold_of,
    holding,
    holds_queued,
    lowering,
)
from trainyard_platform.services.scheduler.convert import (
    PendingNote,
    build_snapshot,
    lowered_note,
    note_changed,
    pending_notes,
)
from trainyard_platform.services.scheduler.policy.engine import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.submission.governance import DEPRIORITIZED_CLASS
from trainyard_platform.shared.waits import estimate_from


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


def lowered_rows(*budgets: dict[str, Any]) -> Any:
    """Team-a's jobs too large for their queue ever to start (8 GPUs; queue qa holds 4):
    ``a-low`` lowered by submission to the class a spent budget under ``deprioritize`` gives
    new jobs, ``a-normal`` queued at its own, ``a-nlp`` lowered to ``low`` in another project,
    ``a-asked-low`` at ``low`` because its user asked for it; and team-z's, at ``low``."""
    lowered = {"priority_class": "low", "lowered_from": "normal"}
    return rows(
        pending=[
            waiting("a-low", "qa", gpus=8, seq=1, **lowered, **TEAM_A),
            waiting("a-normal", "qa", gpus=8, seq=2, **TEAM_A),
            waiting("a-nlp", "qa", gpus=8, seq=3, **lowered, team="team-a", project="nlp"),
            waiting("a-asked-low", "qa", gpus=8, seq=5, priority_class="low", **TEAM_A),
            waiting("z-low", implicit_queue_z(), gpus=16, seq=4, **lowered, team="team-z"),
        ],
        budgets=list(budgets),
        queues=[queue("qa", "team-a", "c1"), queue(implicit_queue_z(), "team-z", implicit=True)],
    )


TEAM_A = {"team": "team-a", "project": "vision"}
LOWERED = (
    "deprioritized: the budget of team team-a is spent (101.500000 of 100.000000 USD spent in "
    "2025-03); jobs submitted until it is raised or the month ends (2025-04-01 00:00 UTC) run "
    "at priority low; "
)


def lowered_notes(*budgets: dict[str, Any], now: datetime = NOW) -> Any:
    built = build_snapshot(lowered_rows(*budgets), now, HALF_LIFE)
    decisions = schedule(built.snapshot, PolicyConfig())
    return decisions, pending_notes(decisions, built)


def test_a_job_at_low_while_its_budget_deprioritizes_says_so_and_nothing_else_changes() -> None:
    # Seen: a spent budget under ``deprioritize`` made submission admit the team's jobs at
    # priority low, said only in the answer to the submission; the job's explanation
    # (describe, ls, the job view, the dashboard, the queue) gave no reason for the class.
    plain, before = lowered_notes()
    decisions, notes = lowered_notes(budget("team-a", policy="deprioritize"))
    assert decisions == plain  # the scheduler decides as it did: only the words change
    low = notes["a-low"]
    assert low.reason == LOWERED + before["a-low"].reason
    assert low.reason.endswith(before["a-low"].reason)  # its estimate stays last
    assert (low.position, low.blocking, low.suggestion, low.estimated_start) == (
        before["a-low"].position,
        before["a-low"].blocking,
        before["a-low"].suggestion,
        before["a-low"].estimated_start,
    )
    assert notes["a-nlp"].reason.startswith(LOWERED)  # the team's budget covers its projects
    # Queued at its own class (before the budget ran out, or not lowered): nothing to say.
    assert notes["a-normal"] == before["a-normal"]
    # Its user asked for low: the budget did not lower it (job.submitted said no
    # lowered_from), so it is not told the budget did.
    assert notes["a-asked-low"] == before["a-asked-low"]
    assert notes["z-low"] == before["z-low"]  # another team's budget


def test_a_project_budget_that_deprioritizes_names_only_that_project() -> None:
    _, notes = lowered_notes(budget("team-a", "vision", policy="deprioritize"))
    assert notes["a-low"].reason.startswith(
        "deprioritized: the budget of project vision of team-a is spent ("
    )
    assert not notes["a-nlp"].reason.startswith("deprioritized:")


def test_the_reason_goes_when_the_budget_is_raised_or_the_month_ends() -> None:
    _, before = lowered_notes()
    _, spent = lowered_notes(budget("team-a", policy="deprioritize"))
    # Raised or deleted: billing's state is no longer exhausted, so ``load`` leaves it out.
    _, raised = lowered_notes()
    _, new_month = lowered_notes(
        budget("team-a", policy="deprioritize"), now=datetime(2025, 4, 1, tzinfo=UTC)
    )
    assert raised["a-low"] == before["a-low"]
    assert not new_month["a-low"].reason.startswith("deprioritized:")
    # Each change is news: the pass publishes it (``job.pending``) as it publishes any other.
    assert note_changed(before["a-low"], spent["a-low"], NOW)
    assert note_changed(spent["a-low"], raised["a-low"], NOW)


def test_a_budget_that_holds_or_only_warns_lowers_nothing() -> None:
    for state in (
        budget("team-a", policy="warn"),
        budget("team-a", policy="refuse"),
        budget("team-a", policy="deprioritize", on_exhausted="stop"),  # held instead
    ):
        _, notes = lowered_notes(state)
        assert not any(n.reason.startswith("deprioritized:") for n in notes.values())


def test_the_class_told_is_the_one_submission_gives() -> None:
    assert LOWERED_CLASS == DEPRIORITIZED_CLASS


def test_a_deprioritized_reason_keeps_its_estimate_last_for_readers_to_count_again() -> None:
    # Views rewrite a reason's closing estimate from the time they are read (shared.waits).
    start = NOW + timedelta(minutes=28)
    note = PendingNote("waiting for GPUs; expected start in ~28 min", 3, "a100", None, start)
    row = {"team": "team-a", "project": "vision", "priority_class": "low", "lowered_from": "x"}
    lowers = lowering([budget("team-a", policy="deprioritize")], NOW)
    told = lowered_note(note, row, lowers, NOW)
    assert told == replace(note, reason=LOWERED + note.reason)
    read = estimate_from(told.reason, start, NOW + timedelta(minutes=10))
    assert read == LOWERED + "waiting for GPUs; expected start in ~18 min"
    assert lowered_note(note, {**row, "priority_class": "normal"}, lowers, NOW) == note
    assert lowered_note(note, {**row, "lowered_from": None}, lowers, NOW) == note
