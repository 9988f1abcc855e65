"""Billing's SQL for the append-only ledger and its rollups (``billing`` schema).

``append`` is the only writer of both: it inserts entries and adds what they add to the
rollups in the caller's transaction, so a rollup never differs from the sum of the entries
committed with it. ``rebuild_rollups`` recomputes every rollup from the ledger alone.

Rollup rows are shared by many allocations (a team's hour), and billing's replicas apply
batches concurrently, each batch touching rollup rows in its own order: so every writer
first takes one transaction-scoped advisory lock (``ROLLUP_LOCK``), and rollup writes are
serialized instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from trainyard_platform.services.billing.ledger import AMOUNTS, LedgerEntry, rollup_rows

ROLLUP_LOCK = 0x6269_6C6C_726F_6C6C  # "billroll"
"""The advisory lock (transaction scope) held by whoever writes the rollups."""

_COLUMNS = (
    "allocation_id, revision, kind, job_id, team, project, user_name, queue, gpu_flavor, "
    "node_id, attempt, epoch, gpus, started_at, ended_at, outcome, gpu_seconds, "
    "price_per_gpu_hour, currency, cost, event_id, recorded_at, segment, cpus, memory_gib, "
    "cpu_seconds, price_per_cpu_hour, cpu_cost, memory_gib_seconds, "
    "price_per_memory_gib_hour, memory_cost"
)


async def append(
    conn: asyncpg.Connection, entries: Sequence[LedgerEntry], event_id: str, now: datetime
) -> None:
    """Append ``entries`` (recorded for event ``event_id``) and roll them up."""
    await conn.executemany(
        f"INSERT INTO ledger_entries ({_COLUMNS}) VALUES "
        "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, "
        "$19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31)",
        [
            (
                e.allocation_id,
                e.revision,
                e.kind,
                e.job_id,
                e.team,
                e.project,
                e.user,
                e.queue,
                e.gpu_flavor,
                e.node_id,
                e.attempt,
                e.epoch,
                e.gpus,
                e.started_at,
                e.ended_at,
                e.outcome,
                e.gpu_seconds,
                e.price_per_gpu_hour,
                e.currency,
                e.cost,
                event_id,
                now,
                e.segment,
                e.cpus,
                e.memory_gib,
                e.cpu_seconds,
                e.price_per_cpu_hour,
                e.cpu_cost,
                e.memory_gib_seconds,
                e.price_per_memory_gib_hour,
                e.memory_cost,
            )
            for e in entries
        ],
    )
    await add_to_rollups(conn, entries)


async def add_to_rollups(conn: asyncpg.Connection, entries: Sequence[LedgerEntry]) -> None:
    rows = rollup_rows(entries)
    if not rows:
        return
    await conn.execute("SELECT pg_advisory_xact_lock($1)", ROLLUP_LOCK)
    columns = list(zip(*rows, strict=True))
    # One statement, each key once (rollup_rows sums them), locked in key order.
    await conn.execute(
        f"""INSERT INTO cost_rollups AS r (granularity, bucket, team, project, user_name, queue,
                                           gpu_flavor, currency, {", ".join(AMOUNTS)})
            SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[],
                                 $5::text[], $6::text[], $7::text[], $8::text[],
                                 {", ".join(f"${9 + i}::numeric[]" for i in range(len(AMOUNTS)))})
            ON CONFLICT (granularity, bucket, team, project, user_name, queue, gpu_flavor,
                         currency)
            DO UPDATE SET {", ".join(f"{a} = r.{a} + EXCLUDED.{a}" for a in AMOUNTS)}""",
        *[list(c) for c in columns],
    )


async def latest_charges(conn: asyncpg.Connection, allocation_id: str) -> list[LedgerEntry]:
    """The allocation's charges of the highest revision (its current bill, one per
    segment, in segment order); empty when it has none."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM ledger_entries WHERE allocation_id = $1 AND kind = 'charge' "
        "AND revision = (SELECT max(revision) FROM ledger_entries "
        "                WHERE allocation_id = $1 AND kind = 'charge') "
        "ORDER BY segment",
        allocation_id,
    )
    return [LedgerEntry.from_row(r) for r in rows]


async def rollups_stale(conn: asyncpg.Connection) -> bool:
    """True when the rollups must be rebuilt: the ledger has entries but no rollup does
    (after the migration that made the ledger from earlier bills), or a migration marked
    them stale (``cost_rollups_stale``: made by a split since changed). Takes the rollups'
    lock first (for the caller's transaction), so two replicas starting at once rebuild
    once."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", ROLLUP_LOCK)
    return bool(
        await conn.fetchval(
            "SELECT (EXISTS (SELECT 1 FROM ledger_entries) "
            "        AND NOT EXISTS (SELECT 1 FROM cost_rollups)) "
            "OR EXISTS (SELECT 1 FROM cost_rollups_stale)"
        )
    )


async def rebuild_rollups(conn: asyncpg.Connection, batch: int = 5000) -> int:
    """Recompute every rollup from the ledger (in the caller's transaction); returns the
    number of entries folded in. The rollups table is locked meanwhile, so no append can
    interleave. They are no longer stale (``rollups_stale``) once it commits."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", ROLLUP_LOCK)  # appends' order
    await conn.execute("LOCK TABLE cost_rollups IN EXCLUSIVE MODE")
    await conn.execute("DELETE FROM cost_rollups")
    await conn.execute("DELETE FROM cost_rollups_stale")
    folded = 0
    chunk: list[LedgerEntry] = []
    async for row in conn.cursor(f"SELECT {_COLUMNS} FROM ledger_entries ORDER BY entry_id"):
        chunk.append(LedgerEntry.from_row(row))
        if len(chunk) >= batch:
            await add_to_rollups(conn, chunk)
            folded, chunk = folded + len(chunk), []
    await add_to_rollups(conn, chunk)
    return folded + len(chunk)
