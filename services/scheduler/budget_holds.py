"""Budgets that hold queued jobs: billing's budget states, kept from its events, and the
rule a pass applies to them.

Contract:
- ``apply_state(conn, state)`` keeps a ``budget.updated`` (billing's, the owner of budget
  state) in ``budget_states``, one row per team and project (``''`` for the team's own
  budget), unless the row already holds that revision or a higher one: redelivery and
  reordering never bring back an older state (``shared.budget_states.keep``, as
  submission's replica). It says whether the row changed (a pass must then look again: a
  hold may begin or end).
- ``load(conn)``: the rows a hold can come from (exhausted, not deleted); ``holding(rows,
  now)`` keeps those that hold now, by (team, project): exhausted in ``now``'s UTC month
  (a state of another month holds nothing, so a new month releases every hold without a
  word from billing) and whose policy holds queued jobs (``holds_queued``).
- ``holds_queued(policy, on_exhausted)``: a spent budget holds its queued jobs when its
  admission policy is ``refuse`` (no new spending is admitted: jobs queued before it ran
  out are not started either) or when its running jobs are stopped (``on_exhausted``
  ``stop``: a stopped job goes back to its queue and must not be placed again). Under
  ``deprioritize`` or ``warn`` the queued jobs run as admitted.
- ``hold_of(team, project, holds)``: the budget that holds a job of ``team`` and
  ``project``: the team's budget before the project's; None when neither holds.
- ``stops(running, holds, leaving)``: the running jobs to stop now, each with the reason
  it is told: those of a team (or project) whose holding budget says ``on_exhausted``
  ``stop``, unless already leaving (under a notice, being cancelled, or in ``leaving``: a
  victim of the same pass). The reason starts with ``budget_exhausted:``; the job is given
  a preemption notice (checkpoint and stop within the preemption grace), so its attempt
  ends ``preempted``, not failed, and it goes back to its queue, where the budget holds it.
- ``lowering(rows, now)`` keeps the rows of ``load`` that lower new jobs now, by (team,
  project): exhausted in ``now``'s UTC month under policy ``deprioritize`` without holding
  queued jobs (``on_exhausted`` ``finish``). Submission admits a job of such a budget's team
  (or project) at priority ``LOWERED_CLASS``; the scheduler changes no job's class, but
  ``lowered_by(team, project, priority, lowered_from, lowers)`` names the budget (the
  team's before the project's) when a waiting job submission lowered (its ``job.submitted``
  said ``lowered_from``, kept in ``jobs.lowered_from``) is of that class while its budget
  lowers, and ``lowered_part(budget, now)`` is what its explanation then starts with: which
  budget, what is spent of it, and until when jobs are submitted at ``low`` (it is raised,
  or the next UTC month). A job its user asked ``low`` for is told nothing of the budget,
  nor is one queued before the scheduler kept ``lowered_from`` (nothing says it was
  lowered).
- ``budget_note_parts(hold, now)``: what a held job is told (``convert.budget_note`` makes
  its ``job.pending``): reason, blocking, suggestion and estimated start: which budget, what
  is spent of it this month, and until when it is held (the start of the next UTC month,
  its estimated start, unless the budget is raised or deleted first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from trainyard_platform.shared import budget_states
from trainyard_platform.shared.events.payloads import BudgetUpdated

Row = Mapping[str, Any]
Holds = Mapping[tuple[str, str], Row]
"""Budgets that hold now, by (team, project); project ``''``: the team's budget."""

HOLD_BLOCKING_PREFIX = "budget of "


def month_label(at: datetime) -> str:
    """``at``'s UTC month as billing names it (``YYYY-MM``)."""
    at = at.astimezone(UTC)
    return f"{at.year:04d}-{at.month:02d}"


def next_month(at: datetime) -> datetime:
    """The first instant of the UTC month after ``at``'s."""
    at = at.astimezone(UTC)
    return datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)


def holds_queued(policy: str, on_exhausted: str) -> bool:
    """Whether a spent budget with this policy holds its queued jobs (module contract)."""
    return policy == "refuse" or on_exhausted == "stop"


async def apply_state(conn: asyncpg.Connection, state: BudgetUpdated) -> bool:
    """Keep ``state`` unless a newer one is kept already; True when the row changed."""
    return await budget_states.keep(conn, "budget_states", state)


async def load(conn: asyncpg.Connection) -> Sequence[Row]:
    """The budget states that can hold jobs: exhausted and not deleted (any month)."""
    rows: Sequence[Row] = await conn.fetch(
        "SELECT team, project, month, amount, spent, currency, policy, on_exhausted "
        "FROM budget_states WHERE exhausted AND NOT deleted"
    )
    return rows


