"""Waste rollups: the allocation figures per hour, kept as facts arrive; and their rebuild.

``python -m trainyard_platform.services.billing.waste_rollups`` recomputes them from billing's facts (exit
status 0; 1 when the database cannot be reached or refuses; 2 for a bad setting).

Contract (docs/billing.md, "Waste rollups"):
- The figures of one released allocation (``waste.allocation_pieces``: idle and unmeasured
  GPUs, input-bound and unmeasured time, failed attempts, platform failures, lost work) are split at UTC hours
  and at its flavor's price changes into ``waste_allocation_parts`` (exact GPU-microseconds
  times the figure's share, wall microseconds; ``starts``: the figure's interval starts in
  that hour, ``continues``: it covers the hour's start), and summed into
  ``waste_rollups_hourly`` by hour, figure, attribution (team, project, user, queue, flavor
  as announced) and price. ``refresh(conn, allocation_ids)`` replaces the parts of those
  allocations and applies the difference to the rollups, in the caller's transaction: the
  consumer calls it with every fact that changes them (a release or an amended release, a
  run report, a checkpoint), so the rollups always equal the sum of the parts.
- A piece is priced as the on-demand report prices it from its own start: split at the
  price changes after it, all unpriced when its flavor had no price at its start. A part
  kept unpriced is priced when read if the flavor has a price at its hour by then (a
  flavor's first price applies from the beginning).
- ``read(conn, query, until)`` sums the rollups of ``[query.start, until)`` (whole hours)
  into the report's tallies, grouped like the report: the same GPU-seconds, money, wall
  time and count as ``waste_report`` computes from the pieces (a piece counts once: in the
  hour it starts, or at the range's first hour when it covers it). Not for the job
  dimension (the rollups have none: the report computes those from the facts).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal, localcontext
from typing import Any

import asyncpg

from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing.buckets import floor
from trainyard_platform.services.billing.costs import CostQuery, Dimension
from trainyard_platform.services.billing.prices import PriceSchedule
from trainyard_platform.services.billing.waste import (
    MICROSECOND,
    Allocation,
    Figure,
    Owner,
    Piece,
    Pricer,
    Tally,
    allocation_pieces,
)
from trainyard_platform.shared.db import DATABASE_FAULTS

HOUR = timedelta(hours=1)
ROLLED: frozenset[Figure] = frozenset(
    {
        "idle_gpus",
        "idle_gpus_unmeasured",
        "input_bound",
        "input_bound_unmeasured",
        "failed_attempts",
        "platform_failure",
        "lost_work",
    }
)
"""The figures the rollups hold (those of one allocation's own facts)."""
COLUMNS: dict[Dimension, str] = {
    "team": "team",
    "project": "project",
    "user": "user_name",
    "queue": "queue",
    "flavor": "gpu_flavor",
}
"""The rollups' attribution columns, by report dimension (no job)."""


def allocation_of(r: Mapping[str, Any]) -> Allocation:
    return Allocation(
        allocation_id=r["allocation_id"],
        owner=Owner(
            r["team"], r["project"], r["user_name"], r["queue"], r["gpu_flavor"], r["job_id"]
        ),
        gpus=r["gpus"],
        granted_at=r["granted_at"],
        ended_at=r["ended_at"],
        outcome=r["outcome"],
        attempt=r["attempt"],
        priority=r["priority"],
        gpu_utilization=_finite(r["gpu_utilization_mean"]),
        data_wait_fraction=_finite(r["data_wait_fraction_mean"]),
        last_checkpoint=r["last_checkpoint"],
        failure_kind=r["failure_kind"],
    )


def _finite(measured: Decimal | None) -> Decimal | None:
    """A stored measurement, None (unmeasured) when no finite number: a NaN recorded before
    billing refused them would fail every rollup of its allocation."""
    return measured if measured is None or measured.is_finite() else None


PART_COLUMNS = (
    "allocation_id", "hour", "figure", "price_per_gpu_hour", "gpu_micros", "wall_micros",
    "starts", "continues",
)  # fmt: skip
PartKey = tuple[datetime, str, Decimal | None]
PartRow = tuple[Decimal, int, int, int]


def split(piece: Piece, pricer: Pricer) -> dict[PartKey, PartRow]:
    """``piece`` per UTC hour and price: (hour, figure, price) -> (GPU-microseconds times
    the share, wall microseconds, starts, continues)."""
    out: dict[PartKey, PartRow] = {}
    priced = pricer.parts(piece.flavor, piece.start, piece.start + MICROSECOND)[0][1] is not None
    hour = floor(piece.start, "hour")
    with localcontext(prec=60):
        while hour < piece.end:
            lo, hi = max(hour, piece.start), min(hour + HOUR, piece.end)
            for micros, per_hour in pricer.parts(piece.flavor, lo, hi):
                key = (hour, piece.figure, per_hour if priced else None)
                gpu, wall, starts, continues = out.get(key, (Decimal(0), 0, 0, 0))
                out[key] = (
                    gpu + Decimal(micros * piece.gpus) * piece.share,
                    wall + micros,
                    starts,
                    continues,
                )
            first = next(k for k in out if k[0] == hour)
            gpu, wall, starts, continues = out[first]
            if lo == piece.start:
                out[first] = (gpu, wall, starts + 1, continues)
            else:
                out[first] = (gpu, wall, starts, continues + 1)
            hour += HOUR
    return out


def parts(allocation: Allocation, pricer: Pricer) -> dict[PartKey, PartRow]:
    """Every rolled-up figure of ``allocation`` per hour and price (one piece per figure)."""
    out: dict[PartKey, PartRow] = {}
    for piece in allocation_pieces(allocation):
        out.update(split(piece, pricer))
    return out


OWN_REPORT = """r.allocation_id = a.allocation_id AND r.job_id = a.job_id
    AND r.node_id = a.node_id AND r.epoch = coalesce(a.epoch, -1)"""
"""Whether run report ``r`` is announced allocation ``a``'s own: about its job, from the node
it was granted on, at its epoch (as the scheduler fences a runner's reports). Any other
report, however it came, measures nothing."""

FAILURE_KIND = """CASE WHEN u.charged_to = 'platform' THEN 'platform_error'
    ELSE r.failure_kind END"""
"""The ``failure_kind`` of allocation ``a`` (``u``: its bill; ``r``: its own run report):
``platform_error`` for one charged to the platform (its own runner said so, or the scheduler
released its whole attempt, a gang's every member, for a member's platform failure), else
what its own runner reported: its time is the platform's in the waste report as in its bill."""

LAST_CHECKPOINT = """(SELECT max(c.saved_at) FROM waste_checkpoints c
    JOIN announced_allocations ca ON ca.allocation_id = c.allocation_id
    WHERE c.job_id = a.job_id AND ca.job_id = a.job_id AND c.epoch = coalesce(ca.epoch, -1)
      AND ca.attempt IS NOT DISTINCT FROM a.attempt AND c.saved_at >= a.granted_at
      AND (u.ended_at IS NULL OR c.saved_at <= u.ended_at))"""
"""The latest checkpoint that saves allocation ``a``'s work (``u``: its bill): saved during
it, by an allocation of its job and attempt (a gang's members share one) at that
allocation's own epoch; a checkpoint said under another job's allocation, another epoch or
by an older attempt's runner saves nothing of it."""

_ALLOCATIONS = f"""
SELECT a.allocation_id, a.job_id, a.team, a.project, a.user_name, a.queue, a.gpu_flavor,
       a.gpus, a.granted_at, a.attempt, u.ended_at, u.outcome, NULL AS priority,
       r.gpu_utilization_mean, r.data_wait_fraction_mean, {FAILURE_KIND} AS failure_kind,
       {LAST_CHECKPOINT} AS last_checkpoint
FROM announced_allocations a
JOIN usage_ledger u USING (allocation_id)
LEFT JOIN waste_run_reports r ON {OWN_REPORT}
"""
"""Released allocations with what the allocation figures need."""

_UPSERT = """
INSERT INTO waste_rollups_hourly (hour, figure, team, project, user_name, queue, gpu_flavor,
                                  price_per_gpu_hour, gpu_micros, wall_micros, starts, continues)
SELECT p.hour, p.figure, a.team, a.project, a.user_name, a.queue, a.gpu_flavor,
       p.price_per_gpu_hour, sum(sign * p.gpu_micros), sum(sign * p.wall_micros),
       sum(sign * p.starts), sum(sign * p.continues)
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::numeric[], $5::numeric[],
            $6::bigint[], $7::int[], $8::int[], $9::int[])
     AS p(allocation_id, hour, figure, price_per_gpu_hour, gpu_micros, wall_micros, starts,
          continues, sign)
JOIN announced_allocations a USING (allocation_id)
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
ON CONFLICT (hour, figure, team, project, user_name, queue, gpu_flavor, price_per_gpu_hour)
DO UPDATE SET gpu_micros = waste_rollups_hourly.gpu_micros + EXCLUDED.gpu_micros,
              wall_micros = waste_rollups_hourly.wall_micros + EXCLUDED.wall_micros,
              starts = waste_rollups_hourly.starts + EXCLUDED.starts,
              continues = waste_rollups_hourly.continues + EXCLUDED.continues
"""


def _columns(rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(9)]


async def refresh(conn: asyncpg.Connection, allocation_ids: Iterable[str]) -> None:
    """Recompute the parts of these allocations and move the rollups by the difference
    (module contract); in the caller's transaction."""
    ids = sorted(set(allocation_ids))
    if not ids:
        return
    # One writer per allocation at a time: its old parts are read and replaced whole.
    await conn.execute(
        "SELECT 1 FROM announced_allocations WHERE allocation_id = ANY($1::text[]) "
        "ORDER BY allocation_id FOR UPDATE",
        ids,
    )
    old = await conn.fetch(
        "DELETE FROM waste_allocation_parts WHERE allocation_id = ANY($1::text[]) RETURNING *",
        ids,
    )
    pricer = Pricer(await catalogue.schedule(conn))
    new: list[tuple[Any, ...]] = []
    for r in await conn.fetch(f"{_ALLOCATIONS} WHERE a.allocation_id = ANY($1::text[])", ids):
        allocation = allocation_of(r)
        for (hour, figure, price), (gpu, wall, starts, continues) in parts(
            allocation, pricer
        ).items():
            new.append(
                (allocation.allocation_id, hour, figure, price, gpu, wall, starts, continues)
            )
    if new:
        await conn.executemany(
            """INSERT INTO waste_allocation_parts (allocation_id, hour, figure,
                   price_per_gpu_hour, gpu_micros, wall_micros, starts, continues)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
            new,
        )
    deltas = [(*(r[c] for c in PART_COLUMNS), -1) for r in old] + [(*row, 1) for row in new]
    if deltas:
        await conn.execute(_UPSERT, *_columns(deltas))


async def refresh_job(conn: asyncpg.Connection, job_id: str) -> None:
    """A checkpoint of the job: its allocations' lost work may change."""
    ids = await conn.fetch(
        "SELECT allocation_id FROM announced_allocations WHERE job_id = $1", job_id
    )
    await refresh(conn, (r["allocation_id"] for r in ids))


async def rebuild_all(conn: asyncpg.Connection) -> int:
    """Empty the parts and rollups and compute them again from every released allocation,
    in the caller's transaction (the tables locked); how many allocations."""
    await conn.execute("LOCK TABLE waste_allocation_parts, waste_rollups_hourly IN EXCLUSIVE MODE")
    await conn.execute("TRUNCATE waste_allocation_parts, waste_rollups_hourly")
    pricer = Pricer(await catalogue.schedule(conn))
    rows: list[tuple[Any, ...]] = []
    count = 0
    async with conn.transaction():
        async for r in conn.cursor(_ALLOCATIONS, prefetch=5000):
            count += 1
            allocation = allocation_of(r)
            for (hour, figure, price), row in parts(allocation, pricer).items():
                rows.append((allocation.allocation_id, hour, figure, price, *row))
    await conn.copy_records_to_table(
        "waste_allocation_parts",
        records=rows,
        columns=list(PART_COLUMNS),
    )
    await conn.execute(
        """INSERT INTO waste_rollups_hourly (hour, figure, team, project, user_name, queue,
               gpu_flavor, price_per_gpu_hour, gpu_micros, wall_micros, starts, continues)
           SELECT p.hour, p.figure, a.team, a.project, a.user_name, a.queue, a.gpu_flavor,
                  p.price_per_gpu_hour, sum(p.gpu_micros), sum(p.wall_micros),
                  sum(p.starts), sum(p.continues)
           FROM waste_allocation_parts p JOIN announced_allocations a USING (allocation_id)
           GROUP BY 1, 2, 3, 4, 5, 6, 7, 8"""
    )
    return count


def _price(book: PriceSchedule, flavor: str | None, hour: datetime) -> Decimal | None:
    dated = book.by_flavor.get(flavor or "", ())
    found = None
    for d in dated:
        if d.effective_from <= hour:
            found = d.price.per_gpu_hour
    return found


async def read(
    conn: asyncpg.Connection, query: CostQuery, until: datetime, book: PriceSchedule
) -> dict[tuple[tuple[str | None, ...], Figure], Tally]:
    """The rolled-up figures of ``[query.start, until)`` as the report's tallies, keyed by
    the values of ``query.group_by`` and the figure (module contract)."""
    if "job" in query.group_by or "job" in query.filters:
        raise ValueError("the waste rollups have no job dimension")
    if until <= query.start:
        return {}
    args: list[Any] = [query.start, until]
    where = ["hour >= $1", "hour < $2"]
    for dim, value in query.filters.items():
        args.append(value)
        where.append(f"{COLUMNS[dim]} IS NOT DISTINCT FROM ${len(args)}")
    dims = [COLUMNS[d] for d in query.group_by]
    select = ", ".join([*dims, "figure", "price_per_gpu_hour", "gpu_flavor"])
    rows = await conn.fetch(
        f"""SELECT {select},
                   CASE WHEN price_per_gpu_hour IS NULL THEN hour END AS unpriced_hour,
                   sum(gpu_micros) AS gpu_micros, sum(wall_micros) AS wall_micros,
                   sum(starts) + coalesce(sum(continues) FILTER (WHERE hour = $1), 0) AS count
            FROM waste_rollups_hourly WHERE {" AND ".join(where)}
            GROUP BY {select}, unpriced_hour""",
        *args,
    )
    out: dict[tuple[tuple[str | None, ...], Figure], Tally] = {}
    for r in rows:
        key = (tuple(r[c] for c in dims), r["figure"])
        tally = out.get(key)
        if tally is None:
            tally = out[key] = Tally()
        price = r["price_per_gpu_hour"]
        if price is None:  # unpriced when kept: priced now if the flavor has a price by then
            price = _price(book, r["gpu_flavor"], r["unpriced_hour"])
        with localcontext(prec=60):
            tally.by_price[price] = tally.by_price.get(price, Decimal(0)) + r["gpu_micros"]
        tally.wall_micros += r["wall_micros"]
        tally.count += r["count"]
    return out


def main(argv: list[str] | None = None) -> int:
    from trainyard_platform.services.billing.service import MIGRATIONS, NAME
    from trainyard_platform.shared.db import migrate, open_pool
    from trainyard_platform.shared.logs import error_text
    from trainyard_platform.shared.runtime import settings_or_exit
    from trainyard_platform.shared.settings import DatabaseSettings

    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.services.billing.waste_rollups",
        description="Recompute billing's hourly waste rollups from its facts "
        "(the database from TRAINYARD_DATABASE_URL).",
    )
    parser.parse_args(argv)
    database = settings_or_exit(parser.prog, DatabaseSettings)

    async def run() -> int:
        async with open_pool(database, NAME, long_statements=True) as pool:
            await migrate(pool, NAME, MIGRATIONS)
            async with pool.acquire() as conn, conn.transaction():
                return await rebuild_all(conn)

    try:
        folded = asyncio.run(run())
    except DATABASE_FAULTS as exc:
        print(
            f"{parser.prog}: cannot rebuild the waste rollups: {error_text(exc)}", file=sys.stderr
        )
        return 1
    print(f"waste rollups rebuilt from {folded} released allocations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
