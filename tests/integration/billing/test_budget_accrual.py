"""Budgets count running allocations: their cost so far crosses thresholds while they run,
is said as for a bill, and is replaced by the bill when they end (never counted twice).
The real consumer and the budget check on PostgreSQL; prices: a100 2.50 per GPU-hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from tests.integration.billing.conftest import feed, grant_of, release_event
from trainyard_platform.services.billing import budgets_repository as repo
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing.budget_accrual import check_running
from trainyard_platform.services.billing.budget_watch import say_state
from trainyard_platform.services.billing.budgets import Budget, month_start
from trainyard_platform.shared.events import parse_envelope
from trainyard_platform.shared.events.payloads import (
    MAX_PRICED_FLAVORS,
    AllocationReleased,
    BudgetThresholdCrossed,
    BudgetUpdated,
)
from trainyard_platform.shared.worst_case import attempt_seconds

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)


def running(allocation_id: str, team: str, start: datetime) -> AllocationReleased:
    """The release ``allocation_id`` will have (its grant is what billing sees first)."""
    return AllocationReleased(
        allocation_id=allocation_id,
        job_id=f"job-{allocation_id}",
        node_id="node-1",
        team=team,
        user="ada",
        gpu_flavor="a100",
        gpus=2,
        granted_at=start,
        released_at=start + timedelta(hours=2),
        outcome="succeeded",
    )


async def said(pool: asyncpg.Pool) -> list[object]:
    rows = await pool.fetch("SELECT body FROM outbox ORDER BY seq")
    return [parse_envelope(r["body"]).data for r in rows]


async def budget(pool: asyncpg.Pool, team: str, project: str | None, amount: str) -> Budget:
    b = Budget(team, project, Decimal(amount), "USD", (50, 100), "refuse", 1, "op", NOW)
    async with pool.acquire() as conn:
        await repo.put(conn, b)
    return b


async def test_a_running_job_crosses_its_budget_before_it_ends(pool: asyncpg.Pool) -> None:
    b = await budget(pool, "ml", None, "4")
    await budget(pool, "vision", None, "4")
    job = running("r1", "ml", NOW - timedelta(hours=1))  # 2 a100 for 1 h so far: 5.00
    await feed(pool, grant_of(job))
    async with pool.acquire() as conn:
        assert await repo.spent(conn, b, month_start(NOW), NOW) == Decimal(5)
        # half an hour earlier it had spent 2.50: past 50 % only
        assert await repo.spent(conn, b, month_start(NOW), NOW - timedelta(minutes=30)) == (
            Decimal("2.5")
        )

    assert await check_running(pool, NOW) == 1  # ml only: vision runs nothing
    assert await check_running(pool, NOW) == 0  # each crossing once
    events = await said(pool)
    crossed = [e for e in events if isinstance(e, BudgetThresholdCrossed)]
    assert [(c.team, c.threshold_percent, Decimal(c.spent)) for c in crossed] == [
        ("ml", 50, Decimal(5)),
        ("ml", 100, Decimal(5)),
    ]
    (state,) = [e for e in events if isinstance(e, BudgetUpdated)]
    assert state.exhausted and state.policy == "refuse"

    # it ends after 2 h: billed 10.00, and the accrual is gone (nothing twice)
    await feed(pool, release_event(job))
    async with pool.acquire() as conn:
        assert await repo.spent(conn, b, month_start(NOW), NOW + timedelta(hours=5)) == 10


async def test_a_job_held_past_its_limits_accrues_no_more_than_its_bill_will_be(
    pool: asyncpg.Pool,
) -> None:
    """The scheduler bills no attempt past its grant plus its ``max_runtime_seconds`` and
    the kill grace (``worst_case.billed_until``), though its allocation may be held longer
    (a long preparation, the wait for its last checkpoint's upload). Its accrual stops
    there too: accrued on to now, a job of a 1 h limit held 2 h spent 10.00 of a budget of
    6, said it exhausted (a ``stop`` budget stops its team's jobs, ``refuse`` refuses new
    ones) and crossed 100 % for good, though its bill is 5.04."""
    b = await budget(pool, "ml", None, "6")
    job = running("r7", "ml", NOW - timedelta(hours=2))  # 2 a100 for 3600 s + 30 s at most
    await feed(pool, grant_of(job))
    async with pool.acquire() as conn:
        accruing = await repo.spent(conn, b, month_start(NOW), NOW)

    assert await check_running(pool, NOW) == 1
    events = await said(pool)
    crossed = [e.threshold_percent for e in events if isinstance(e, BudgetThresholdCrossed)]
    assert crossed == [50]
    (state,) = [e for e in events if isinstance(e, BudgetUpdated)]
    assert not state.exhausted

    # Its bill, when the scheduler releases it, is what it accrued.
    billed_until = job.granted_at + timedelta(seconds=attempt_seconds(3600))
    await feed(pool, release_event(job.model_copy(update={"released_at": billed_until})))
    async with pool.acquire() as conn:
        assert await repo.spent(conn, b, month_start(NOW), NOW) == accruing
    assert accruing == Decimal("5.041667")


async def test_only_the_month_and_the_project_are_counted(pool: asyncpg.Pool) -> None:
    project = await budget(pool, "ml", "vision-models", "100")
    other = running("r2", "ml", NOW - timedelta(hours=1))
    await feed(pool, grant_of(other, project="tabular"))
    mine = running("r3", "ml", month_start(NOW) - timedelta(hours=3))  # from last month
    await feed(pool, grant_of(mine, project="vision-models", max_runtime_seconds=6 * 3600))
    async with pool.acquire() as conn:
        spent = await repo.spent(
            conn, project, month_start(NOW), month_start(NOW) + timedelta(hours=1)
        )
        assert spent == Decimal(5)  # r3's first hour of this month; r2 is another project's
        assert await say_state(conn, project, NOW) > 0


async def test_a_budget_a_bill_holds_is_left_to_the_next_check(pool: asyncpg.Pool) -> None:
    """The check takes each budget as a bill or a change does (``budgets_repository``),
    but never waits for one: a budget held elsewhere is checked at the next pass."""
    await budget(pool, "ml", None, "4")
    await feed(pool, grant_of(running("r4", "ml", NOW - timedelta(hours=1))))
    async with pool.acquire() as holder, holder.transaction():
        await repo.lock(holder, [("ml", None)])  # a bill of ml's, being made
        assert await check_running(pool, NOW) == 0
    assert await check_running(pool, NOW) == 1


class _ChangeBetweenReads:
    """A connection that commits ``change`` (on another connection) right after its first
    read of the price book, as a price change committing in the middle of a reader would."""

    def __init__(self, conn: asyncpg.Connection, change: Any) -> None:
        self._conn = conn
        self._change = change
        self.changed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def fetch(self, query: str, *args: Any) -> Any:
        rows = await self._conn.fetch(query, *args)
        if not self.changed and "prices" in query:
            self.changed = True
            await self._change()
        return rows


async def test_accrual_reads_one_price_book_whatever_change_commits_meanwhile(
    pool: asyncpg.Pool,
) -> None:
    # 2 a100 with 4 CPUs each, running from NOW - 1 h: at 2.50 per GPU-hour and 0.10 per
    # CPU-hour, 5.00 + 0.80. A change of both prices (GPU 10, CPU 1, from NOW - 30 min)
    # commits while the accrual reads the book: it counts the book before (5.80) or after
    # it (2.50 + 0.40 + 10 + 4 = 16.90), never the GPU price of one and the CPU price of the
    # other.
    b = await budget(pool, "ml", None, "1000")
    async with pool.acquire() as conn:
        await catalogue.set_resource_price(
            conn, "a100", "cpu", NOW - timedelta(days=30), Decimal("0.10"), "USD", "op", NOW
        )
    job = running("r1", "ml", NOW - timedelta(hours=1))
    await feed(pool, grant_of(job, cpus_per_gpu=4))

    async def change() -> None:
        async with pool.acquire() as other, other.transaction():
            at = NOW - timedelta(minutes=30)
            await catalogue.set_price(other, "a100", at, Decimal(10), "USD", "op", at)
            await catalogue.set_resource_price(
                other, "a100", "cpu", at, Decimal(1), "USD", "op", at
            )

    async with pool.acquire() as conn:
        reader = _ChangeBetweenReads(conn, change)
        accrued = await repo.accrued(reader, b, month_start(NOW), NOW)  # type: ignore[arg-type]
        assert reader.changed
        assert accrued in (Decimal("5.8"), Decimal("16.9")), accrued


async def test_a_book_past_its_bound_leaves_a_reserving_budget_unsaid_not_the_check_failed(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a book priced past ``MAX_PRICED_FLAVORS`` before the bound, the state of a
    budget that reserves cannot say its rates: the check still records and says its
    thresholds, says every other budget, and logs the one it could not say, rather than
    fail the pass (and every pass after it) for all."""
    await budget(pool, "ml", None, "4")  # refuse: reserves
    warns = Budget("vision", None, Decimal(4), "USD", (50, 100), "warn", 1, "op", NOW)
    async with pool.acquire() as conn:
        await repo.put(conn, warns)
    have = await pool.fetchval("SELECT count(DISTINCT flavor) FROM prices")
    await pool.executemany(
        "INSERT INTO prices (flavor, effective_from, price_per_gpu_hour, currency, set_by, "
        "recorded_at) VALUES ($1, '1970-01-01Z', 1, 'USD', 'test', now())",
        [(f"f{i}",) for i in range(MAX_PRICED_FLAVORS + 1 - have)],
    )
    await feed(pool, grant_of(running("r5", "ml", NOW - timedelta(hours=1))))
    await feed(pool, grant_of(running("r6", "vision", NOW - timedelta(hours=1))))

    assert await check_running(pool, NOW) == 2

    events = await said(pool)
    crossed = [
        (e.team, e.threshold_percent) for e in events if isinstance(e, BudgetThresholdCrossed)
    ]
    assert sorted(crossed) == [("ml", 50), ("ml", 100), ("vision", 50), ("vision", 100)]
    assert [e.team for e in events if isinstance(e, BudgetUpdated)] == ["vision"]
    (logged,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged.startswith(
        f"budget of ml: state not said: the price book has {MAX_PRICED_FLAVORS + 1} flavors"
    )
