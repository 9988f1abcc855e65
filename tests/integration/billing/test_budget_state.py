"""A budget's state (``budget.updated``, what submission's admission acts on) is said
whenever the month's spending makes it exhausted, whatever its thresholds and whatever was
crossed before this month: not only when a threshold is crossed.

ml's job (2 a100 at 2.50 per GPU-hour) is billed 3.00 per attempt of 36 minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.billing.conftest import feed
from tests.integration.billing.test_platform_failures import ML, P, client
from tests.integration.billing.test_waste import failed, granted, released, submitted
from trainyard_platform.services.billing.budget_accrual import check_running
from trainyard_platform.services.billing.budgets import month_start
from trainyard_platform.shared.events import parse_envelope
from trainyard_platform.shared.events.payloads import BudgetUpdated
from trainyard_platform.shared.events.trust import RUNNER

pytestmark = pytest.mark.integration

__all__ = ["client"]


async def _budget(client: httpx.AsyncClient, **body: Any) -> None:
    answer = await client.put("/v1/budgets/ml", json=body, headers=ML)
    assert answer.status_code in (200, 201), answer.text


async def _attempt(pool: asyncpg.Pool, n: int) -> None:
    """ml's n-th attempt of 36 minutes this month, billed (3.00)."""
    start = month_start(datetime.now(UTC)) + timedelta(hours=n)
    end = start + timedelta(minutes=36)
    await feed(
        pool,
        granted(f"b-{n}", "b", P, "n1", start, "q", attempt=n),
        released(f"b-{n}", "b", P, "n1", start, end, "failed"),
    )


async def _states(pool: asyncpg.Pool) -> list[bool]:
    said = [
        parse_envelope(r["body"]).data
        for r in await pool.fetch(
            "SELECT body FROM outbox WHERE event_id LIKE 'budget:ml:%' ORDER BY seq"
        )
    ]
    return [s.exhausted for s in said if isinstance(s, BudgetUpdated)]


async def test_a_budget_without_a_100_threshold_is_said_exhausted(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    await feed(pool, submitted("b", P, month_start(datetime.now(UTC))))
    await _budget(client, amount="5", thresholds=[50], policy="refuse")
    await _attempt(pool, 1)  # 3.00 of 5: 50 % crossed
    await _attempt(pool, 2)  # 6.00 of 5: spent, though no threshold is left to cross
    assert await _states(pool) == [False, False, True]
    await _attempt(pool, 3)  # still spent: said once
    assert await _states(pool) == [False, False, True]


async def test_a_budget_raised_then_spent_again_is_said_exhausted_again(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """Its 100 % was crossed this month already, so no threshold is crossed again."""
    await feed(pool, submitted("b", P, month_start(datetime.now(UTC))))
    await _budget(client, amount="3", policy="refuse")
    await _attempt(pool, 1)  # 3.00 of 3: 50, 80 and 100 % crossed
    await _budget(client, amount="6", policy="refuse")  # not spent any more
    assert await _states(pool) == [False, True, False]
    await _attempt(pool, 2)  # 6.00 of 6
    assert await _states(pool) == [False, True, False, True]


async def test_running_allocations_spend_a_budget_without_a_threshold_left(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """The check of running allocations says the state too (not only a crossing)."""
    now = datetime.now(UTC)
    start = max(month_start(now), now - timedelta(hours=1))
    accrued = Decimal(2) * Decimal("2.5") * Decimal((now - start).total_seconds()) / 3600
    half = max(Decimal("0.000001"), (accrued / 2).quantize(Decimal("0.000001")))
    await feed(pool, submitted("b", P, start))
    # spent twice over by the time checked, far from its one threshold (1000 %)
    await _budget(client, amount=str(half), thresholds=[1000], policy="refuse")
    await feed(pool, granted("b-1", "b", P, "n1", start, "q"))
    assert await check_running(pool, now) == 0  # no threshold crossed
    assert await _states(pool) == [False, True]
    await check_running(pool, now)
    assert await _states(pool) == [False, True]


async def test_a_budget_spent_by_accrual_is_said_not_spent_when_the_bill_comes_in_smaller(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """The check of running allocations counts a running attempt up to now and says the
    budget spent; the attempt's node was lost, and the scheduler releases it at the node's
    last heartbeat, earlier: its bill is less than what was counted, less than the amount.
    The state submission refuses by is said again, not exhausted (before, it stayed spent
    for the month: every new job of the team refused, its running ones stopped)."""
    now, start = await _spent_by_one_running_attempt(pool, client, share=Decimal("0.75"))
    last_heartbeat = start + (now - start) / 2  # half of what was counted: under the amount
    await feed(pool, released("b-1", "b", P, "n1", start, last_heartbeat, "lost"))
    assert await _states(pool) == [False, True, False]


async def test_a_budget_spent_by_accrual_is_said_not_spent_when_the_platform_pays(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """As above, but the runner says the attempt failed through the platform, before its
    release: the platform pays for it, nothing of it is the team's, and the budget is said
    not exhausted once the release makes it so."""
    now, start = await _spent_by_one_running_attempt(pool, client, share=Decimal("0.5"))
    await feed(pool, failed("b-1", "b", "n1", now, RUNNER, "platform_error"))
    await feed(pool, released("b-1", "b", P, "n1", start, now, "failed"))
    assert await _states(pool) == [False, True, False]


async def test_the_check_of_running_allocations_says_a_budget_no_longer_spent(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """The runner says the running attempt that spent the budget failed through the
    platform; its release has not come yet. The next check of running allocations counts
    nothing of it for the team and says the budget not exhausted, without waiting for the
    release."""
    now, _ = await _spent_by_one_running_attempt(pool, client, share=Decimal("0.5"))
    await feed(pool, failed("b-1", "b", "n1", now, RUNNER, "platform_error"))
    await check_running(pool, now)
    assert await _states(pool) == [False, True, False]
    await check_running(pool, now)  # said once
    assert await _states(pool) == [False, True, False]


async def _spent_by_one_running_attempt(
    pool: asyncpg.Pool, client: httpx.AsyncClient, share: Decimal
) -> tuple[datetime, datetime]:
    """A refusing budget of ``share`` of what one running 2-GPU attempt, granted an hour ago
    (or at the month's start), has accrued by now; the check of running allocations has
    said it spent. Returns (now, the attempt's start)."""
    now = datetime.now(UTC)
    start = max(month_start(now), now - timedelta(hours=1))
    accrued = Decimal(2) * Decimal("2.5") * Decimal((now - start).total_seconds()) / 3600
    amount = max(Decimal("0.000001"), (accrued * share).quantize(Decimal("0.000001")))
    await feed(pool, submitted("b", P, start))
    await _budget(client, amount=str(amount), thresholds=[1000], policy="refuse")
    await feed(pool, granted("b-1", "b", P, "n1", start, "q"))
    await check_running(pool, now)
    assert await _states(pool) == [False, True]
    return now, start
