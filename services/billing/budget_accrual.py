"""Budgets checked while jobs run: running allocations' accrued cost crosses thresholds too.

Contract:
- ``check_running(pool, now)`` checks every budget with a running allocation of its team
  (or project) for the current UTC month, in one transaction that holds a transaction-scoped
  advisory lock (one replica at a time; another one skips): thresholds the month's spending
  (bills and accrued cost, ``budgets_repository.spent``) has reached and that are not
  recorded yet are recorded and said as ``budget.threshold_crossed``, then the budget's
  state (``budget.updated``, exhausted or not), exactly as after a bill
  (``budget_watch.check``); with no threshold crossed, the state is said when it is no
  longer what was last said this month (``budget_watch.state_changed``: became exhausted,
  or no longer is). Each budget is checked holding its scope
  (``budgets_repository.try_lock``, as a bill and a change of it do); one held by another
  transaction at that moment is left to the next pass. A state that cannot be said (a
  budget that reserves, under a book past ``MAX_PRICED_FLAVORS``) is logged and left for a
  later pass (``budget_watch.say_state_or_log``); the pass goes on. Returns how many
  budgets crossed a threshold.
- ``BudgetAccrual(pool).run(stop)`` does it every ``interval_s`` until ``stop`` is set; a
  failed pass is logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg

from trainyard_platform.services.billing import budget_watch
from trainyard_platform.services.billing import budgets_repository as repo
from trainyard_platform.services.billing.budgets import month_start
from trainyard_platform.shared.db import DATABASE_FAULTS, failed_rounds_from_zero, log_failed_round

log = logging.getLogger(__name__)

INTERVAL_S = 60.0
"""How often running allocations' accrued cost is checked against budgets."""
_LOCK = "billing:budget-accrual"


async def check_running(pool: asyncpg.Pool, now: datetime) -> int:
    """Record and say the thresholds running allocations made budgets cross (module
    contract)."""
    crossed = 0
    async with pool.acquire() as conn, conn.transaction():
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock(hashtext($1))", _LOCK):
            return 0
        scopes = await conn.fetch(
            """SELECT DISTINCT b.team, b.project FROM budgets b
               WHERE EXISTS (SELECT 1 FROM announced_allocations a
                             WHERE a.team = b.team
                               AND (b.project = '' OR a.project = b.project)
                               AND NOT EXISTS (SELECT 1 FROM usage_ledger u
                                               WHERE u.allocation_id = a.allocation_id))
               ORDER BY b.team, b.project"""
        )
        for scope in scopes:
            team, project = scope["team"], scope["project"] or None
            # A budget a bill or a change holds now is checked at the next pass: waiting
            # here, holding others, could deadlock with a bill taking them in another order.
            if not await repo.try_lock(conn, team, project):
                continue
            budget = await repo.get(conn, team, project)
            if budget is None:
                continue
            if await budget_watch.check(conn, budget, [month_start(now)], now):
                await budget_watch.say_state_or_log(conn, budget, now)
                crossed += 1
            elif await budget_watch.state_changed(conn, budget, now):
                await budget_watch.say_state_or_log(conn, budget, now)
    return crossed


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BudgetAccrual:
    def __init__(
        self,
        pool: asyncpg.Pool,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._clock = clock

    async def run(self, stop: asyncio.Event) -> None:
        failed_rounds_from_zero("budget-accrual")
        while not stop.is_set():
            try:
                crossed = await check_running(self._pool, self._clock())
                if crossed:
                    log.info("running allocations crossed thresholds of %d budgets", crossed)
            except DATABASE_FAULTS as exc:
                log_failed_round(
                    log, "budget-accrual", "budget check of running allocations failed: %s", exc
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
