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
  (a state of an earlier month holds nothing, so a new month releases every hold without a
  word from billing; one of a later month, said by a billing whose clock is ahead at
  midnight, is in force: ``current``) and whose policy holds queued jobs (``holds_queued``).
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
- Reservations (``reserving``, ``reservation``, ``fit``): a budget that holds queued jobs
  once spent (``holds_queued``) and whose state carries billing's ``rates`` (the highest
  price per hour of each flavor from then on) is never left to be overrun by jobs started
  together before it is spent. Each job of its team (or project) is reserved its worst
  case, ``max_runtime_seconds`` and the runner's kill grace after it
  (``worst_case.attempt_seconds``: a job at its limit holds and is billed its GPUs until it
  is killed; no attempt is billed more, counted from its grant, ``worst_case.billed_until``)
  of its GPUs, CPUs and memory at those rates (``reservation``), from its start
  until its allocations end. ``fit(queued, running,
  reserves, order)`` keeps a queued job from the pass unless its reservation fits in what
  is left of every budget that reserves for it: the amount, less what billing last said is
  spent, less what its running jobs may still cost beyond that: a job whose allocations
  billing said ``spent`` counts (the state's ``accruing``, up to its ``spent_at``) is
  reserved its worst case from ``spent_at`` on (``max_runtime_seconds`` and the kill
  grace, less the whole seconds it had run by then since its start, ``started_at``, never
  below 0: what it
  accrued is not counted twice, and the rest costs at most the rates), any other (granted
  after, not started yet, or a state that does not say them) its whole worst case; less
  those of
  the queued jobs before it (by ``order``) that fit, and less what is kept for those before
  it that do not fit but have waited ``ageing_s`` since submission (with ``now``: each keeps
  its room from the jobs after it while what is spent leaves room for it, so none is starved
  by smaller later jobs). A job whose reservation does not fit
  waits (``reservation_note_parts`` says why) until one ends, the budget is raised, or the
  month ends; one whose reservation is more than the whole amount is told it cannot start
  until the budget is raised or its ``max_runtime_seconds`` lowered (and how far). A flavor without a rate (billing has no price for it) is reserved 0, as it
  is billed nothing until priced. A state of an earlier month reserves with nothing spent
  in the new one at its start: each running job is reserved its worst case from the
  month's start on.
- ``budget_note_parts(hold, now)``: what a held job is told (``convert.budget_note`` makes
  its ``job.pending``): reason, blocking, suggestion and estimated start: which budget, what
  is spent of it this month, and until when it is held (the start of the next UTC month,
  its estimated start, unless the budget is raised or deleted first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg

from trainyard_platform.shared import budget_states, worst_case
from trainyard_platform.shared.events.payloads import BudgetUpdated
from trainyard_platform.shared.worst_case import (
    Prices,
    attempt_seconds,
    longest_runtime_within,
    over_whole,
    over_whole_reason,
    over_whole_remedy,
    raise_budget,
    worst,
)
from trainyard_platform.shared.worst_case import holds_queued as holds_queued
from trainyard_platform.shared.worst_case import hourly as hourly
from trainyard_platform.shared.worst_case import reservation as reservation

Row = Mapping[str, Any]
Holds = Mapping[tuple[str, str], Row]
"""Budgets that hold now, by (team, project); project ``''``: the team's budget."""

HOLD_BLOCKING_PREFIX = "budget of "


def month_label(at: datetime) -> str:
    """``at``'s UTC month as billing names it (``YYYY-MM``)."""
    at = at.astimezone(UTC)
    return f"{at.year:04d}-{at.month:02d}"


def month_start(at: datetime) -> datetime:
    """The first instant of ``at``'s UTC month."""
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def next_month(at: datetime) -> datetime:
    """The first instant of the UTC month after ``at``'s."""
    at = at.astimezone(UTC)
    return datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)


def current(state: Row, month: str) -> bool:
    """Whether billing's ``state`` is of ``month`` (``now``'s) or later. Billing says a
    budget's state of its own current month, one row per budget: at midnight its clock may be
    in the next month while the scheduler's is not, and the state of the month before is
    replaced already, so a state of a later month is the one in force."""
    return bool(state["month"] >= month)


KEPT = ("rates", "spent_at", "accruing")
"""The optional fields of ``budget.updated`` a state is kept with besides
``budget_states.FIELDS`` (what reservations need)."""


async def apply_state(conn: asyncpg.Connection, state: BudgetUpdated) -> bool:
    """Keep ``state`` unless a newer one is kept already; True when the row changed."""
    return await budget_states.keep(conn, "budget_states", state, (*budget_states.FIELDS, *KEPT))


async def load(conn: asyncpg.Connection) -> Sequence[Row]:
    """The budget states that can hold jobs (any month, not deleted): exhausted, or carrying
    billing's ``rates`` (a budget that reserves)."""
    rows: Sequence[Row] = await conn.fetch(
        "SELECT team, project, month, amount, spent, currency, policy, on_exhausted, "
        "exhausted, rates, spent_at, accruing FROM budget_states "
        "WHERE NOT deleted AND (exhausted OR rates IS NOT NULL)"
    )
    return rows


def holding(rows: Iterable[Row], now: datetime) -> dict[tuple[str, str], Row]:
    """The budgets of ``rows`` that hold queued jobs at ``now`` (module contract)."""
    month = month_label(now)
    return {
        (r["team"], r["project"]): r
        for r in rows
        if current(r, month)
        and r.get("exhausted", True)
        and holds_queued(r["policy"], r["on_exhausted"])
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
        if current(r, month)
        and r.get("exhausted", True)
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
    suggestion = raise_budget(hold["team"], hold["project"])
    return reason, blocking, suggestion, until


ALL_RUNNING = "*"
"""``accruing`` of a state ``reserving`` made for a new month from one of an earlier month
(nothing spent at the month's start, ``spent_at``): every running job has accrued in
``spent`` what it cost from ``spent_at`` on, that is nothing."""

Reserves = Mapping[tuple[str, str], Row]
"""Budgets that reserve now (``reserving``), by (team, project)."""


def reserving(rows: Iterable[Row], now: datetime) -> dict[tuple[str, str], Row]:
    """The budgets of ``rows`` that reserve at ``now`` (module contract): holding queued
    jobs once spent, with billing's rates, and not spent in ``now``'s UTC month (a spent one
    holds its jobs whole, ``holding``). A state of an earlier month reserves too, with
    nothing spent yet in this one (a new month starts with the whole amount, less what the
    running jobs reserve), until billing says one of this month."""
    month = month_label(now)
    found: dict[tuple[str, str], Row] = {}
    for r in rows:
        if r.get("rates") is None or not holds_queued(r["policy"], r["on_exhausted"]):
            continue
        if current(r, month) and not r.get("exhausted", True):
            found[(r["team"], r["project"])] = r
        elif r["month"] < month:
            # Nothing of this month was spent at its start: a running job's cost in it is
            # at most its worst case from then on (``fit``), whatever billing counted.
            found[(r["team"], r["project"])] = {
                **r,
                "month": month,
                "spent": "0.000000",
                "spent_at": month_start(now),
                "accruing": ALL_RUNNING,
            }
    return found


def reserves_for(team: str, project: str | None, reserves: Reserves) -> list[Row]:
    """The budgets reserving for a job of ``team`` and ``project``: the team's, then the
    project's."""
    keys = [(team, ""), *([(team, project)] if project else [])]
    return [reserves[k] for k in keys if k in reserves]


@dataclass(frozen=True)
class Unfit:
    """Why a queued job waits for its budget: ``budget`` cannot take its reservation
    (``need``) beside what is spent and reserved (``reserved``: by running jobs and the
    queued jobs before it that fit, and the jobs kept for). ``per_hour``: what an hour of
    the job costs at most at the budget's rates (``hourly``). ``kept``: the part of
    ``reserved`` kept for ``kept_for`` jobs queued before it that waited ``ageing_s`` and do
    not fit either (``fit``: they start first)."""

    budget: Row
    need: Decimal
    reserved: Decimal
    per_hour: Decimal = Decimal(0)
    kept: Decimal = Decimal(0)
    kept_for: int = 0
    ageing_s: float = 0.0


@dataclass(frozen=True)
class _Parsed:
    """A reserving budget's decimal strings, parsed once a pass (``fit``)."""

    amount: Decimal
    spent: Decimal
    prices: Mapping[str, Prices]
    """Per flavor with a rate (a falsy rate is none: reserved 0, as ``hourly`` says)."""
    spent_at: datetime | None = None
    """When ``spent`` was measured; None when the state does not say it together with the
    allocations it counts (each running job is then reserved whole)."""
    accruing: frozenset[str] | str = frozenset()
    """The running allocations whose cost up to ``spent_at`` is in ``spent`` (or
    ``ALL_RUNNING``)."""

    @classmethod
    def of(cls, budget: Row) -> _Parsed:
        rates: Mapping[str, Any] = budget["rates"]
        spent_at, accruing = budget.get("spent_at"), budget.get("accruing")
        return cls(
            worst_case.decimal(budget["amount"]),
            worst_case.decimal(budget["spent"]),
            {flavor: worst_case.prices(rate) for flavor, rate in rates.items() if rate},
            spent_at if isinstance(spent_at, datetime) and accruing is not None else None,
            accruing if accruing == ALL_RUNNING else frozenset(accruing or ()),
        )

    def running(self, members: Sequence[Row]) -> Decimal:
        """What a running job (its live allocations, ``members``) is reserved: its worst
        case from when ``spent`` was measured on, when ``spent`` counts what each of its
        allocations accrued up to then and each had started (a whole second it ran before,
        from its start, taken off its ``max_runtime_seconds`` and the kill grace, never below
        0: what it may still cost, at prices no higher than the rates); else its whole worst case.

        Counted from the start (``started_at``), not the grant: the runner's limit runs
        from the grant, but the platform's own waits before the start move it
        (``services.runner.deadline``), so a member not started yet may still run all of
        it. What it is billed is counted from the grant and ends by the grant plus its
        worst case (``worst_case.billed_until``), so what this leaves it is never less
        than what it may still be billed (more, by its preparation). A start said before
        its grant (a node's clock) counts from the grant."""
        first = members[0]
        seconds = attempt_seconds(first["max_runtime_seconds"])
        starts = [m.get("started_at") for m in members]
        if (
            self.spent_at is not None
            and all(s is not None for s in starts)
            and (
                self.accruing == ALL_RUNNING
                or all(str(m["allocation_id"]) in self.accruing for m in members)  # a UUID
            )
        ):
            # From the latest start of its gang: the longest it may still run.
            began = max(max(s, m["granted_at"]) for s, m in zip(starts, members, strict=True))
            ran = (self.spent_at - began).total_seconds()
            seconds = max(0, seconds - max(0, int(ran)))
        return worst(self.hourly(first), seconds)

    def hourly(self, job: Row) -> Decimal:
        """``hourly(job, rates)`` from the parsed prices."""
        prices = self.prices.get(job["gpu_flavor"])
        return Decimal(0) if prices is None else worst_case.hourly_at(job, prices)


def fit(
    queued: Iterable[Row],
    running: Mapping[str, Sequence[Row]],
    reserves: Reserves,
    now: datetime | None = None,
    ageing_s: float | None = None,
) -> dict[str, Unfit]:
    """The queued jobs (in the order given: the order they would start in) that must wait
    because a budget cannot take their reservation, by job id (module contract). Each
    budget's amount, spent and rates are parsed once a pass, not once per job.

    With ``now`` and ``ageing_s``: a job that does not fit and was submitted ``ageing_s``
    or more before ``now`` keeps its room, so the jobs after it in the order cannot take
    what it needs: its reservation counts against each of its budgets as if it had started,
    as long as what is spent and what the aged jobs before it keep leave room for it in each
    (one that could start only after a raise or in the next month keeps nothing, and no
    job whose worst case is more than the whole amount ever does). So once it has aged, the
    room the running jobs free as they end is kept for it, not taken by smaller later jobs
    of its budget. Which jobs come after it is ``queued``'s order: the pass orders them as
    the policy orders a queue (``fairshare.queue_key``, without the size term), so a job of
    a higher class submitted later comes before it only until it has waited one
    ``ageing_s`` longer per class level between them, and a stream of such jobs cannot keep
    it waiting for ever."""
    if not reserves:
        return {}
    parsed = {key: _Parsed.of(budget) for key, budget in reserves.items()}
    reserved = {key: Decimal(0) for key in reserves}
    kept = {key: Decimal(0) for key in reserves}
    kept_for = dict.fromkeys(reserves, 0)
    aged_before = None if now is None or ageing_s is None else now - timedelta(seconds=ageing_s)

    def keys_of(job: Row) -> list[tuple[str, str]]:
        team, project = job.get("team", ""), job.get("project")
        keys = [(team, ""), *([(team, project)] if project else [])]
        return [k for k in keys if k in reserves]

    for members in running.values():
        for key in keys_of(members[0]):
            reserved[key] += parsed[key].running(members)
    unfit: dict[str, Unfit] = {}
    for job in queued:
        needs = []
        for key in keys_of(job):
            per_hour = parsed[key].hourly(job)
            needs.append(
                (key, per_hour, worst(per_hour, attempt_seconds(job["max_runtime_seconds"])))
            )
        short = next(
            (
                (key, per_hour, need)
                for key, per_hour, need in needs
                if parsed[key].spent + reserved[key] + need > parsed[key].amount
            ),
            None,
        )
        if short is not None:
            key, per_hour, need = short
            unfit[job["job_id"]] = Unfit(
                reserves[key],
                need,
                reserved[key],
                per_hour,
                kept[key],
                kept_for[key],
                ageing_s or 0.0,
            )
            aged = aged_before is not None and job["submitted_at"] <= aged_before
            if aged and all(parsed[k].spent + kept[k] + n <= parsed[k].amount for k, _, n in needs):
                for k, _, n in needs:
                    reserved[k] += n
                    kept[k] += n
                    kept_for[k] += 1
            continue
        for key, _, need in needs:
            reserved[key] += need
    return unfit


def reservation_note_parts(unfit: Unfit, now: datetime) -> tuple[str, str, str, datetime | None]:
    """Reason, blocking, suggestion and estimated start of a job waiting for ``unfit``'s
    budget to have room for its reservation. A job whose worst case is more than the whole
    amount is told it cannot start while the budget is that size, the longest
    ``max_runtime_seconds`` the budget covers, and the amount that would cover it; it has
    no estimated start. Another is told what lets it start: the jobs before it ending (only
    when they reserve something), a raise, the month's end, or the longest
    ``max_runtime_seconds`` that fits in what is left now."""
    budget = unfit.budget
    until = next_month(now)
    currency = budget["currency"]
    blocking = f"{HOLD_BLOCKING_PREFIX}{scope(budget)}"
    amount = worst_case.decimal(budget["amount"])
    over = over_whole(unfit.need, unfit.per_hour, amount)
    if over is not None:  # said as submission says it when it refuses such a job
        reason = (
            f"held: {over_whole_reason(over, scope(budget), budget['amount'], currency)}: it "
            "cannot start while the budget is this size"
        )
        remedy = over_whole_remedy(over, currency, budget["team"], budget["project"])
        return reason, blocking, remedy, None
    if unfit.kept:
        # Jobs before it that waited their ageing keep their room: it waits for them to
        # start (and for room beside them), not only for running jobs to end.
        jobs = "1 job" if unfit.kept_for == 1 else f"{unfit.kept_for} jobs"
        has = "has" if unfit.kept_for == 1 else "have"
        starts = "starts" if unfit.kept_for == 1 else "start"
        reserved = (
            f"{unfit.reserved:.6f} {currency} is reserved by jobs before it, "
            f"{unfit.kept:.6f} {currency} of it kept for {jobs} queued before it that {has} "
            f"waited over {_span(unfit.ageing_s)} and {starts} first"
        )
        when = (
            "the jobs before it have started and left room, one of them ends, the budget is "
            "raised or the month ends"
        )
    elif unfit.reserved:
        reserved = f"{unfit.reserved:.6f} {currency} is reserved by jobs before it"
        when = "one of them ends, the budget is raised or the month ends"
    else:  # no job ending frees room: only a raise or the month's end
        reserved = "nothing is reserved by other jobs"
        when = "the budget is raised or the month ends"
    reason = (
        f"held: the budget of {scope(budget)} cannot cover this job's worst case "
        f"({unfit.need} {currency}: its GPUs, CPUs and memory for its max_runtime_seconds "
        f"and the {worst_case.KILL_GRACE_SECONDS} s kill grace at the highest prices); {budget['spent']} of {budget['amount']} {currency} is spent "
        f"in {budget['month']} and {reserved}; it starts when {when} "
        f"({until:%Y-%m-%d} 00:00 UTC)"
    )
    left = amount - worst_case.decimal(budget["spent"]) - unfit.reserved
    longest = longest_runtime_within(unfit.per_hour, left) if unfit.per_hour > 0 else 0
    ways = [
        *(
            ["wait for the jobs before it"]
            if unfit.kept
            else ["wait for the team's running jobs to end"]
            if unfit.reserved
            else []
        ),
        *(
            [f"lower max_runtime_seconds to at most {longest} (what is left of the budget covers)"]
            if longest > 0
            else []
        ),
        raise_budget(budget["team"], budget["project"]),
    ]
    suggestion = ", or ".join([", ".join(ways[:-1]), ways[-1]]) if len(ways) > 1 else ways[0]
    return reason, blocking, suggestion, until


def _span(seconds: float) -> str:
    """A whole number of hours, minutes or seconds, as an operator set ``ageing_seconds``."""
    whole = round(seconds)
    if whole and whole % 3600 == 0:
        return f"{whole // 3600} h"
    if whole and whole % 60 == 0:
        return f"{whole // 60} min"
    return f"{seconds:g} s"
