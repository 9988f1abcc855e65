"""The SQL of experiment tracking's jobs, experiments, runs, tags and notes: one function
per query, each taking a connection. Tables are unqualified: the pool's ``search_path`` is
the ``registry`` schema. Metric points: ``metric_ingest`` (writes) and ``metric_curves``
(reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from trainyard_platform.shared.events.payloads import JobSpec, JobStarted, dump

Row = Mapping[str, Any]
Status = Literal["running", "succeeded", "failed", "cancelled"]


def experiment_name(spec: JobSpec) -> str:
    """The experiment a job is a run of: the one its spec names, else its name (so the runs
    of one job name, which are the versions of one model, land together)."""
    return spec.experiment or spec.name


# --- jobs ---------------------------------------------------------------------------------


async def record_started(conn: asyncpg.Connection, started: JobStarted, now: datetime) -> None:
    """Put the job in its experiment (made if new); a later attempt's spec replaces the
    earlier one while the job is running. Experiment names are unique in a team and project
    regardless of case, as model names are: a job naming ``Baseline`` where ``baseline``
    exists is a run of ``baseline`` (the unique index on ``lower(name)`` fails a concurrent
    first run of the other spelling, whose event is then redelivered and lands here)."""
    spec = started.spec
    named = experiment_name(spec)
    spelled = await conn.fetchval(
        "SELECT name FROM experiments WHERE team = $1 AND project = $2 "
        "AND lower(name) = lower($3) ORDER BY name = $3 DESC, id LIMIT 1",
        spec.team,
        spec.project,
        named,
    )
    experiment_id = await conn.fetchval(
        """INSERT INTO experiments (team, project, name, created_at) VALUES ($1, $2, $3, $4)
           ON CONFLICT (team, project, name) DO UPDATE SET name = EXCLUDED.name
           RETURNING id""",
        spec.team,
        spec.project,
        spelled or named,
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
    """The job ended (a job never started here is not tracked): its first end, except that
    a success replaces a failure (the scheduler's late success of an attempt on a node it
    had declared lost, the only move out of an end)."""
    await conn.execute(
        "UPDATE tracked_jobs SET status = $2, ended_at = $3 WHERE job_id = $1 "
        "AND (status = 'running' OR (status = 'failed' AND $2 = 'succeeded'))",
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


# --- experiments and runs -----------------------------------------------------------------

_EXPERIMENT = """SELECT e.id, e.team, e.project, e.name, e.created_at,
        count(j.job_id) AS runs, count(j.job_id) FILTER (WHERE j.status = 'running') AS running,
        max(j.started_at) AS last_started_at
    FROM experiments e LEFT JOIN tracked_jobs j ON j.experiment_id = e.id"""


async def experiments(
    conn: asyncpg.Connection,
    team: str | None,
    project: str | None,
    limit: int,
    after: tuple[datetime | None, int] | None = None,
) -> list[Row]:
    """At most ``limit`` experiments of ``team`` (every team's: None), optionally of one
    project, newest run first (then the newest experiment), after the key ``after``
    (``(last_started_at, id)`` of the previous page's last one)."""
    last, last_id = after or (None, None)
    return await conn.fetch(  # type: ignore[no-any-return]
        f"""{_EXPERIMENT}
            WHERE ($1::text IS NULL OR e.team = $1) AND ($2::text IS NULL OR e.project = $2)
            GROUP BY e.id
            HAVING $5::bigint IS NULL OR CASE WHEN $4::timestamptz IS NULL
                THEN max(j.started_at) IS NULL AND e.id < $5
                ELSE max(j.started_at) IS NULL OR max(j.started_at) < $4
                     OR (max(j.started_at) = $4 AND e.id < $5) END
            ORDER BY max(j.started_at) DESC NULLS LAST, e.id DESC LIMIT $3""",
        team,
        project,
        limit,
        last,
        last_id,
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


RunKey = tuple[float | None, datetime, str]
"""Where a page of runs ends: the last run's sort value (None without ``order``, or when it
lacks the metric), its start and its job id."""


async def runs(
    conn: asyncpg.Connection,
    experiment_id: int,
    order: RunOrder | None = None,
    where: RunFilter | None = None,
    limit: int = 1000,
    job_ids: Sequence[str] | None = None,
    after: RunKey | None = None,
) -> list[Row]:
    """At most ``limit`` runs of an experiment (newest first unless ``order``; runs without
    the metric last; ties by start, newest first, then job id), each with its tags and its
    sort value (``sort_value``), after the run at ``after``."""
    # Columns and operators come from the closed sets above, never from the caller.
    sort = "j.started_at DESC, j.job_id DESC"
    beyond = "<"
    if order is not None:
        direction = "DESC" if order.descending else "ASC"
        sort = f"o.{_COLUMN[order.field]} {direction} NULLS LAST, {sort}"
        beyond = "<" if order.descending else ">"
    value = f"o.{_COLUMN[order.field]}" if order is not None else "NULL::float8"
    condition = "true"
    if where is not None:
        assert where.op in ("<", "<=", ">", ">=")
        condition = f"f.{_COLUMN[where.field]} {where.op} $5::float8"
    # Keyset: a run after the cursor's value in sort order (NULLS LAST: a run without the
    # metric comes after every run with it), or of the same value and older.
    tie = "(j.started_at, j.job_id) < ($8::timestamptz, $9::text)"
    past = f"""$9::text IS NULL OR CASE WHEN $7::float8 IS NULL
        THEN {value} IS NULL AND {tie}
        ELSE {value} IS NULL OR {value} {beyond} $7 OR ({value} = $7 AND {tie}) END"""
    cursor_value, cursor_start, cursor_job = after or (None, None, None)
    return await conn.fetch(  # type: ignore[no-any-return]
        f"""SELECT j.job_id, j.name, j.user_name, j.status, j.started_at, j.ended_at, j.spec,
                   j.note, ARRAY(SELECT tag FROM job_tags t WHERE t.job_id = j.job_id
                                 ORDER BY tag) AS tags, {value} AS sort_value
            FROM tracked_jobs j
            LEFT JOIN metric_series o ON o.job_id = j.job_id AND o.key = $2::text
            LEFT JOIN metric_series f ON f.job_id = j.job_id AND f.key = $4::text
            WHERE j.experiment_id = $1 AND ($6::text[] IS NULL OR j.job_id = ANY($6))
              AND ($5::float8 IS NULL OR {condition}) AND ({past})
            ORDER BY {sort} LIMIT $3""",
        experiment_id,
        order.key if order else None,
        limit,
        where.key if where else None,
        where.value if where else None,
        list(job_ids) if job_ids is not None else None,
        cursor_value,
        cursor_start,
        cursor_job,
    )


async def final_metrics(conn: asyncpg.Connection, job_ids: Sequence[str]) -> list[Row]:
    return await conn.fetch(  # type: ignore[no-any-return]
        "SELECT job_id, key, goal, last_value, best_value FROM metric_series "
        "WHERE job_id = ANY($1) ORDER BY job_id, key",
        list(job_ids),
    )


# --- tags and notes -----------------------------------------------------------------------


MAX_RUN_TAGS = 50
"""The most tags a run may have: each row of its experiment's runs carries all of them."""


class TooManyTags(Exception):
    """The run has ``MAX_RUN_TAGS`` tags already."""


async def add_tag(conn: asyncpg.Connection, job_id: str, tag: str, now: datetime) -> bool:
    """True when the tag is new on the job; ``TooManyTags`` when a new one would be past
    ``MAX_RUN_TAGS``. The run's row is locked first, so concurrent tags take turns."""
    held = await conn.fetchval(
        "SELECT (SELECT array_agg(tag) FROM job_tags t WHERE t.job_id = j.job_id) "
        "FROM tracked_jobs j WHERE j.job_id = $1 FOR UPDATE",
        job_id,
    )
    if held and tag not in held and len(held) >= MAX_RUN_TAGS:
        raise TooManyTags(job_id)
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


async def note_to_change(conn: asyncpg.Connection, job_id: str) -> str:
    """The run's note, its row locked until the transaction ends (a change judges its
    conditions on it, then writes, in turn with any other)."""
    note: str = await conn.fetchval(
        "SELECT note FROM tracked_jobs WHERE job_id = $1 FOR UPDATE", job_id
    )
    return note


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
