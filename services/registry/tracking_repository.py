"""The SQL of experiment tracking: one function per query (or per bulk write), each taking a
connection. Tables are unqualified: the pool's ``search_path`` is the ``registry`` schema.

A batch of ``job.metrics`` events is stored in the handler's one transaction: the summaries
of the (job, key) pairs it touches are read ``FOR UPDATE``, merged in Python
(``metrics.merge``) and written back with one statement each for new and changed rows, and
every point goes in with one ``COPY``. Redelivery is the inbox's to drop (event ids)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from services.registry import metrics
from services.registry.metrics import Extremes, Point, Summary
from shared.events.payloads import JobMetrics, JobSpec, JobStarted, dump

Row = Mapping[str, Any]
Status = Literal["running", "succeeded", "failed", "cancelled"]


def experiment_name(spec: JobSpec) -> str:
    """The experiment a job is a run of: the one its spec names, else its name (so the runs
    of one job name, which are the versions of one model, land together)."""
    return spec.experiment or spec.name


# --- jobs ---------------------------------------------------------------------------------


async def record_started(conn: asyncpg.Connection, started: JobStarted, now: datetime) -> None:
    """Put the job in its experiment (made if new); a later attempt's spec replaces the
    earlier one while the job is running."""
    spec = started.spec
    experiment_id = await conn.fetchval(
        """INSERT INTO experiments (team, project, name, created_at) VALUES ($1, $2, $3, $4)
           ON CONFLICT (team, project, name) DO UPDATE SET name = EXCLUDED.name
           RETURNING id""",
        spec.team,
        spec.project,
        experiment_name(spec),
        now,
    )
    await conn.execute(
        """INSERT INTO tracked_jobs (job_id, experiment_id, team, name, user_name, spec,
                                     status, started_at)
           VALUES ($1, $2, $3, $4, $5, $6, 'running', $7)
           ON CONFLICT (job_id) DO UPDATE SET spec = EXCLUDED.spec
           WHERE tracked_jobs.status = 'running'""",
        started.job_id,
        experiment_id,
        spec.team,
        spec.name,
        spec.user,
        dump(spec),
        started.started_at,
    )


async def record_ended(conn: asyncpg.Connection, job_id: str, status: Status, at: datetime) -> None:
    """The job ended (a job never started here is not tracked)."""
    await conn.execute(
        "UPDATE tracked_jobs SET status = $2, ended_at = $3 WHERE job_id = $1 "
        "AND status = 'running'",
        job_id,
        status,
        at,
    )


async def run_of(conn: asyncpg.Connection, allocation_id: str) -> tuple[str, str] | None:
    """``(job id, node id)`` of a started run (``runs``, from ``job.started``)."""
    row = await conn.fetchrow(
        "SELECT job_id, node_id FROM runs WHERE allocation_id = $1", allocation_id
    )
    return None if row is None else (row["job_id"], row["node_id"])


async def job_team(conn: asyncpg.Connection, job_id: str) -> str | None:
    return await conn.fetchval("SELECT team FROM tracked_jobs WHERE job_id = $1", job_id)  # type: ignore[no-any-return]


# --- ingest -------------------------------------------------------------------------------

_SUMMARY_COLUMNS = (
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
            f"""SELECT s.id, s.job_id, s.key, {_SUMMARY_COLUMNS}
                FROM metric_series s
                JOIN unnest($1::text[], $2::text[]) AS k (job_id, key)
                  ON s.job_id = k.job_id AND s.key = k.key
                ORDER BY s.id FOR UPDATE OF s""",
            [j for j, _ in pairs],
            [k for _, k in pairs],
        )
    }
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
            f"""INSERT INTO metric_series (job_id, key, {_SUMMARY_COLUMNS})
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


_BLOCK_COLUMNS = (
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
            f"""SELECT b.series_id, b.block, {_BLOCK_COLUMNS} FROM metric_blocks b
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
            f"""INSERT INTO metric_blocks (series_id, block, {_BLOCK_COLUMNS})
                SELECT * FROM unnest($1::bigint[], $2::bigint[], {_numbered(_BLOCK_TYPES, 3)})""",
            *(list(c) for c in zip(*inserts, strict=True)),
        )
    if updates:
        assignments = ", ".join(f"{c} = u.{c}" for c in _BLOCK_COLUMNS.split(", "))
        await conn.execute(
            f"""UPDATE metric_blocks b SET {assignments}
                FROM unnest($1::bigint[], $2::bigint[], {_numbered(_BLOCK_TYPES, 3)})
                  AS u (series_id, block, {_BLOCK_COLUMNS})
                WHERE b.series_id = u.series_id AND b.block = u.block""",
            *(list(c) for c in zip(*updates, strict=True)),
        )


def _numbered(types: str, first: int) -> str:
    """``$3::bigint[], $4::...`` for a list of array types."""
    return ", ".join(f"${first + i}::{t}" for i, t in enumerate(types.split(", ")))


# --- reading metrics ----------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    id: int
    job_id: str
    key: str
    summary: Summary


async def series_of_job(conn: asyncpg.Connection, job_id: str) -> list[Series]:
    rows = await conn.fetch(
        f"SELECT id, job_id, key, {_SUMMARY_COLUMNS} FROM metric_series WHERE job_id = $1 "
        "ORDER BY key",
        job_id,
    )
    return [Series(r["id"], r["job_id"], r["key"], summary_from_row(r)) for r in rows]


async def series(conn: asyncpg.Connection, job_id: str, key: str) -> Series | None:
    r = await conn.fetchrow(
        f"SELECT id, job_id, key, {_SUMMARY_COLUMNS} FROM metric_series "
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


BLOCKS_QUERY = f"""SELECT block, {_BLOCK_COLUMNS} FROM metric_blocks
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


# --- experiments and runs -----------------------------------------------------------------

_EXPERIMENT = """SELECT e.id, e.team, e.project, e.name, e.created_at,
        count(j.job_id) AS runs, count(j.job_id) FILTER (WHERE j.status = 'running') AS running,
        max(j.started_at) AS last_started_at
    FROM experiments e LEFT JOIN tracked_jobs j ON j.experiment_id = e.id"""


async def experiments(conn: asyncpg.Connection, team: str | None, project: str | None) -> list[Row]:
    """Experiments of ``team`` (every team's: None), optionally of one project, newest run
    first."""
    return await conn.fetch(  # type: ignore[no-any-return]
        f"""{_EXPERIMENT}
            WHERE ($1::text IS NULL OR e.team = $1) AND ($2::text IS NULL OR e.project = $2)
            GROUP BY e.id ORDER BY max(j.started_at) DESC NULLS LAST, e.id DESC""",
        team,
        project,
    )


async def experiment(conn: asyncpg.Connection, experiment_id: int) -> Row | None:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        f"{_EXPERIMENT} WHERE e.id = $1 GROUP BY e.id", experiment_id
    )


