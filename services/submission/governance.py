"""What submission learns from other services and enforces at submission: the flavor
catalogue (the scheduler's) and budget states (billing's), kept as replicas from events.

Contract:
- ``dispatch_with_governance(dispatch)`` is the consumer's handler: ``flavor.declared``,
  ``flavor.retired`` and ``budget.updated`` go to the replicas (``budget.threshold_crossed``
  is logged) (``flavor_replica``,
  ``budget_replica``), anything else to ``dispatch``. Each replica row keeps the highest
  revision it saw: redelivery and reordering never bring back an older state (the budget
  replica through ``shared.budget_states.keep``, as the scheduler's: a state whose ``rates``
  were unreadable is kept with the rates the row had).
- ``known_flavors(pool, bootstrap)``: the flavors a job may ask for: the bootstrap list
  (the ``flavors`` setting, so a fresh install works before any operator declares one) and
  every flavor the scheduler declared, less those it retired since.
- ``admit(pool, team, job, now)``: the job as admitted, and the warnings to give, by the
  budgets of its team and of its project. A budget counts when its state is for the current
  UTC month, it is not deleted, and it is exhausted (spent >= amount). Its policy: ``refuse``
  raises ``Conflict`` (409) naming the budget; ``deprioritize`` makes the job's priority
  class ``low`` (``DEPRIORITIZED_CLASS``), with a warning; ``warn`` admits it with a
  warning. The state is billing's as last said: a bill billing has not said yet is not in it.
  After a spent ``refuse`` budget's 409 (it refuses any job, however the job is changed),
  and before the others, whatever is spent and of any month: a budget that reserves each job's worst
  case (``shared.worst_case.reserves``: policy ``refuse`` or ``on_exhausted`` ``stop``, with
  billing's ``rates``; not deleted) refuses a job whose worst case alone is more than its
  whole amount, which the scheduler would hold for ever (``RequestInvalid``, 422 naming
  ``max_runtime_seconds``, or ``gpus`` when not a second of the job fits: the budget, the
  worst case, the longest ``max_runtime_seconds`` the budget covers and the amount that
  would cover it, ``shared.worst_case.over_whole``, as the scheduler's note says it). The
  replica keeps ``on_exhausted`` and ``rates`` (``REPLICA_FIELDS``); a budget raised later
  admits the same job when billing's state says it.
  Also returned: ``Lowered`` when ``deprioritize`` changed the class (the class asked for,
  and why), None otherwise (a job asked ``low`` for is not lowered), which is recorded with
  the job (its first history entry, ``lowered_reason``) and said in its ``job.submitted``.
- ``screening(pool, bootstrap, team, now)``: both of the above read in one query (the
  submission path): ``.flavors`` is ``known_flavors``, ``.admit(job)`` is ``admit``.
  ``screening_columns``/``screening_of`` let another query read it too (the API's token
  check on ``POST /v1/jobs`` does: one round trip for both).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from trainyard_platform.services.submission.errors import Conflict
from trainyard_platform.services.submission.schemas import JobRequest
from trainyard_platform.shared import budget_states, worst_case
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    BudgetThresholdCrossed,
    BudgetUpdated,
    FlavorDeclared,
    FlavorRetired,
)
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid
from trainyard_platform.shared.inbox import TransactionalHandler

CONSUMED: tuple[type[Payload], ...] = (
    FlavorDeclared,
    FlavorRetired,
    BudgetUpdated,
    BudgetThresholdCrossed,
)
BUDGET_WARNING_HEADER = "Trainyard-Budget-Warning"
"""The header of a ``201`` that admitted a job past a spent budget (``warn``,
``deprioritize``), saying why."""
log = logging.getLogger(__name__)
DEPRIORITIZED_CLASS = "low"
"""The priority class a job gets when its budget is spent under ``deprioritize``."""


@dataclass(frozen=True)
class Lowered:
    """A job whose priority class a spent budget lowered at admission (``deprioritize``)."""

    from_class: str
    """The class the job asked for."""
    budget: str
    """Which budget, and what is spent of it: "the budget of team vision is spent (100 of
    90 USD spent in 2026-12)"."""


def lowered_reason(lowered: Lowered | None) -> str:
    """The reason of a job's first history entry: ``submitted``, and for a job a budget
    lowered, from what class and why (kept once the budget is raised or the month ends)."""
    if lowered is None:
        return "submitted"
    return (
        f"submitted; priority lowered from {lowered.from_class} to {DEPRIORITIZED_CLASS}: "
        f"{lowered.budget} (policy deprioritize)"
    )


