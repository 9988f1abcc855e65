"""The ledger on real PostgreSQL: append-only, attributed, corrected by compensating
entries, and its rollups always the sum of its entries."""

from __future__ import annotations

import asyncio
import random
import shutil
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.integration.billing.conftest import feed, grant_of, release_event
from trainyard_platform.services.billing import ledger_repository as ledger
from trainyard_platform.services.billing import rollups
from trainyard_platform.services.billing.domain import Price, Usage
from trainyard_platform.services.billing.ledger import Attribution, LedgerEntry
from trainyard_platform.services.billing.service import MIGRATIONS, NAME, ensure_rollups
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import parse_envelope
from trainyard_platform.shared.events.payloads import AllocationReleased, CostRecorded
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 23, 20, tzinfo=UTC)


def released(
    allocation_id: str = "a1",
    *,
    job_id: str = "j1",
    team: str = "vision",
    user: str = "ada",
    flavor: str = "a100",
    gpus: int = 2,
    start: datetime = T0,
    length: timedelta = timedelta(hours=1),
    outcome: str = "succeeded",
) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=allocation_id,
        job_id=job_id,
        node_id="node-1",
        team=team,
        user=user,
        gpu_flavor=flavor,
        gpus=gpus,
        granted_at=start,
        released_at=start + length,
        outcome=outcome,  # type: ignore[arg-type]
    )


async def bill(pool: asyncpg.Pool, release: AllocationReleased, **grant: Any) -> None:
    await feed(pool, grant_of(release, **grant), release_event(release))


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_entries SET cost = 0",
        "DELETE FROM ledger_entries",
        "TRUNCATE ledger_entries",
    ],
)
async def test_the_database_refuses_to_change_or_remove_ledger_entries(
    pool: asyncpg.Pool, statement: str
) -> None:
    await bill(pool, released())
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
        await pool.execute(statement)
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries") == 1


async def test_every_entry_carries_its_attribution(pool: asyncpg.Pool) -> None:
    await bill(pool, released(), project="detector", queue="vision-q", epoch=7, attempt=2)
    row = await pool.fetchrow("SELECT * FROM ledger_entries")
    assert {k: row[k] for k in ("team", "project", "user_name", "queue", "gpu_flavor")} == {
        "team": "vision",
        "project": "detector",
        "user_name": "ada",
        "queue": "vision-q",
        "gpu_flavor": "a100",
    }
    assert (row["job_id"], row["allocation_id"], row["epoch"], row["attempt"]) == (
        "j1",
        "a1",
        7,
        2,
    )
    assert (row["kind"], row["revision"], row["cost"]) == ("charge", 0, Decimal("5.000000"))


async def test_an_amended_bill_is_a_reversal_and_a_new_charge(pool: asyncpg.Pool) -> None:
    lost = released(outcome="lost", length=timedelta(minutes=30))
    await bill(pool, lost, queue="q")
    late = released(length=timedelta(hours=2))  # it ran to its end after all
    await feed(pool, release_event(late))
    await feed(pool, release_event(late))  # the same fact again changes nothing
    rows = await pool.fetch(
        "SELECT kind, revision, started_at, ended_at, outcome, gpu_seconds, cost, queue "
        "FROM ledger_entries ORDER BY entry_id"
    )
    assert [(r["kind"], r["revision"], r["outcome"], r["cost"]) for r in rows] == [
        ("charge", 0, "lost", Decimal("2.500000")),
        ("reversal", 0, "lost", Decimal("-2.500000")),
        ("charge", 1, "succeeded", Decimal("10.000000")),
    ]
    assert rows[1]["ended_at"] == rows[0]["ended_at"] == T0 + timedelta(minutes=30)
    assert {r["queue"] for r in rows} == {"q"}
    assert sum(r["cost"] for r in rows) == await pool.fetchval("SELECT cost FROM usage_ledger")
    assert await pool.fetchval(
        "SELECT sum(cost) FROM cost_rollups WHERE granularity = 'hour'"
    ) == Decimal("10")
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 2  # billed, amended
    said = [
        parse_envelope(r["body"]).data
        for r in await pool.fetch("SELECT body FROM outbox ORDER BY seq")
    ]
    assert [(c.cost, c.revision) for c in said if isinstance(c, CostRecorded)] == [
        (2.5, 0),
        (10.0, 1),
    ]


