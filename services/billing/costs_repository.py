"""Billing's SQL for cost reports: from the rollups, or from the ledger when a report needs
the job dimension, and a job's entries. One function per query; rows as ``CostLine``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from trainyard_platform.services.billing.buckets import floor
from trainyard_platform.services.billing.costs import COLUMN, CostQuery, Dimension, pieces
from trainyard_platform.services.billing.ledger import AMOUNTS, LedgerEntry


@dataclass(frozen=True)
class CostLine:
    """One line of a report: a bucket (None without granularity), the grouped dimensions'
    values (in ``group_by`` order), a currency and the sums."""

    bucket: datetime | None
    values: tuple[str | None, ...]
    currency: str
    gpu_seconds: Decimal
    cost: Decimal
    """The whole: GPUs, CPUs and memory."""
    cpu_seconds: Decimal = Decimal(0)
    cpu_cost: Decimal = Decimal(0)
    unpriced_cpu_seconds: Decimal = Decimal(0)
    memory_gib_seconds: Decimal = Decimal(0)
    memory_cost: Decimal = Decimal(0)
    unpriced_memory_gib_seconds: Decimal = Decimal(0)

    @property
    def amounts(self) -> tuple[Decimal, ...]:
        """The sums in the order of ``ledger.AMOUNTS``."""
        return tuple(getattr(self, a) for a in AMOUNTS)


def _filters(query: CostQuery, args: list[Any], skip: Sequence[Dimension] = ()) -> list[str]:
    clauses = []
    for dim, value in sorted(query.filters.items()):
        if dim in skip:
            continue
        args.append(value)
        clauses.append(f"{COLUMN[dim]} = ${len(args)}")
    return clauses


async def from_rollups(conn: asyncpg.Connection, query: CostQuery) -> list[CostLine]:
    """The report from ``cost_rollups`` (``query`` must not need the ledger)."""
    args: list[Any] = []
    ranges = []
    for unit, first, end in pieces(query.start, query.end, query.granularity or "month"):
        args.extend([unit, first, end])
        n = len(args)
        ranges.append(f"(granularity = ${n - 2} AND bucket >= ${n - 1} AND bucket < ${n})")
    where = [f"({' OR '.join(ranges)})", *_filters(query, args)]
    columns = [COLUMN[d] for d in query.group_by]
    bucket = f"date_trunc('{query.granularity}', bucket, 'UTC')" if query.granularity else "NULL"
    keys = [*columns, "currency", "b"]
    sums = ", ".join(f"sum({a}) AS {a}" for a in AMOUNTS)
    rows = await conn.fetch(
        f"SELECT {bucket}::timestamptz AS b, {', '.join([*columns, 'currency'])}, "
        f"{sums} FROM cost_rollups WHERE {' AND '.join(where)} GROUP BY {', '.join(keys)}",
        *args,
    )
    return [
        CostLine(r["b"], tuple(r[c] for c in columns), r["currency"], *(r[a] for a in AMOUNTS))
        for r in rows
        if any(r[a] for a in AMOUNTS)
    ]


_ENTRY = (
    "allocation_id, revision, kind, job_id, team, project, user_name, queue, gpu_flavor, "
    "node_id, attempt, epoch, gpus, started_at, ended_at, outcome, gpu_seconds, "
    "price_per_gpu_hour, currency, cost, segment, cpus, memory_gib, cpu_seconds, "
    "price_per_cpu_hour, cpu_cost, memory_gib_seconds, price_per_memory_gib_hour, memory_cost"
)


async def from_ledger(conn: asyncpg.Connection, query: CostQuery) -> list[CostLine]:
    """The report from the ledger entries overlapping the range, split per hour as the
    rollups split them (``LedgerEntry.hour_parts``)."""
    args: list[Any] = [query.end, query.start]
    where = ["started_at < $1", "ended_at > $2", *_filters(query, args)]
    sums: dict[tuple[Any, ...], tuple[Decimal, ...]] = {}
    columns = [COLUMN[d] for d in query.group_by]
    async for row in conn.cursor(
        f"SELECT {_ENTRY} FROM ledger_entries WHERE {' AND '.join(where)}", *args
    ):
        entry = LedgerEntry.from_row(row)
        values = tuple(row[c] for c in columns)
        for hour, parts in entry.hour_parts():
            if not query.start <= hour < query.end:
                continue
            bucket = floor(hour, query.granularity) if query.granularity else None
            key = (bucket, values, entry.currency)
            held = sums.get(key)
            sums[key] = (
                parts if held is None else tuple(h + p for h, p in zip(held, parts, strict=True))
            )
    return [
        CostLine(bucket, values, currency, *amounts)
        for (bucket, values, currency), amounts in sums.items()
        if any(amounts)
    ]


async def report(conn: asyncpg.Connection, query: CostQuery) -> list[CostLine]:
    """The report's lines, by bucket, then most expensive first, then by dimension values."""
    lines = await (from_ledger(conn, query) if query.needs_ledger else from_rollups(conn, query))
    return sorted(
        lines,
        key=lambda line: (
            line.bucket or datetime.min,
            -line.cost,
            tuple("" if v is None else v for v in line.values),
            line.currency,
        ),
    )


async def job_entries(conn: asyncpg.Connection, job_id: str) -> list[LedgerEntry]:
    """Every ledger entry of a job, in the order they were appended, but those of its
    allocations charged to the platform (a team charge reversed: nothing of the team's)."""
    rows = await conn.fetch(
        f"SELECT {_ENTRY} FROM ledger_entries WHERE job_id = $1 AND allocation_id NOT IN "
        "(SELECT allocation_id FROM usage_ledger WHERE job_id = $1 "
        "AND charged_to = 'platform') ORDER BY entry_id",
        job_id,
    )
    return [LedgerEntry.from_row(r) for r in rows]
