"""CPU and memory: dated prices set through the operator API, metered beside the GPUs by
billing's real consumer (inbox, handlers, ledger) on PostgreSQL, and reported apart.

The amounts below are worked out by hand from the prices and intervals, not by billing's
code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import httpx
import pytest

from tests.integration.billing.conftest import feed, grant_of, release_event
from tests.integration.billing.test_governance import (
    ML_VIEWER,
    OPERATOR,
    client,
    errors,
    released,
)
from trainyard_platform.services.billing import budgets_repository
from trainyard_platform.services.billing.buckets import floor
from trainyard_platform.services.billing.budgets import Budget, month_start

pytestmark = pytest.mark.integration
__all__ = ["client"]  # the app fixture, used by name


async def _put(client: httpx.AsyncClient, flavor: str, body: dict[str, str]) -> httpx.Response:
    return await client.put(f"/v1/prices/{flavor}", json=body, headers=OPERATOR)


async def _entries(pool: asyncpg.Pool) -> list[tuple[object, ...]]:
    rows = await pool.fetch(
        "SELECT allocation_id, kind, segment, gpu_seconds, cpu_seconds, price_per_cpu_hour, "
        "cpu_cost, memory_gib_seconds, price_per_memory_gib_hour, memory_cost, cost "
        "FROM ledger_entries ORDER BY entry_id"
    )
    return [tuple(r) for r in rows]


async def test_cpus_and_memory_are_billed_at_their_dated_prices_to_the_micro_unit(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    t1 = floor(datetime.now(UTC), "hour") + timedelta(hours=2)
    t2 = t1 + timedelta(hours=1)
    cpu = {"price_per_cpu_hour": "0.031", "price_per_memory_gib_hour": "0.0047"}
    first = await _put(client, "a100", {**cpu, "effective_from": t1.isoformat()})
    assert first.status_code == 201, first.text
    assert (first.json()["price_per_gpu_hour"], first.json()["price_per_cpu_hour"]) == (
        None,
        "0.031",
    )
    change = await _put(
        client, "a100", {"price_per_cpu_hour": "0.05", "effective_from": t2.isoformat()}
    )
    assert change.status_code == 201, change.text

    # 2 GPUs, 6 CPUs and 40 GiB per GPU, from 10 min after t1 to 20 min 7.5 s after t2.
    r = released("c1", t1 + timedelta(minutes=10), timedelta(minutes=70, seconds=7.5))
    grant = grant_of(r, cpus_per_gpu=6, memory_gib_per_gpu=40)
    await feed(pool, grant, release_event(r))

    # Before t2, 3000 s: 6000 GPU-s at 2.5 = 4.166667; 36000 CPU-s at 0.031 = 0.31;
    # 240000 GiB-s at 0.0047 = 0.313333. After, 1207.5 s: 2415 GPU-s = 1.677083;
    # 14490 CPU-s at 0.05 = 0.20125; 96600 GiB-s at 0.0047 = 0.126117.
    expected = [
        ("c1", "charge", 0, 6000, 36000, Decimal("0.031"), Decimal("0.31"), 240000,
         Decimal("0.0047"), Decimal("0.313333"), Decimal("4.79")),
        ("c1", "charge", 1, 2415, 14490, Decimal("0.05"), Decimal("0.20125"), 96600,
         Decimal("0.0047"), Decimal("0.126117"), Decimal("2.00445")),
    ]  # fmt: skip
    assert await _entries(pool) == expected
    bill = await pool.fetchrow("SELECT cost, cpus, memory_gib FROM usage_ledger")
    assert tuple(bill) == (Decimal("6.794450"), 12, 80)
    for unit in ("hour", "day", "month"):
        sums = await pool.fetchrow(
            "SELECT sum(cost), sum(cpu_cost), sum(memory_cost), sum(cpu_seconds), "
            "sum(unpriced_cpu_seconds) FROM cost_rollups WHERE granularity = $1",
            unit,
        )
        assert tuple(sums) == (Decimal("6.79445"), Decimal("0.51125"), Decimal("0.43945"), 50490, 0)

    # Redelivered (the same ids) and said again (new ids): nothing changes.
    await feed(pool, grant, release_event(r))
    await feed(pool, grant_of(r, cpus_per_gpu=6, memory_gib_per_gpu=40), release_event(r))
    assert await _entries(pool) == expected

    span = {
        "from": (t1 - timedelta(hours=1)).isoformat(),
        "to": (t2 + timedelta(hours=2)).isoformat(),
    }
    report = (await client.get("/v1/costs", params=span, headers=ML_VIEWER)).json()
    (total,) = report["totals"]
    assert {k: Decimal(total[k]) for k in ("cost", "gpu_cost", "cpu_cost", "memory_cost")} == {
        "cost": Decimal("6.79445"),
        "gpu_cost": Decimal("5.84375"),
        "cpu_cost": Decimal("0.51125"),
        "memory_cost": Decimal("0.43945"),
    }
    by_job = await client.get(
        "/v1/costs", params={**span, "group_by": "job"}, headers=ML_VIEWER
    )  # from the ledger, not the rollups: the same figures
    (row,) = by_job.json()["rows"]
    assert (Decimal(row["cpu_seconds"]), Decimal(row["memory_cost"])) == (50490, Decimal("0.43945"))
    job = (await client.get("/v1/jobs/job-c1/cost", headers=ML_VIEWER)).json()
    (allocation,) = job["allocations"]
    assert (allocation["cpus"], allocation["memory_gib"]) == (12, 80)
    assert [Decimal(p["price_per_cpu_hour"]) for p in allocation["prices"]] == [
        Decimal("0.031"),
        Decimal("0.05"),
    ]


async def test_budgets_count_cpu_and_memory_billed_and_running(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    t1 = floor(datetime.now(UTC), "hour") + timedelta(hours=2)
    prices = {"price_per_cpu_hour": "0.05", "price_per_memory_gib_hour": "0.0047"}
    answer = await _put(client, "a100", {**prices, "effective_from": t1.isoformat()})
    assert answer.status_code == 201, answer.text
    # Billed: 1 GPU-h at 2.5, 6 CPU-h at 0.05, 40 GiB-h at 0.0047 = 2.988.
    r = released("b1", t1, timedelta(hours=1), gpus=1)
    await feed(pool, grant_of(r, cpus_per_gpu=6, memory_gib_per_gpu=40), release_event(r))
    budget = Budget("ml", None, Decimal(100), "USD", (50,), "warn", 1, "op", t1)
    months = {month_start(t1), month_start(r.released_at - timedelta(microseconds=1))}
    async with pool.acquire() as conn:
        spent = [await budgets_repository.spent(conn, budget, m, t1) for m in months]
    assert sum(spent) == Decimal("2.988")

    # Running (granted, not released): accrued at the same prices, up to now.
    start = t1 + timedelta(hours=2)
    if month_start(start) != month_start(start + timedelta(hours=1)):
        start += timedelta(hours=2)  # the hour below within one month
    running = released("b2", start, timedelta(hours=2), gpus=1)
    await feed(pool, grant_of(running, cpus_per_gpu=6, memory_gib_per_gpu=40))
    async with pool.acquire() as conn:
        now = start + timedelta(hours=1)
        accrued = await budgets_repository.accrued(conn, budget, month_start(start), now)
    assert accrued == Decimal("2.988")


async def test_cpu_and_memory_without_a_price_are_charged_0_and_said_so(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    start = datetime(2026, 11, 3, 10, tzinfo=UTC)
    r = released("u1", start, timedelta(hours=1), gpus=1, flavor="cpu")
    await feed(pool, grant_of(r, cpus_per_gpu=4, memory_gib_per_gpu=8), release_event(r))
    assert await _entries(pool) == [
        ("u1", "charge", 0, 3600, 14400, None, 0, 28800, None, 0, Decimal("0.1"))
    ]
    span = {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z", "format": "csv"}
    lines = (await client.get("/v1/costs", params=span, headers=ML_VIEWER)).text.splitlines()
    assert lines[0].endswith(
        "unpriced_cpu_seconds,memory_gib_seconds,memory_cost,unpriced_memory_gib_seconds"
    )
    assert lines[1:] == ["USD,3600.000000,0.100000,0.100000,14400.000000,0.000000,14400.000000,"
                         "28800.000000,0.000000,28800.000000"]  # fmt: skip


async def test_cpu_and_memory_prices_are_read_and_checked_like_gpu_prices(
    client: httpx.AsyncClient,
) -> None:
    assert "price_per_gpu_hour" in errors(await _put(client, "a100", {}))
    assert "price_per_cpu_hour" in errors(await _put(client, "a100", {"price_per_cpu_hour": "-1"}))
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    late = await _put(client, "a100", {"price_per_memory_gib_hour": "1", "effective_from": past})
    assert "effective_from" in errors(late)
    assert "flavor" in errors(await _put(client, "l40s", {"price_per_cpu_hour": "1"}))

    now = await _put(client, "a100", {"price_per_memory_gib_hour": "0.002"})
    assert now.status_code == 201, now.text
    listed = (await client.get("/v1/prices", params={"flavor": "a100"}, headers=ML_VIEWER)).json()
    assert [
        (p["price_per_gpu_hour"], p["price_per_memory_gib_hour"], p["in_force"]) for p in listed
    ] == [("2.5", None, True), (None, "0.002", True)]