def holding(rows: Iterable[Row], now: datetime) -> dict[tuple[str, str], Row]:
    """The budgets of ``rows`` that hold queued jobs at ``now`` (module contract)."""
    month = month_label(now)
    return {
        (r["team"], r["project"]): r
        for r in rows
        if r["month"] == month and holds_queued(r["policy"], r["on_exhausted"])
    }


def hold_of(team: str, project: str | None, holds: Holds) -> Row | None:
    """The budget holding a job of ``team`` and ``project``, or None (module contract)."""
    if not holds:
        return None
    return holds.get((team, "")) or (holds.get((team, project)) if project else None)


LOWERED_CLASS = "low"
"""The priority class submission admits a job at while its budget is spent under
``deprioritize`` (submission's ``governance.DEPRIORITIZED_CLASS``; the services share no
code, a test keeps the two equal)."""
LOWERED_PREFIX = "deprioritized: "
"""How the explanation of a waiting job at ``LOWERED_CLASS`` starts while its budget lowers."""


def lowering(rows: Iterable[Row], now: datetime) -> dict[tuple[str, str], Row]:
    """The budgets of ``rows`` that lower new jobs at ``now`` (module contract)."""
    month = month_label(now)
    return {
        (r["team"], r["project"]): r
        for r in rows
        if r["month"] == month
        and r["policy"] == "deprioritize"
        and not holds_queued(r["policy"], r["on_exhausted"])
    }


def lowered_by(
    team: str, project: str | None, priority: str, lowered_from: str | None, lowers: Holds
) -> Row | None:
    """The budget lowering new jobs of ``team`` and ``project`` when the job was lowered
    (``lowered_from``: the class it asked for) and ``priority`` is still the class it was
    given, or None (module contract)."""
    if priority != LOWERED_CLASS or lowered_from is None:
        return None
    return hold_of(team, project, lowers)


def lowered_part(budget: Row, now: datetime) -> str:
    """What a waiting job at ``LOWERED_CLASS`` is told first while ``budget`` lowers."""
    until = next_month(now)
    spent = (
        f"{budget['spent']} of {budget['amount']} {budget['currency']} spent in {budget['month']}"
    )
    return (
        f"{LOWERED_PREFIX}the budget of {scope(budget)} is spent ({spent}); jobs submitted "
        f"until it is raised or the month ends ({until:%Y-%m-%d} 00:00 UTC) run at priority "
        f"{LOWERED_CLASS}"
    )


STOP_PREFIX = "budget_exhausted: "
"""How the reason of a job stopped by its budget starts (its preemption's detail)."""


def stop_of(team: str, project: str | None, holds: Holds) -> Row | None:
    """The holding budget of a job of ``team`` and ``project`` that stops running jobs (the
    team's before the project's), or None."""
    for key in [(team, ""), *([(team, project)] if project else [])]:
        hold = holds.get(key)
        if hold is not None and hold["on_exhausted"] == "stop":
            return hold
    return None


def stops(
    running: Mapping[str, Sequence[Row]], holds: Holds, leaving: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """(job id, reason) of each running job a budget stops now (module contract), by id."""
    if not holds:
        return []
    skip = set(leaving)
    found = []
    for job_id, members in sorted(running.items()):
        first = members[0]
        if job_id in skip or first["job_status"] == "CANCELLING":
            continue
        if any(m["notice_at"] is not None for m in members):
            continue
        hold = stop_of(first.get("team", ""), first.get("project"), holds)
        if hold is not None:
            spent = (
                f"{hold['spent']} of {hold['amount']} {hold['currency']} spent in {hold['month']}"
            )
            found.append(
                (
                    job_id,
                    f"{STOP_PREFIX}the budget of {scope(hold)} is spent ({spent}); stopped "
                    "with a checkpoint, it waits queued until the budget is raised or the "
                    "month ends",
                )
            )
    return found


def scope(hold: Row) -> str:
    """The budget in words, as submission names it when it refuses a job."""
    team, project = hold["team"], hold["project"]
    return f"project {project} of {team}" if project else f"team {team}"


def budget_note_parts(hold: Row, now: datetime) -> tuple[str, str, str, datetime]:
    """Reason, blocking, suggestion and estimated start of a job ``hold`` holds."""
    until = next_month(now)
    spent = f"{hold['spent']} of {hold['amount']} {hold['currency']} spent in {hold['month']}"
    reason = (
        f"held: the budget of {scope(hold)} is spent ({spent}); queued jobs do not start "
        f"until it is raised or the month ends ({until:%Y-%m-%d} 00:00 UTC)"
    )
    blocking = f"{HOLD_BLOCKING_PREFIX}{scope(hold)}"
    suggestion = "ask a team admin or an operator to raise the budget (PUT /v1/budgets)"
    return reason, blocking, suggestion, until