MetricField = Literal["final", "best"]
_COLUMN: Mapping[MetricField, str] = {"final": "last_value", "best": "best_value"}
Comparison = Literal["<", "<=", ">", ">="]


@dataclass(frozen=True)
class RunOrder:
    field: MetricField
    key: str
    descending: bool


@dataclass(frozen=True)
class RunFilter:
    field: MetricField
    key: str
    op: Comparison
    value: float


async def runs(
    conn: asyncpg.Connection,
    experiment_id: int,
    order: RunOrder | None = None,
    where: RunFilter | None = None,
    limit: int = 1000,
    job_ids: Sequence[str] | None = None,
) -> list[Row]:
    """The runs of an experiment (newest first unless ``order``; runs without the metric
    last), each with its tags."""
    # Columns and operators come from the closed sets above, never from the caller.
    sort = "j.started_at DESC"
    if order is not None:
        direction = "DESC" if order.descending else "ASC"
        sort = f"o.{_COLUMN[order.field]} {direction} NULLS LAST, j.started_at DESC"
    condition = "true"
    if where is not None:
        assert where.op in ("<", "<=", ">", ">=")
        condition = f"f.{_COLUMN[where.field]} {where.op} $5::float8"
    return await conn.fetch(  # type: ignore[no-any-return]
        f"""SELECT j.job_id, j.name, j.user_name, j.status, j.started_at, j.ended_at, j.spec,
                   j.note, ARRAY(SELECT tag FROM job_tags t WHERE t.job_id = j.job_id
                                 ORDER BY tag) AS tags
            FROM tracked_jobs j
            LEFT JOIN metric_series o ON o.job_id = j.job_id AND o.key = $2::text
            LEFT JOIN metric_series f ON f.job_id = j.job_id AND f.key = $4::text
            WHERE j.experiment_id = $1 AND ($6::text[] IS NULL OR j.job_id = ANY($6))
              AND ($5::float8 IS NULL OR {condition})
            ORDER BY {sort} LIMIT $3""",
        experiment_id,
        order.key if order else None,
        limit,
        where.key if where else None,
        where.value if where else None,
        list(job_ids) if job_ids is not None else None,
    )


async def final_metrics(conn: asyncpg.Connection, job_ids: Sequence[str]) -> list[Row]:
    return await conn.fetch(  # type: ignore[no-any-return]
        "SELECT job_id, key, goal, last_value, best_value FROM metric_series "
        "WHERE job_id = ANY($1) ORDER BY job_id, key",
        list(job_ids),
    )


# --- tags and notes -----------------------------------------------------------------------


async def add_tag(conn: asyncpg.Connection, job_id: str, tag: str, now: datetime) -> bool:
    """True when the tag is new on the job."""
    added = await conn.fetchval(
        "INSERT INTO job_tags (job_id, tag, added_at) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING RETURNING true",
        job_id,
        tag,
        now,
    )
    return bool(added)


async def remove_tag(conn: asyncpg.Connection, job_id: str, tag: str) -> bool:
    removed = await conn.fetchval(
        "DELETE FROM job_tags WHERE job_id = $1 AND tag = $2 RETURNING true", job_id, tag
    )
    return bool(removed)


async def set_note(conn: asyncpg.Connection, job_id: str, note: str) -> None:
    await conn.execute("UPDATE tracked_jobs SET note = $2 WHERE job_id = $1", job_id, note)


async def tags_and_note(conn: asyncpg.Connection, job_id: str) -> tuple[list[str], str]:
    row = await conn.fetchrow(
        "SELECT note, ARRAY(SELECT tag FROM job_tags t WHERE t.job_id = $1 ORDER BY tag) AS tags "
        "FROM tracked_jobs WHERE job_id = $1",
        job_id,
    )
    assert row is not None
    return list(row["tags"]), row["note"]
