"""The SQL of experiment tracking: one function per query (or per bulk write), each taking a
connection. Tables are unqualified: the pool's ``search_path`` is the ``registry`` schema.

A batch of ``job.metrics`` events is stored in the handler's one transaction: the summaries
of the (job, key) pairs it touches are read ``FOR UPDATE``, merged in Python
(``metrics.merge``) and written back with one statement each for new and changed rows, and
every point goes in with one ``COPY``. Redelivery is the inbox's to drop (event ids)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import asyncpg

from services.registry import metrics
from services.registry.metrics import Point, Summary
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
    records = [
        (ids[pair], p.step, p.at, p.value) for pair, points in grouped.items() for p in points
    ]
    await conn.copy_records_to_table(
        "metric_points", records=records, columns=["series_id", "step", "at", "value"]
    )
    return len(records)


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

# Per bucket: first and last (by step, then time), min and max (NaN aside; ties: lowest,
# resp. highest step) and the first NaN, as float8 arrays that carry the point along.
_BUCKETS = """SELECT
    min(ARRAY[step, t, value]) AS first,
    max(ARRAY[step, t, value]) AS last,
    min(ARRAY[value, step, t]) FILTER (WHERE value <> 'NaN') AS low,
    max(ARRAY[value, step, t]) FILTER (WHERE value <> 'NaN') AS high,
    min(ARRAY[step, t]) FILTER (WHERE value = 'NaN') AS nan
  FROM (SELECT step::float8 AS step, extract(epoch FROM at)::float8 AS t, value,
               (step - $2) / $4 AS bucket
        FROM metric_points WHERE series_id = $1 AND step BETWEEN $2 AND $3) AS p
  GROUP BY bucket"""


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
    width = metrics.bucket_width(lo, hi, metrics.bucket_count(max_points))
    rows = await conn.fetch(_BUCKETS, s.id, lo, hi, width)
    candidates: list[Point | None] = []
    for r in rows:
        for name in ("first", "last"):
            step, t, value = r[name]
            candidates.append(Point(int(step), _at(t), value))
        for name in ("low", "high"):
            if r[name] is not None:
                value, step, t = r[name]
                candidates.append(Point(int(step), _at(t), value))
        if r["nan"] is not None:
            step, t = r["nan"]
            candidates.append(Point(int(step), _at(t), float("nan")))
    return Curve(total, True, metrics.pick(candidates))


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


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
