"""Billing's SQL for budgets and their threshold crossings. A team's budget is stored with
project ``''`` (part of the primary key); the API and events say None."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing.budgets import Budget, next_month
from trainyard_platform.services.billing.domain import UnknownFlavor
from trainyard_platform.services.billing.prices import PriceSchedule
from trainyard_platform.services.billing.waste_rollups import OWN_REPORT

Row = Mapping[str, Any]
_COLUMNS = (
    "team, project, amount, currency, thresholds, policy, revision, updated_by, updated_at, "
    "on_exhausted"
)


def _budget(row: Row) -> Budget:
    return Budget(
        team=row["team"],
        project=row["project"] or None,
        amount=Decimal(row["amount"]),
        currency=row["currency"],
        thresholds=tuple(row["thresholds"]),
        policy=row["policy"],
        revision=row["revision"],
        updated_by=row["updated_by"],
        updated_at=row["updated_at"],
        on_exhausted=row["on_exhausted"],
    )


async def lock(conn: asyncpg.Connection, scopes: Iterable[tuple[str, str | None]]) -> None:
    """Hold each budget scope (a team and a project, None for the team's) until the
    transaction ends, whether the budget exists yet or not: every transaction that reads a
    budget to say its state (a bill's, a change's, the accrual check's) takes it first, so
    they take turns and the state said last (the highest revision) is read after every
    earlier one committed. The scopes are taken in one order (by key) to avoid deadlocks;
    distinct scopes sharing a key only wait for each other."""
    keys = sorted({_scope_key(team, project) for team, project in scopes})
    if keys:
        await conn.execute(
            f"SELECT pg_advisory_xact_lock(k) FROM ("
            f"  SELECT DISTINCT {_LOCK_KEY.format(key='s')} AS k"
            f"  FROM unnest($1::text[]) AS s ORDER BY k) AS ordered",
            keys,
        )


async def try_lock(conn: asyncpg.Connection, team: str, project: str | None) -> bool:
    """``lock`` of one scope if no other transaction holds it, without waiting; False when
    one does (for a check that may skip a budget until its next pass: never waiting, it
    cannot deadlock with a bill holding scopes in another order)."""
    return bool(
        await conn.fetchval(
            f"SELECT pg_try_advisory_xact_lock({_LOCK_KEY.format(key='$1')})",
            _scope_key(team, project),
        )
    )


_LOCK_KEY = "hashtextextended('billing:budget:' || {key}, 0)"


def _scope_key(team: str, project: str | None) -> str:
    return f"{team}:{project or ''}"


async def next_revision(conn: asyncpg.Connection) -> int:
    revision: int = await conn.fetchval("SELECT nextval('budget_revisions')")
    return revision


async def put(conn: asyncpg.Connection, budget: Budget) -> bool:
    """Create or replace a budget; True when it was created."""
    created: bool = await conn.fetchval(
        f"""INSERT INTO budgets ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
            ON CONFLICT (team, project) DO UPDATE SET amount = EXCLUDED.amount,
                currency = EXCLUDED.currency, thresholds = EXCLUDED.thresholds,
                policy = EXCLUDED.policy, on_exhausted = EXCLUDED.on_exhausted,
                revision = EXCLUDED.revision,
                updated_by = EXCLUDED.updated_by, updated_at = EXCLUDED.updated_at
            RETURNING xmax = 0""",
        budget.team,
        budget.project or "",
        budget.amount,
        budget.currency,
        list(budget.thresholds),
        budget.policy,
        budget.revision,
        budget.updated_by,
        budget.updated_at,
        budget.on_exhausted,
    )
    return created


async def get(conn: asyncpg.Connection, team: str, project: str | None) -> Budget | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM budgets WHERE team = $1 AND project = $2", team, project or ""
    )
    return _budget(row) if row is not None else None


async def delete(conn: asyncpg.Connection, team: str, project: str | None) -> Budget | None:
    row = await conn.fetchrow(
        f"DELETE FROM budgets WHERE team = $1 AND project = $2 RETURNING {_COLUMNS}",
        team,
        project or "",
    )
    return _budget(row) if row is not None else None


async def of_teams(
    conn: asyncpg.Connection,
    team: str | None,
    limit: int | None = None,
    after: tuple[str, str] | None = None,
) -> list[Budget]:
    """At most ``limit`` budgets (of one team, or all; None: no bound, for the metrics
    sampler, never for a request) after ``after`` (the ``(team, project)`` of the previous
    page's last; a team's own budget has project ``''``), by team and project."""
    last_team, last_project = after or (None, None)
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM budgets WHERE ($1::text IS NULL OR team = $1) "
        "AND ($3::text IS NULL OR (team, project) > ($3, $4::text)) "
        "ORDER BY team, project LIMIT $2",
        team,
        limit,
        last_team,
        last_project,
    )
    return [_budget(r) for r in rows]


async def spent(
    conn: asyncpg.Connection, budget: Budget, month: datetime, now: datetime
) -> Decimal:
    """What the budget's team (or project) spent in the UTC month starting ``month``, in
    the budget's currency: the month's rollups (every bill committed so far) and what the
    allocations still running have accrued in the month up to ``now`` (``accrued``)."""
    return (await spent_accruing(conn, budget, month, now))[0]


async def spent_accruing(
    conn: asyncpg.Connection,
    budget: Budget,
    month: datetime,
    now: datetime,
    book: PriceSchedule | None = None,
) -> tuple[Decimal, list[str]]:
    """``spent``, and the allocations (ids, sorted) whose accrued cost is part of it: each
    still running and priced, its cost from its grant (or the month's start) up to ``now``
    (or the end of its bill, if earlier: ``accrued``) counted (``budget.updated``'s
    ``accruing``). ``book``: the price book read already in
    this transaction (a caller saying many budgets reads it once); else it is read here
    when an allocation is running."""
    value = await conn.fetchval(
        "SELECT COALESCE(sum(cost), 0) FROM cost_rollups WHERE granularity = 'month' "
        "AND bucket = $1 AND team = $2 AND ($3::text IS NULL OR project = $3) "
        "AND currency = $4",
        month,
        budget.team,
        budget.project,
        budget.currency,
    )
    total, ids = await _accrual(conn, budget, month, now, book)
    return Decimal(value) + total, ids


async def accrued(
    conn: asyncpg.Connection, budget: Budget, month: datetime, now: datetime
) -> Decimal:
    """The cost so far of the budget's allocations that are granted and not billed yet
    (running; not one whose own runner said it failed through the platform, ``OWN_REPORT``:
    the platform pays for it), within the month and up to ``now``, but never past the
    latest end of its bill (``billed_until``: its grant plus its job's
    ``max_runtime_seconds`` and the kill grace, ``worst_case.billed_until``; the scheduler
    releases it no later), priced by the book as their bill will be (GPUs, CPUs and memory);
    0 for an allocation of a flavor without a price (its release will be dead-lettered)."""
    return (await _accrual(conn, budget, month, now))[0]


async def _accrual(
    conn: asyncpg.Connection,
    budget: Budget,
    month: datetime,
    now: datetime,
    book: PriceSchedule | None = None,
) -> tuple[Decimal, list[str]]:
    """``accrued``, and the allocations whose cost it counts whole (sorted ids: none of a
    flavor without a price, nor one priced in part in another currency), priced by
    ``book`` (read here when None and an allocation is running)."""
    end = min(now, next_month(month))
    if end <= month:
        return Decimal(0), []
    rows = await conn.fetch(
        f"""SELECT a.allocation_id, a.gpu_flavor, a.gpus, a.cpus, a.memory_gib, a.granted_at,
                  a.billed_until
           FROM announced_allocations a
           WHERE a.team = $1 AND ($2::text IS NULL OR a.project = $2) AND a.granted_at < $3
             AND NOT EXISTS (SELECT 1 FROM usage_ledger u
                             WHERE u.allocation_id = a.allocation_id)
             AND NOT EXISTS (SELECT 1 FROM waste_run_reports r
                             WHERE {OWN_REPORT} AND r.failure_kind = 'platform_error')""",
        budget.team,
        budget.project,
        end,
    )
    if not rows:
        return Decimal(0), []
    if book is None:
        book = await catalogue.schedule(conn)
    total = Decimal(0)
    ids = []
    for r in rows:
        start = max(r["granted_at"], month)
        # No further than its bill can reach: the scheduler releases it by then, however
        # long it is held after (migration 0021; NULL, announced before it: up to ``end``).
        until = end if r["billed_until"] is None else min(end, r["billed_until"])
        if until <= start:
            # Its bill ends before this month: nothing more of it is spent in it, and a
            # reservation counts none of it as still to come (``accruing``).
            ids.append(r["allocation_id"])
            continue
        try:
            segments = book.segments(
                r["gpu_flavor"],
                r["gpus"],
                start,
                until,
                cpus=r["cpus"],
                memory_gib=r["memory_gib"],
            )
        except (UnknownFlavor, ValueError):
            continue
        total += sum((s.cost for s in segments if s.currency == budget.currency), Decimal(0))
        if all(s.currency == budget.currency for s in segments):  # all of it counted
            ids.append(r["allocation_id"])
    return total, sorted(ids)


async def said_exhausted(conn: asyncpg.Connection, budget: Budget, month: datetime) -> bool:
    """Whether the state billing last said of ``budget`` for ``month`` was exhausted (False
    when the last said was about another month, or none was said since it was kept)."""
    row = await conn.fetchrow(
        "SELECT said_month, said_exhausted FROM budgets WHERE team = $1 AND project = $2",
        budget.team,
        budget.project or "",
    )
    return bool(row and row["said_month"] == month.date() and row["said_exhausted"])


async def mark_said(
    conn: asyncpg.Connection, budget: Budget, month: datetime, exhausted: bool
) -> None:
    """Keep what was just said of the budget's state (``said_exhausted``)."""
    await conn.execute(
        "UPDATE budgets SET said_month = $3, said_exhausted = $4 WHERE team = $1 AND project = $2",
        budget.team,
        budget.project or "",
        month.date(),
        exhausted,
    )


async def record_crossing(
    conn: asyncpg.Connection,
    budget: Budget,
    month: datetime,
    threshold: int,
    spent: Decimal,
    now: datetime,
) -> bool:
    """Record that ``threshold`` was crossed in ``month``; False when it was already."""
    done = await conn.fetchval(
        """INSERT INTO budget_crossings (team, project, month, threshold_percent, spent,
                                         crossed_at)
           VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING true""",
        budget.team,
        budget.project or "",
        month.date(),
        threshold,
        spent,
        now,
    )
    return bool(done)
