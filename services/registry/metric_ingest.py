"""Storing ``job.metrics`` points, in the handler's one transaction per fetched batch.

The summaries of the (job, key) pairs a batch touches and the extremes of the blocks of 64
steps it touches are read ``FOR UPDATE``, merged in Python (``metrics.merge``,
``metrics.merge_extremes``) and written back with one statement each for new and changed
rows; every point goes in with one ``COPY``. Redelivery is the inbox's to drop (event ids).
Tables are unqualified: the pool's ``search_path`` is the ``registry`` schema.

A job has at most ``MAX_METRIC_KEYS`` series: its code chooses its keys, and its metric
summary and every run row of its experiment carry all of them. Points of a key past the
limit are not stored (a warning names the job and how many keys of that batch were left
out, once per job: ``OVER_THE_LIMIT``; the job's metric log keeps them). Batches of one job are stored one after the other (an advisory lock
per job), so concurrent batches cannot both take the last free places."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.registry import metrics
from trainyard_platform.services.registry.metrics import Extremes, Point, Summary
from trainyard_platform.shared.events.payloads import JobMetrics
from trainyard_platform.shared.logs import Throttle, job_scope

Row = Mapping[str, Any]
log = logging.getLogger(__name__)

MAX_METRIC_KEYS = 1000
"""The most metric keys (series) one job may have."""
WARNED_JOBS_KEPT = 10_000
OVER_THE_LIMIT = Throttle(math.inf, max_reasons=WARNED_JOBS_KEPT)
"""The jobs warned about being past ``MAX_METRIC_KEYS``: each once (every later batch of a
job still reporting new keys would repeat it). The last ``WARNED_JOBS_KEPT`` are kept, so
memory stays bounded; a job forgotten that way is warned about once more."""


def over_the_limit(
    new: Sequence[tuple[str, str]], counts: Mapping[str, int], limit: int = MAX_METRIC_KEYS
) -> set[tuple[str, str]]:
    """Of the ``new`` (job, key) series (sorted), those that would take a job past ``limit``
    series, given how many each job has (``counts``): the first come, the rest are left out."""
    taken = dict(counts)
    refused = set()
    for job, key in new:
        if taken.get(job, 0) >= limit:
            refused.add((job, key))
        else:
            taken[job] = taken.get(job, 0) + 1
    return refused


# --- ingest -------------------------------------------------------------------------------

SUMMARY_COLUMNS = (
    "goal, count, first_step, last_step, last_time, last_value, min_value, max_value, "
    "best_value, best_step"
)


def summary_from_row(row: Row) -> Summary:
    return Summary(
        goal=row["goal"],
        count=row["count"],
        first_step=row["first_step"],
        last_step=row["last_step"],
        last_time=row["last_time"],
        last_value=row["last_value"],
        min_value=row["min_value"],
        max_value=row["max_value"],
        best_value=row["best_value"],
        best_step=row["best_step"],
    )


def _columns(s: Summary) -> tuple[Any, ...]:
    return (
        s.goal, s.count, s.first_step, s.last_step, s.last_time, s.last_value, s.min_value,
        s.max_value, s.best_value, s.best_step,
    )  # fmt: skip


async def ingest(conn: asyncpg.Connection, batches: Sequence[JobMetrics]) -> int:
    """Store every point of ``batches`` (in order) and update their summaries; the number of
    points stored."""
    grouped: dict[tuple[str, str], list[Point]] = {}
    for batch in batches:
        for p in batch.points:
            grouped.setdefault((batch.job_id, p.key), []).append(Point(p.step, p.time, p.value))
    if not grouped:
        return 0
    job_ids = sorted({job for job, _ in grouped})
    for job in job_ids:  # in one order, so two transactions never wait on each other
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('registry.metric_series:' || $1, 0))",
            job,
        )
    pairs = sorted(grouped)
    labels = {
        r["job_id"]: r["labels"] or {}
        for r in await conn.fetch(
            "SELECT job_id, spec->'labels' AS labels FROM tracked_jobs WHERE job_id = ANY($1)",
            job_ids,
        )
    }
    existing = {
        (r["job_id"], r["key"]): (r["id"], summary_from_row(r))
        for r in await conn.fetch(
            f"""SELECT s.id, s.job_id, s.key, {SUMMARY_COLUMNS}
                FROM metric_series s
                JOIN unnest($1::text[], $2::text[]) AS k (job_id, key)
                  ON s.job_id = k.job_id AND s.key = k.key
                ORDER BY s.id FOR UPDATE OF s""",
            [j for j, _ in pairs],
            [k for _, k in pairs],
        )
    }
    new = [pair for pair in pairs if pair not in existing]
    if new:
        counts = await conn.fetch(
            "SELECT job_id, count(*) AS n FROM metric_series WHERE job_id = ANY($1) "
            "GROUP BY job_id",
            sorted({job for job, _ in new}),
        )
        refused = over_the_limit(new, {r["job_id"]: r["n"] for r in counts})
        for job in sorted({job for job, _ in refused}):
            if OVER_THE_LIMIT.due(job) is None:
                continue
            with job_scope(job):  # after the batch's events were handled: in no job's scope
                log.warning(
                    "job %s reported more than %d metric keys: %d left out of its series (kept "
                    "in its metric log; said once per job)",
                    job,
                    MAX_METRIC_KEYS,
                    sum(1 for j, _ in refused if j == job),
                )
        pairs = [pair for pair in pairs if pair not in refused]
        for pair in refused:
            del grouped[pair]
        if not grouped:
            return 0
    updates: list[tuple[Any, ...]] = []
    inserts: list[tuple[Any, ...]] = []
    for job, key in pairs:
        found = existing.get((job, key))
        goal = found[1].goal if found else metrics.metric_goal(key, labels.get(job))
        summary = metrics.summarize(grouped[(job, key)], goal)
        if found:
            updates.append((found[0], *_columns(metrics.merge(found[1], summary))))
        else:
            inserts.append((job, key, *_columns(summary)))
    ids = {pair: found[0] for pair, found in existing.items()}
    if inserts:
        rows = await conn.fetch(
            f"""INSERT INTO metric_series (job_id, key, {SUMMARY_COLUMNS})
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[],
                    $5::bigint[], $6::bigint[], $7::timestamptz[], $8::float8[], $9::float8[],
                    $10::float8[], $11::float8[], $12::bigint[])
                RETURNING id, job_id, key""",
            *(list(column) for column in zip(*inserts, strict=True)),
        )
        ids.update({(r["job_id"], r["key"]): r["id"] for r in rows})
    if updates:
        await conn.execute(
            """UPDATE metric_series s SET count = u.count, last_step = u.last_step,
                   last_time = u.last_time, last_value = u.last_value, min_value = u.min_value,
                   max_value = u.max_value, best_value = u.best_value, best_step = u.best_step
               FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
                   $6::timestamptz[], $7::float8[], $8::float8[], $9::float8[], $10::float8[],
                   $11::bigint[])
                 AS u (id, goal, count, first_step, last_step, last_time, last_value,
                       min_value, max_value, best_value, best_step)
               WHERE s.id = u.id""",
            *(list(column) for column in zip(*updates, strict=True)),
        )
    await _update_blocks(conn, {ids[pair]: points for pair, points in grouped.items()})
    records = [
        (ids[pair], p.step, p.at, p.value) for pair, points in grouped.items() for p in points
    ]
    await conn.copy_records_to_table(
        "metric_points", records=records, columns=["series_id", "step", "at", "value"]
    )
    return len(records)


BLOCK_COLUMNS = (
    "count, first_step, first_at, first_value, last_step, last_at, last_value, low_step, "
    "low_at, low_value, high_step, high_at, high_value, nan_step, nan_at"
)
_BLOCK_TYPES = (
    "bigint[], bigint[], timestamptz[], float8[], bigint[], timestamptz[], float8[], bigint[], "
    "timestamptz[], float8[], bigint[], timestamptz[], float8[], bigint[], timestamptz[]"
)


def _point(step: int | None, at: datetime | None, value: float | None) -> Point | None:
    return None if step is None or at is None or value is None else Point(step, at, value)


def extremes_from_row(r: Row) -> Extremes:
    first = _point(r["first_step"], r["first_at"], r["first_value"])
    last = _point(r["last_step"], r["last_at"], r["last_value"])
    assert first is not None and last is not None
    nan = _point(r["nan_step"], r["nan_at"], math.nan)
    return Extremes(
        first,
        last,
        _point(r["low_step"], r["low_at"], r["low_value"]),
        _point(r["high_step"], r["high_at"], r["high_value"]),
        nan,
        r["count"],
    )


def _block_columns(e: Extremes) -> tuple[Any, ...]:
    def parts(p: Point | None) -> tuple[Any, Any, Any]:
        return (None, None, None) if p is None else (p.step, p.at, p.value)

    nan = parts(e.nan)[:2]
    return (e.count, *parts(e.first), *parts(e.last), *parts(e.low), *parts(e.high), *nan)


async def _update_blocks(conn: asyncpg.Connection, by_series: dict[int, list[Point]]) -> None:
    """Merge the points' extremes into their blocks (read ``FOR UPDATE``, merged here)."""
    grouped: dict[tuple[int, int], list[Point]] = {}
    for series_id, points in by_series.items():
        for p in points:
            grouped.setdefault((series_id, metrics.block_of(p.step)), []).append(p)
    keys = sorted(grouped)
    existing = {
        (r["series_id"], r["block"]): extremes_from_row(r)
        for r in await conn.fetch(
            f"""SELECT b.series_id, b.block, {BLOCK_COLUMNS} FROM metric_blocks b
                JOIN unnest($1::bigint[], $2::bigint[]) AS k (series_id, block)
                  ON b.series_id = k.series_id AND b.block = k.block
                ORDER BY b.series_id, b.block FOR UPDATE OF b""",
            [k[0] for k in keys],
            [k[1] for k in keys],
        )
    }
    inserts: list[tuple[Any, ...]] = []
    updates: list[tuple[Any, ...]] = []
    for key in keys:
        new = metrics.extremes(grouped[key])
        if key in existing:
            updates.append((*key, *_block_columns(metrics.merge_extremes(existing[key], new))))
        else:
            inserts.append((*key, *_block_columns(new)))
    if inserts:
        await conn.execute(
            f"""INSERT INTO metric_blocks (series_id, block, {BLOCK_COLUMNS})
                SELECT * FROM unnest($1::bigint[], $2::bigint[], {_numbered(_BLOCK_TYPES, 3)})""",
            *(list(c) for c in zip(*inserts, strict=True)),
        )
    if updates:
        assignments = ", ".join(f"{c} = u.{c}" for c in BLOCK_COLUMNS.split(", "))
        await conn.execute(
            f"""UPDATE metric_blocks b SET {assignments}
                FROM unnest($1::bigint[], $2::bigint[], {_numbered(_BLOCK_TYPES, 3)})
                  AS u (series_id, block, {BLOCK_COLUMNS})
                WHERE b.series_id = u.series_id AND b.block = u.block""",
            *(list(c) for c in zip(*updates, strict=True)),
        )


def _numbered(types: str, first: int) -> str:
    """``$3::bigint[], $4::...`` for a list of array types."""
    return ", ".join(f"${first + i}::{t}" for i, t in enumerate(types.split(", ")))