def dispatch_with_governance(dispatch: TransactionalHandler) -> TransactionalHandler:
    """``dispatch`` with the replicas' events handled first (module contract)."""

    async def handle(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        match envelope.data:
            case FlavorDeclared() as declared:
                await _apply_flavor(
                    conn,
                    declared.name,
                    declared.description,
                    declared.revision,
                    False,
                    declared.declared_at,
                )
            case FlavorRetired() as retired:
                await _apply_flavor(
                    conn, retired.name, "", retired.revision, True, retired.retired_at
                )
            case BudgetUpdated() as state:
                await _apply_budget(conn, state)
            case BudgetThresholdCrossed() as crossed:
                # The state that admission acts on comes with budget.updated; a crossing is
                # logged, for the team's operators to find why jobs start being refused.
                log.info(
                    "budget of team %s%s: %s%% of %s %s reached in %s",
                    crossed.team,
                    f" project {crossed.project}" if crossed.project else "",
                    crossed.threshold_percent,
                    crossed.amount,
                    crossed.currency,
                    crossed.month,
                )
            case _:
                await dispatch(envelope, conn)

    return handle


async def _apply_flavor(
    conn: asyncpg.Connection,
    name: str,
    description: str,
    revision: int,
    retired: bool,
    at: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO flavor_replica (name, description, revision, retired, changed_at)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description,
               revision = EXCLUDED.revision, retired = EXCLUDED.retired,
               changed_at = EXCLUDED.changed_at
           WHERE flavor_replica.revision < EXCLUDED.revision""",
        name,
        description,
        revision,
        retired,
        at,
    )


REPLICA_FIELDS = (*budget_states.FIELDS, "rates")
"""What ``budget_replica`` keeps of a budget state: all of it, ``on_exhausted`` and ``rates``
too (whether the budget reserves each job's worst case, and at what prices)."""


async def _apply_budget(conn: asyncpg.Connection, state: BudgetUpdated) -> None:
    await budget_states.keep(conn, "budget_replica", state, REPLICA_FIELDS)


async def known_flavors(pool: asyncpg.Pool, bootstrap: Sequence[str]) -> list[str]:
    """The flavors a job may ask for now (module contract), sorted."""
    rows = await pool.fetch("SELECT name, retired FROM flavor_replica")
    retired = {r["name"] for r in rows if r["retired"]}
    declared = {r["name"] for r in rows if not r["retired"]}
    return sorted((set(bootstrap) | declared) - retired)


async def admit(
    pool: asyncpg.Pool, team: str, job: JobRequest, now: datetime | None = None
) -> tuple[JobRequest, list[str], Lowered | None]:
    """The job as its budgets admit it, and the warnings (module contract)."""
    found = await pool.fetchval(
        f"SELECT {_screened_budgets('$1', '$2')}", team, _month(now or datetime.now(UTC))
    )
    rows = [b for b in json.loads(found) if b["project"] in ("", job.project)]
    return _by_budgets(team, job, rows)


@dataclass(frozen=True)
class Screening:
    """What a submission is checked against, read in one query (``screening``): the flavors
    a job may ask for (as ``known_flavors``) and the team's budgets that admission acts on
    (exhausted this month, ``spent_now``, or reserving each job's worst case), of the team
    and of every project (``admit`` picks the job's)."""

    team: str
    flavors: list[str]
    budgets: list[dict[str, Any]]

    def admit(self, job: JobRequest) -> tuple[JobRequest, list[str], Lowered | None]:
        """``admit``, by the budgets read."""
        budgets = [b for b in self.budgets if b["project"] in ("", job.project)]
        return _by_budgets(self.team, job, budgets)


def screening_columns(team: str, month: str) -> str:
    """The select list that reads a ``Screening`` (``screening_of``), for the team and month
    given as SQL expressions: lets another query (the token check) read it in the same round
    trip."""
    return f"""{_flavors(retired=False)} AS screen_declared,
               {_flavors(retired=True)} AS screen_retired,
               {_screened_budgets(team, month)} AS screen_budgets"""


def screening_unchanged(team: str, month: str, declared: str, retired: str, budgets: str) -> str:
    """An SQL condition: the team's screening in ``month`` is still the one read with
    ``screening_columns`` as the parameters ``declared`` and ``retired`` (``text[]``, sorted
    by code point) and ``budgets`` (the text ``screen_budgets`` was). Equal renderings of
    the same rows mean the same ``Screening``; any change makes it false."""
    return f"""{_flavors(retired=False)} = {declared}::text[]
               AND {_flavors(retired=True)} = {retired}::text[]
               AND {_screened_budgets(team, month)} = {budgets}"""


def _flavors(retired: bool) -> str:
    # Byte order (COLLATE "C") is the code-point order of Python's ``sorted``.
    where = "retired" if retired else "NOT retired"
    return f'ARRAY(SELECT name FROM flavor_replica WHERE {where} ORDER BY name COLLATE "C")'


def _screened_budgets(team: str, month: str) -> str:
    # Spent in ``month`` (the spent policies act), or reserving (whatever is spent, of any
    # month: the whole amount is what a job's worst case must fit in).
    spent_now = f"(month = {month} AND exhausted)"
    return f"""(SELECT coalesce(json_agg(json_build_object(
                           'project', project, 'month', month, 'amount', amount,
                           'spent', spent, 'currency', currency, 'policy', policy,
                           'on_exhausted', on_exhausted, 'rates', rates,
                           'spent_now', {spent_now})
                       ORDER BY project), '[]')::text
                FROM budget_replica
                WHERE team = {team} AND NOT deleted AND ({spent_now}
                      OR (rates IS NOT NULL AND (policy = 'refuse' OR on_exhausted = 'stop'))))"""


def screening_of(row: Mapping[str, Any], bootstrap: Sequence[str], team: str) -> Screening:
    """The ``Screening`` of a row read with ``screening_columns``."""
    flavors = sorted((set(bootstrap) | set(row["screen_declared"])) - set(row["screen_retired"]))
    return Screening(team, flavors, json.loads(row["screen_budgets"]))


def current_month(now: datetime | None = None) -> str:
    """The month (``YYYY-MM``, UTC) whose budget states count now."""
    return _month(now or datetime.now(UTC))


async def screening(
    pool: asyncpg.Pool, bootstrap: Sequence[str], team: str, now: datetime | None = None
) -> Screening:
    """``known_flavors`` and the budget states ``admit`` reads, in one round trip."""
    row = await pool.fetchrow(f"SELECT {screening_columns('$1', '$2')}", team, current_month(now))
    assert row is not None  # a SELECT without FROM has one row
    return screening_of(row, bootstrap, team)


def _month(now: datetime) -> str:
    return f"{now.year:04d}-{now.month:02d}"


def _by_budgets(
    team: str, job: JobRequest, rows: Sequence[Mapping[str, Any]]
) -> tuple[JobRequest, list[str], Lowered | None]:
    # Rows read for their reservations only (``_refuse_over_whole``) are not spent now.
    spent_now = [row for row in rows if row.get("spent_now", True)]
    for row in spent_now:
        # First: a spent ``refuse`` budget refuses any job, however it is changed, so its
        # owner is not sent to shorten a job that could not start either way.
        if row["policy"] == "refuse":
            scope = _scope(team, row)
            raise Conflict(
                f"the budget of {scope} is spent ({_spent(row)}); new jobs are refused",
                field="project" if row["project"] else "team",
                message=f"the budget of {scope} is spent and refuses new jobs",
            )
    _refuse_over_whole(team, job, rows)
    warnings: list[str] = []
    lowered: Lowered | None = None
    for row in spent_now:
        scope = _scope(team, row)
        spent = _spent(row)
        if row["policy"] == "deprioritize":
            if job.priority != DEPRIORITIZED_CLASS:  # the first budget that lowers it
                lowered = Lowered(job.priority, f"the budget of {scope} is spent ({spent})")
            job = job.model_copy(update={"priority": DEPRIORITIZED_CLASS})
            warnings.append(
                f"the budget of {scope} is spent ({spent}); the job runs at priority "
                f"{DEPRIORITIZED_CLASS}"
            )
        else:
            warnings.append(f"the budget of {scope} is spent ({spent})")
    return job, warnings, lowered


def _spent(row: Mapping[str, Any]) -> str:
    return f"{row['spent']} of {row['amount']} {row['currency']} spent in {row['month']}"


def _scope(team: str, row: Mapping[str, Any]) -> str:
    return f"team {team}" if not row["project"] else f"project {row['project']} of {team}"


def _refuse_over_whole(team: str, job: JobRequest, rows: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``RequestInvalid`` when a budget of ``rows`` that reserves could never take
    ``job``'s worst case (module contract); the team's budget is named before a project's."""
    fields = ("gpus", "gpu_flavor", "cpus_per_gpu", "memory_gib_per_gpu", "max_runtime_seconds")
    shape = {f: getattr(job, f) for f in fields}
    for row in rows:
        rates = row.get("rates")
        if not isinstance(rates, Mapping):  # none, or not billing's object: nothing reserved
            continue
        if not worst_case.reserves(row["policy"], row.get("on_exhausted", "finish"), rates):
            continue
        per_hour = worst_case.hourly(shape, rates)
        need = worst_case.worst(per_hour, worst_case.attempt_seconds(job.max_runtime_seconds))
        over = worst_case.over_whole(need, per_hour, worst_case.decimal(row["amount"]))
        if over is None:
            continue
        currency = row["currency"]
        reason = worst_case.over_whole_reason(over, _scope(team, row), row["amount"], currency)
        message = (
            f"{reason}: the scheduler could never start it; "
            f"{worst_case.over_whole_remedy(over, currency, team, row['project'])}"
        )
        field = "max_runtime_seconds" if over.longest > 0 else "gpus"
        detail = f"this job's worst case is more than the whole budget of {_scope(team, row)}"
        raise RequestInvalid([FieldError(field=field, message=message)], detail=detail)
