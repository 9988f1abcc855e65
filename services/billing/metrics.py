"""Billing's gauges, read from its tables by ``shared.metrics_sampler``: each team budget's
share spent this UTC month and whether it is exhausted.

Only team budgets (project None): a team is the label, so the series are bounded by the
number of teams that have a budget (a project's budget would add a label per project).
What is spent is ``budgets_repository.spent`` (the month's bills and what running
allocations have accrued so far), as the budget's own checks compute it, and a budget is
exhausted when that reaches its amount (``budget_watch``'s rule). Read every 15 s on one
connection, never on the scrape.
"""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from trainyard_platform.services.billing import budgets_repository as repo
from trainyard_platform.services.billing.budgets import month_start
from trainyard_platform.shared.metrics_sampler import Readings, Sampler


async def team_budgets(conn: asyncpg.Connection, now: datetime) -> list[tuple[str, float, bool]]:
    """``(team, share of the amount spent this month, exhausted)`` of every team budget."""
    month = month_start(now)
    found = []
    for budget in await repo.of_teams(conn, None):
        if budget.project is not None:
            continue
        spent = await repo.spent(conn, budget, month, now)
        share = float(spent / budget.amount)  # amounts are > 0 (the table's check)
        found.append((budget.team, share, spent >= budget.amount))
    return found


def billing_readings(sampler: Sampler, pool: asyncpg.Pool) -> None:
    """Register billing's readings on ``sampler``."""
    latest: list[tuple[str, float, bool]] = []

    async def used() -> Readings:
        latest.clear()  # a failed reading leaves both series absent (unknown), not stale
        async with pool.acquire() as conn:
            latest[:] = await team_budgets(conn, datetime.now(UTC))
        return [(share, {"team": team}) for team, share, _ in latest]

    async def exhausted() -> Readings:
        # Read after ``used`` in the same sample (registration order): one query per team.
        return [(float(spent), {"team": team}) for team, _, spent in latest]

    sampler.gauge("trainyard.billing.budget.used", used)
    sampler.gauge("trainyard.billing.budget.exhausted", exhausted)