async def _rollups(pool: asyncpg.Pool) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT granularity, bucket, team, project, user_name, queue, gpu_flavor, currency, "
        "gpu_seconds, cost, cpu_seconds, cpu_cost, unpriced_cpu_seconds, memory_gib_seconds, "
        "memory_cost, unpriced_memory_gib_seconds FROM cost_rollups "
        "WHERE gpu_seconds <> 0 OR cost <> 0 OR cpu_seconds <> 0 OR memory_gib_seconds <> 0 "
        "ORDER BY 1, 2, 3, 4, 5, 6, 7, 8"
    )
    return [tuple(r.values()) for r in rows]


async def test_rollups_equal_the_ledger_sum_and_are_rebuilt_identically(
    pool: asyncpg.Pool, database_url: str
) -> None:
    rng = random.Random(14)
    # a100 has CPU prices, changing during the bills, and no memory price (charged 0).
    for at, price in ((datetime(1970, 1, 1, tzinfo=UTC), "0.03"), (T0 + timedelta(days=1), "0.05")):
        await pool.execute(
            "INSERT INTO resource_prices VALUES ('a100', 'cpu', $1, $2, 'USD', 'test', now())",
            at,
            Decimal(price),
        )
    for n in range(60):
        release = released(
            f"a{n}",
            job_id=f"j{n % 9}",
            team=rng.choice(["vision", "nlp", "speech"]),
            user=rng.choice(["ada", "bob"]),
            flavor=rng.choice(["cpu", "a100"]),
            gpus=rng.randint(1, 8),
            start=T0 + timedelta(microseconds=rng.randrange(3 * 86_400 * 10**6)),
            length=timedelta(microseconds=rng.randrange(30 * 3600 * 10**6)),
            outcome=rng.choice(["succeeded", "lost"]),
        )
        await bill(
            pool,
            release,
            project=rng.choice(["p1", "p2"]),
            queue=rng.choice([None, "q"]),
            cpus_per_gpu=rng.choice([0, 4]),
            memory_gib_per_gpu=rng.choice([0, 16]),
        )
        if release.outcome == "lost" and rng.random() < 0.5:
            later = release.model_copy(
                update={
                    "outcome": "succeeded",
                    "released_at": release.released_at + timedelta(hours=1),
                }
            )
            await feed(pool, release_event(later))
    sums = (
        "sum(gpu_seconds), sum(cost), sum(cpu_seconds), sum(cpu_cost), sum(memory_gib_seconds), "
        "sum(memory_cost)"
    )
    per_team = {
        r[0]: tuple(r[1:])
        for r in await pool.fetch(
            f"SELECT team, {sums}, sum(cpu_seconds) FILTER (WHERE price_per_cpu_hour IS NULL), "
            "sum(memory_gib_seconds) FILTER (WHERE price_per_memory_gib_hour IS NULL) "
            "FROM ledger_entries GROUP BY team"
        )
    }
    assert len(per_team) == 3
    assert all(cpu > 0 and memory > 0 for _, _, cpu, _, memory, *_ in per_team.values())
    for unit in ("hour", "day", "month"):
        rolled = {
            r[0]: tuple(r[1:])
            for r in await pool.fetch(
                f"SELECT team, {sums}, sum(unpriced_cpu_seconds), "
                "sum(unpriced_memory_gib_seconds) FROM cost_rollups "
                "WHERE granularity = $1 GROUP BY team",
                unit,
            )
        }
        assert rolled == per_team, unit
    # Each day is exactly its hours, each month exactly its days.
    mismatched = await pool.fetchval(
        """SELECT count(*) FROM (
               SELECT date_trunc('day', bucket, 'UTC') AS day, team, project, user_name, queue,
                      gpu_flavor, sum(cost) AS c
               FROM cost_rollups WHERE granularity = 'hour' GROUP BY 1, 2, 3, 4, 5, 6) h
           FULL JOIN (SELECT * FROM cost_rollups WHERE granularity = 'day') d
             ON d.bucket = h.day AND d.team = h.team AND d.project IS NOT DISTINCT FROM h.project
            AND d.user_name = h.user_name AND d.queue IS NOT DISTINCT FROM h.queue
            AND d.gpu_flavor = h.gpu_flavor
           WHERE h.c IS DISTINCT FROM d.cost"""
    )
    assert mismatched == 0
    kept = await _rollups(pool)
    async with pool.acquire() as conn, conn.transaction():
        folded = await ledger.rebuild_rollups(conn, batch=7)
    assert folded == await pool.fetchval("SELECT count(*) FROM ledger_entries")
    assert await _rollups(pool) == kept
    await pool.execute("UPDATE cost_rollups SET cost = cost + 1")  # derived data gone wrong
    assert await _rollups(pool) != kept
    assert await rollups.rebuild(DatabaseSettings(url=database_url)) == folded
    assert await _rollups(pool) == kept


