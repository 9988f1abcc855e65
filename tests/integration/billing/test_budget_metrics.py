"""Billing's budget gauges read from a real database: team budgets only, what is spent as
the budget's own checks compute it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import asyncpg
import pytest

from trainyard_platform.services.billing import budgets_repository as repo
from trainyard_platform.services.billing.budgets import Budget
from trainyard_platform.services.billing.metrics import team_budgets

pytestmark = pytest.mark.integration


def budget(team: str, amount: str, project: str | None = None) -> Budget:
    now = datetime.now(UTC)
    return Budget(team, project, Decimal(amount), "USD", (50, 100), "warn", 1, "admin", now)


async def test_team_budgets_are_read_from_the_tables(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        for b in (budget("ml", "10"), budget("ml", "5", "chat"), budget("cv", "3")):
            await repo.put(conn, b)
        found = await team_budgets(conn, datetime.now(UTC))
    # Nothing spent yet; one reading per team budget, none for a project's.
    assert sorted(found) == [("cv", 0.0, False), ("ml", 0.0, False)]
