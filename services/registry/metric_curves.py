"""Reading metric series: a job's summaries, and a range of one series' points, downsampled
where long (``metrics`` module docstring): from ``metric_blocks`` for buckets of whole
blocks, from the points in SQL for narrower ones; nothing long is loaded into Python."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from trainyard_platform.services.registry import metrics
from trainyard_platform.services.registry.metric_ingest import (
    BLOCK_COLUMNS,
    SUMMARY_COLUMNS,
    extremes_from_row,
    summary_from_row,
)
from trainyard_platform.services.registry.metrics import Point, Summary

# --- reading metrics ----------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    id: int
    job_id: str
    key: str
    summary: Summary


async def series_of_job(conn: asyncpg.Connection, job_id: str) -> list[Series]:
    rows = await conn.fetch(
        f"SELECT id, job_id, key, {SUMMARY_COLUMNS} FROM metric_series WHERE job_id = $1 "
        "ORDER BY key",
        job_id,
    )
    return [Series(r["id"], r["job_id"], r["key"], summary_from_row(r)) for r in rows]


async def series(conn: asyncpg.Connection, job_id: str, key: str) -> Series | None:
    r = await conn.fetchrow(
        f"SELECT id, job_id, key, {SUMMARY_COLUMNS} FROM metric_series "
        "WHERE job_id = $1 AND key = $2",
        job_id,
        key,
    )
    return None if r is None else Series(r["id"], r["job_id"], r["key"], summary_from_row(r))


@dataclass(frozen=True)
class Curve:
    total: int
    """Points in the asked range."""
    downsampled: bool
    points: list[Point]


_ALL_POINTS = """SELECT step, at, value FROM metric_points
    WHERE series_id = $1 AND step BETWEEN $2 AND $3 ORDER BY step, at"""

# Per bucket, the steps of its first and last point, of its min and max (NaN aside; ties: the
# lowest, resp. highest step) and of its first NaN: scalar aggregates over an index-only scan
# and a hash join (arrays carrying whole points cost 3-4 times as much), then the points at
# those steps by index (``_AT_STEPS``).
BUCKETS_QUERY = """WITH b AS (
    SELECT (step - $5) / $4 AS bucket, min(step) AS first, max(step) AS last,
           min(value) FILTER (WHERE value <> 'NaN') AS low,
           max(value) FILTER (WHERE value <> 'NaN') AS high,
           min(step) FILTER (WHERE value = 'NaN') AS nan
    FROM metric_points WHERE series_id = $1 AND step BETWEEN $2 AND $3
    GROUP BY 1)
SELECT b.first, b.last, b.nan, b.low AS low_value, b.high AS high_value,
       min(p.step) FILTER (WHERE p.value = b.low) AS low,
       max(p.step) FILTER (WHERE p.value = b.high) AS high