async def test_rollups_a_migration_marks_stale_are_rebuilt_once_at_start(
    pool: asyncpg.Pool, database_url: str
) -> None:
    """Migration 0012 marks the rollups of an earlier split stale (``cost_rollups_stale``):
    the service's start rebuilds them from the ledger, once, whatever appends came since."""
    for n in range(3):
        await bill(pool, released(f"s{n}", length=timedelta(minutes=50 + 7 * n)))
    kept = await _rollups(pool)
    await pool.execute("DELETE FROM cost_rollups_stale")
    database = DatabaseSettings(url=database_url)
    await ensure_rollups(database)  # not stale: nothing rebuilt
    # An hour as the earlier split could leave it, then the mark the migration leaves.
    await pool.execute("UPDATE cost_rollups SET cost = cost + 0.000001 WHERE granularity = 'hour'")
    await ensure_rollups(database)
    assert await _rollups(pool) != kept
    await pool.execute("INSERT INTO cost_rollups_stale (reason) VALUES ('test')")
    await ensure_rollups(database)
    assert await _rollups(pool) == kept
    assert await pool.fetchval("SELECT count(*) FROM cost_rollups_stale") == 0


async def test_a_start_rebuilds_stale_rollups_however_long_the_rebuild_waits(
    pool: asyncpg.Pool, database_url: str
) -> None:
    """The rebuild at start is not held to the per-statement bound of the service's pool:
    here a replica already rebuilding holds the rollups' lock for longer than that bound,
    and the start waits for it instead of failing (as it would, every time, on a ledger
    whose rebuild takes longer than the bound)."""
    await bill(pool, released())
    kept = await _rollups(pool)
    await pool.execute("INSERT INTO cost_rollups_stale (reason) VALUES ('test')")
    bound = DatabaseSettings(url=database_url, query_timeout_seconds=0.2)
    async with pool.acquire() as other, other.transaction():
        await other.execute("SELECT pg_advisory_xact_lock($1)", ledger.ROLLUP_LOCK)
        start = asyncio.create_task(ensure_rollups(bound))
        await asyncio.sleep(4 * bound.query_timeout_seconds)
        assert not start.done()  # still waiting for the lock, not failed
    await start
    assert await _rollups(pool) == kept
    assert await pool.fetchval("SELECT count(*) FROM cost_rollups_stale") == 0