FROM metric_points p JOIN b ON (p.step - $5) / $4 = b.bucket
WHERE p.series_id = $1 AND p.step BETWEEN $2 AND $3
GROUP BY b.bucket, b.first, b.last, b.nan, b.low, b.high"""
_AT_STEPS = "SELECT step, at, value FROM metric_points WHERE series_id = $1 AND step = ANY($2)"


async def step_range(conn: asyncpg.Connection, series_id: int) -> tuple[int, int] | None:
    row = await conn.fetchrow(
        """SELECT (SELECT step FROM metric_points WHERE series_id = $1 ORDER BY step LIMIT 1),
                  (SELECT step FROM metric_points WHERE series_id = $1
                   ORDER BY step DESC LIMIT 1)""",
        series_id,
    )
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


async def curve(
    conn: asyncpg.Connection,
    s: Series,
    max_points: int,
    from_step: int | None = None,
    to_step: int | None = None,
) -> Curve:
    """The points of ``s`` between the steps (inclusive), downsampled in SQL to about
    ``max_points`` when there are more (``metrics`` module docstring)."""
    bounds = await step_range(conn, s.id)
    if bounds is None:
        return Curve(0, False, [])
    lo = max(bounds[0], from_step if from_step is not None else bounds[0])
    hi = min(bounds[1], to_step if to_step is not None else bounds[1])
    if hi < lo:
        return Curve(0, False, [])
    total = s.summary.count
    if from_step is not None or to_step is not None:
        total = await conn.fetchval(
            "SELECT count(*) FROM metric_points WHERE series_id = $1 AND step BETWEEN $2 AND $3",
            s.id,
            lo,
            hi,
        )
    if total <= max_points:
        rows = await conn.fetch(_ALL_POINTS, s.id, lo, hi)
        return Curve(total, False, [Point(r["step"], r["at"], r["value"]) for r in rows])
    origin, width, by_blocks = metrics.plan(lo, hi, max_points)
    if by_blocks:
        points = await _by_blocks(conn, s.id, lo, hi, origin, width)
    else:
        points = await _by_points(conn, s.id, lo, hi, origin, width)
    return Curve(total, True, points)


BLOCKS_QUERY = f"""SELECT block, {BLOCK_COLUMNS} FROM metric_blocks
    WHERE series_id = $1 AND block BETWEEN $2 AND $3"""
_EDGES = """SELECT step, at, value FROM metric_points WHERE series_id = $1
    AND (step BETWEEN $2 AND $3 OR step BETWEEN $4 AND $5)"""


async def _by_blocks(
    conn: asyncpg.Connection, series_id: int, lo: int, hi: int, origin: int, width: int
) -> list[Point]:
    """Buckets of whole blocks: the blocks inside ``lo..hi`` from ``metric_blocks``, the
    points of the two blocks it cuts through (if it does) from ``metric_points``."""
    b = metrics.BLOCK_STEPS
    first_full = -(-lo // b)  # the first block that starts at or after lo
    last_full = (hi + 1) // b - 1  # the last block that ends at or before hi
    per_bucket: dict[int, list[Point]] = {}

    def add(p: Point | None) -> None:
        if p is not None:
            per_bucket.setdefault((p.step - origin) // width, []).append(p)

    for r in await conn.fetch(BLOCKS_QUERY, series_id, first_full, last_full):
        for p in extremes_from_row(r).points():
            add(p)
    for r in await conn.fetch(
        _EDGES, series_id, lo, min(hi, first_full * b - 1), max(lo, (last_full + 1) * b), hi
    ):
        add(Point(r["step"], r["at"], r["value"]))
    return metrics.pick(
        p for found in per_bucket.values() for p in metrics.extremes(found).points()
    )


async def _by_points(
    conn: asyncpg.Connection, series_id: int, lo: int, hi: int, origin: int, width: int
) -> list[Point]:
    """Buckets narrower than a few blocks: from the points, in SQL (``BUCKETS_QUERY``)."""
    buckets = await conn.fetch(BUCKETS_QUERY, series_id, lo, hi, width, origin)
    steps = {r[k] for r in buckets for k in ("first", "last", "nan", "low", "high")}
    at_step: dict[int, list[Point]] = {}
    for r in await conn.fetch(_AT_STEPS, series_id, [x for x in steps if x is not None]):
        at_step.setdefault(r["step"], []).append(Point(r["step"], r["at"], r["value"]))
    candidates: list[Point | None] = []
    for r in buckets:
        candidates += [
            min(at_step[r["first"]], key=_time),
            max(at_step[r["last"]], key=_time),
            _one(at_step, r["low"], _equal_to(r["low_value"]), min),
            _one(at_step, r["high"], _equal_to(r["high_value"]), max),
            _one(at_step, r["nan"], _is_nan, min),
        ]
    return metrics.pick(candidates)


def _time(p: Point) -> datetime:
    return p.at


def _equal_to(value: float | None) -> Callable[[Point], bool]:
    return lambda p: p.value == value


def _is_nan(p: Point) -> bool:
    return p.value != p.value


def _one(
    at_step: dict[int, list[Point]],
    step: int | None,
    keep: Callable[[Point], bool],
    choose: Callable[..., Point],
) -> Point | None:
    """Of the points at ``step`` that ``keep`` holds for, the earliest (``min``) or latest."""
    if step is None:
        return None
    found = [p for p in at_step.get(step, []) if keep(p)]
    return choose(found, key=_time) if found else None