async def test_bills_from_before_the_ledger_become_charges_with_rollups(
    database_url: str, tmp_path: Path
) -> None:
    earlier = tmp_path / "migrations"
    earlier.mkdir()
    for name in ("0001_init.sql", "0002_announced_allocations.sql"):
        shutil.copy(MIGRATIONS / name, earlier / name)
    async with open_pool(DatabaseSettings(url=database_url), NAME) as pool:
        await migrate(pool, NAME, earlier)
        await pool.execute(
            "INSERT INTO usage_ledger VALUES ('old-1', 'job-0', 'vision', 'ada', 'n1', 'a100', 1, "
            "$1, $2, 'succeeded', 5400, 2.5, 'USD', 3.75, 'ev-1', $2)",
            T0,
            T0 + timedelta(minutes=90),
        )
        await migrate(pool, NAME, MIGRATIONS)
        await ensure_rollups(DatabaseSettings(url=database_url))
        await ensure_rollups(DatabaseSettings(url=database_url))  # once only
        entry = await pool.fetchrow("SELECT * FROM ledger_entries")
        assert (entry["allocation_id"], entry["kind"], entry["cost"]) == (
            "old-1",
            "charge",
            Decimal("3.75"),
        )
        assert (entry["project"], entry["queue"]) == (None, None)
        hours = await pool.fetch(
            "SELECT bucket, cost FROM cost_rollups WHERE granularity = 'hour' ORDER BY bucket"
        )
        assert [(h["bucket"].hour, h["cost"]) for h in hours] == [
            (23, Decimal("1.666667")),  # 23:20 .. 24:00 of 90 minutes
            (0, Decimal("2.083333")),
        ]
        months = await pool.fetch(
            "SELECT bucket, cost FROM cost_rollups WHERE granularity = 'month' ORDER BY bucket"
        )
        assert [(m["bucket"].month, m["cost"]) for m in months] == [
            (11, Decimal("1.666667")),
            (12, Decimal("2.083333")),
        ]


async def test_a_grant_that_never_started_is_billed_up_to_its_release_and_no_further(
    pool: asyncpg.Pool,
) -> None:
    # Its runner could not start it (platform_error) and said so 2.5 s after the grant; the
    # scheduler released it then. Billing bills those 2.5 s of 4 GPUs, nothing after.
    never = released(
        "a9", gpus=4, length=timedelta(seconds=2, microseconds=500_000), outcome="failed"
    )
    await bill(pool, never)
    row = await pool.fetchrow("SELECT started_at, ended_at, gpu_seconds, cost FROM ledger_entries")
    assert (row["started_at"], row["ended_at"]) == (never.granted_at, never.released_at)
    assert row["gpu_seconds"] == Decimal("10.000000")
    assert row["cost"] == Decimal("0.006944")  # 10 GPU-s x 2.5 / 3600 = 0.0069444...


async def test_concurrent_batches_touching_rollups_in_opposite_orders_do_not_deadlock(
    pool: asyncpg.Pool,
) -> None:
    # Two replicas' batches: one bills team ml's allocation then vision's, the other the
    # reverse; each team's rollup rows are locked by the first to write them.
    def entry(n: int, team: str) -> LedgerEntry:
        usage = Usage.from_release(
            released(f"c{n}", team=team, length=timedelta(minutes=30)),
            Price("a100", Decimal("2.5"), "USD"),
        )
        return LedgerEntry.charge(usage, Attribution(), revision=0)

    now = datetime.now(UTC)

    async def other_replica() -> None:
        async with pool.acquire() as conn, conn.transaction():
            await ledger.append(conn, [entry(3, "vision")], "e3", now)
            await ledger.append(conn, [entry(4, "ml")], "e4", now)

    async with pool.acquire() as conn:
        async with conn.transaction():
            await ledger.append(conn, [entry(1, "ml")], "e1", now)
            other = asyncio.create_task(other_replica())
            await asyncio.sleep(0.3)  # the other is at (or waiting for) its first append
            await ledger.append(conn, [entry(2, "vision")], "e2", now)
        await other  # raised DeadlockDetectedError when each held its first team's rows
    months = await pool.fetch(
        "SELECT team, cost FROM cost_rollups WHERE granularity = 'month' ORDER BY team"
    )
    assert [(m["team"], m["cost"]) for m in months] == [
        ("ml", Decimal("5.000000")),
        ("vision", Decimal("5.000000")),
    ]
