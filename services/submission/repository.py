"""SQL of the submission service: one function per query, each on a given connection.

Every query a user's request runs is scoped by the caller's team (``team_id`` is always a
parameter and always in the WHERE clause). Queries run by event handlers address a job by
its id: events come from the platform, not from a user.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.submission.domain import TERMINAL, JobStatus
from trainyard_platform.services.submission.governance import screening_unchanged

# --- jobs, as users see them (always scoped by team) ---------------------------------


def _insert_job_sql(*, announced: bool, caller_check: str | None = None) -> str:
    """One statement storing a QUEUED job (``$1``-``$8``: id, team, user, name, spec,
    idempotency key, submitted at, trace id) and its first history entry (``submitted``),
    skipped when this user already used the idempotency key; with ``announced``, also the
    outbox row of its ``job.submitted`` event (``$9``-``$12``); with ``caller_check`` (a
    ``SELECT`` of one row or none), only if that finds its row. The history entry's reason
    is the next to last parameter (``governance.lowered_reason``), the request's fingerprint
    (``schemas.request_fingerprint``) the last. The three statements the functions below
    send are made here once, from these fixed fragments."""
    row = "$1, $2, $3, $4, $5, 'QUEUED', $6, $7, $7, $8"
    # After the job's 8, the event's 4 and the caller check's 7 parameters.
    last = 9 + (4 if announced else 0) + (7 if caller_check else 0)
    reason = f"${last}::text"
    row += f", ${last + 1}::text"
    parts = [f"caller AS ({caller_check})"] if caller_check else []
    parts += [
        f"""job AS (
               INSERT INTO jobs (id, team_id, user_id, name, spec, status, idempotency_key,
                                 submitted_at, updated_at, trace_id, request_fingerprint)
               {f"SELECT {row} FROM caller" if caller_check else f"VALUES ({row})"}
               ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING id)""",
        f"""history AS (
               INSERT INTO job_history (job_id, status, at, reason)
               SELECT id, 'QUEUED', $7, {reason} FROM job RETURNING 1)""",
    ]
    stored = "history"
    if announced:
        parts.append(
            """event AS (
               INSERT INTO outbox (event_id, subject, body, headers)
               SELECT $9, $10, $11, $12 FROM job RETURNING 1)"""
        )
        stored = "event"
    held = "EXISTS (SELECT 1 FROM caller)" if caller_check else "true"
    return f"""WITH {", ".join(parts)}
           SELECT {held} AS held, EXISTS (SELECT 1 FROM {stored}) AS stored"""


def _caller_held(
    token_hash: str,
    token_id: str,
    user_id: str,
    team_id: str,
    role: str,
    screening: tuple[str, str, str, str],
) -> str:
    """A ``SELECT`` of one row or none: the token (by hash and id) is still valid (not
    revoked, not expired, its user not disabled) and still that user's of that team with
    that role, and the team's ``screening`` (``(month, declared, retired, budgets)``, as
    ``governance.screening_unchanged`` takes them) is unchanged. Each argument is an SQL
    expression (a parameter, or a column of the rows a batch writes)."""
    return f"""SELECT 1 FROM tokens k JOIN users u ON u.id = k.user_id
                 JOIN teams t ON t.id = u.team_id
               WHERE k.token_hash = {token_hash} AND k.id = {token_id} AND u.id = {user_id}
                 AND t.id = {team_id}
                 AND u.role = {role} AND k.revoked_at IS NULL AND u.disabled_at IS NULL
                 AND (k.expires_at IS NULL OR k.expires_at > now())
                 AND {screening_unchanged("t.name", *screening)}"""


_INSERT_JOB = _insert_job_sql(announced=False)
_INSERT_JOB_ANNOUNCED = _insert_job_sql(announced=True)
_INSERT_JOB_IF_CALLER = _insert_job_sql(
    announced=True,
    caller_check=_caller_held("$13", "$14", "$3", "$2", "$15", ("$16", "$17", "$18", "$19")),
)

_BATCH_COLUMNS = (
    ("id", "text"),
    ("team_id", "bigint"),
    ("user_id", "bigint"),
    ("name", "text"),
    ("spec", "text"),
    ("idempotency_key", "text"),
    ("submitted_at", "timestamptz"),
    ("trace_id", "text"),
    ("event_id", "text"),
    ("subject", "text"),
    ("body", "bytea"),
    ("headers", "text"),
    ("token_hash", "text"),
    ("token_id", "bigint"),
    ("role", "text"),
    ("month", "text"),
    ("declared", "text"),
    ("retired", "text"),
    ("budgets", "text"),
    ("reason", "text"),
    ("request_fingerprint", "text"),
)
"""The columns of the rows ``insert_jobs_if_callers`` writes, one array parameter each
(``spec`` and ``headers`` as JSON text, ``declared`` and ``retired`` as array literals:
``unnest`` would flatten arrays of arrays)."""

_BATCH_ARRAYS = ", ".join(f"${n}::{kind}[]" for n, (_, kind) in enumerate(_BATCH_COLUMNS, 1))
_BATCH_NAMES = ", ".join(name for name, _ in _BATCH_COLUMNS)
_BATCH_CALLER_HELD = _caller_held(
    "r.token_hash",
    "r.token_id",
    "r.user_id",
    "r.team_id",
    "r.role",
    ("r.month", "r.declared", "r.retired", "r.budgets"),
)
_INSERT_JOBS_IF_CALLERS = f"""WITH r AS (
       SELECT * FROM unnest({_BATCH_ARRAYS}) WITH ORDINALITY AS r({_BATCH_NAMES}, ord)),
   caller AS (SELECT r.* FROM r WHERE EXISTS ({_BATCH_CALLER_HELD})),
   first AS (
       SELECT c.* FROM caller c
       WHERE c.idempotency_key IS NULL OR NOT EXISTS (
           SELECT 1 FROM caller e WHERE e.user_id = c.user_id
             AND e.idempotency_key = c.idempotency_key AND e.ord < c.ord)),
   job AS (
       INSERT INTO jobs (id, team_id, user_id, name, spec, status, idempotency_key,
                         submitted_at, updated_at, trace_id, request_fingerprint)
       SELECT id, team_id, user_id, name, spec::jsonb, 'QUEUED', idempotency_key,
              submitted_at, submitted_at, trace_id, request_fingerprint
       FROM first ORDER BY user_id, idempotency_key, ord
       ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING id),
   history AS (
       INSERT INTO job_history (job_id, status, at, reason)
       SELECT c.id, 'QUEUED', c.submitted_at, c.reason FROM job JOIN caller c USING (id)
       RETURNING 1),
   event AS (
       INSERT INTO outbox (event_id, subject, body, headers)
       SELECT c.event_id, c.subject, c.body, c.headers::jsonb FROM job JOIN caller c USING (id)
       ORDER BY c.ord RETURNING 1)
   SELECT r.id IN (SELECT id FROM caller) AS held, r.id IN (SELECT id FROM job) AS stored
   FROM r ORDER BY r.ord"""


async def insert_job(
    conn: asyncpg.Connection,
    job_id: str,
    team_id: int,
    user_id: int,
    name: str,
    spec: dict[str, Any],
    idempotency_key: str | None,
    submitted_at: datetime,
    trace_id: str | None = None,
    reason: str = "submitted",
    fingerprint: str | None = None,
) -> bool:
    """Store a QUEUED job and its first history entry (``reason``: ``submitted``, or what
    ``governance.lowered_reason`` says of a job a budget lowered), in one statement, with the
    trace its events travel in (``trace_id``) and the fingerprint of the request that made
    it (``schemas.request_fingerprint``, which a replay of its idempotency key compares).
    False (nothing stored) when this user already submitted a job with this idempotency key."""
    row = await conn.fetchrow(
        _INSERT_JOB,
        job_id,
        team_id,
        user_id,
        name,
        spec,
        idempotency_key,
        submitted_at,
        trace_id,
        reason,
        fingerprint,
    )
    assert row is not None  # a SELECT without FROM has one row
    return bool(row["stored"])


async def insert_job_announced(
    conn: asyncpg.Connection,
    job_id: str,
    team_id: int,
    user_id: int,
    name: str,
    spec: dict[str, Any],
    idempotency_key: str | None,
    submitted_at: datetime,
    trace_id: str | None,
    event: tuple[str, str, bytes, dict[str, str]],
    reason: str = "submitted",
    fingerprint: str | None = None,
) -> bool:
    """``insert_job`` and the outbox row of its ``job.submitted`` event ``(event_id,
    subject, body, headers)``, in one statement (so in one transaction of its own, with no
    ``BEGIN``/``COMMIT`` round trips): all three rows or none. False (nothing stored) when
    this user already submitted a job with this idempotency key. The caller tells the
    outbox (``shared.outbox.enqueued_by``)."""
    row = await conn.fetchrow(
        _INSERT_JOB_ANNOUNCED,
        job_id,
        team_id,
        user_id,
        name,
        spec,
        idempotency_key,
        submitted_at,
        trace_id,
        *event,
        reason,
        fingerprint,
    )
    assert row is not None  # a SELECT without FROM has one row
    return bool(row["stored"])


CallerKey = tuple[str, int, int, int, str]
"""A remembered caller as ``insert_job_if_caller`` checks it: ``(token_hash, token_id,
user_id, team_id, role)``."""
ScreeningKey = tuple[str, list[str], list[str], str]
"""A remembered screening: ``(month, declared, retired, budgets)``."""
NewJob = tuple[str, str, dict[str, Any], str | None, datetime, str | None, str, str | None]
"""``(job_id, name, spec, idempotency_key, submitted_at, trace_id, reason, fingerprint)``:
``reason`` is its first history entry's, ``fingerprint`` its request's (``insert_job``)."""
NewEvent = tuple[str, str, bytes, dict[str, str]]
"""An outbox row: ``(event_id, subject, body, headers)``."""
Submission = tuple[CallerKey, ScreeningKey, NewJob, NewEvent]
"""What ``insert_job_if_caller`` takes, as one value."""


async def insert_job_if_caller(
    conn: asyncpg.Connection,
    caller: CallerKey,
    screening: ScreeningKey,
    job: NewJob,
    event: NewEvent,
) -> tuple[bool, bool]:
    """``insert_job_announced``, done only where the token (by hash) is still valid (not
    revoked, not expired, its user not disabled) and still that caller's, and the team's
    screening is still the one given, all in the same statement: one round trip checks the
    caller and stores the job. ``caller``: ``(token_hash, token_id, user_id, team_id,
    role)``; ``screening``: ``(month, declared, retired, budgets)`` as
    ``governance.screening_unchanged`` takes them; ``job``: ``(job_id, name, spec,
    idempotency_key, submitted_at, trace_id, reason, fingerprint)``. Returns (the caller and screening held,
    the job was stored): (True, False) when this user already used the idempotency key,
    (False, False) when anything about the caller or screening differs (nothing stored)."""
    token_hash, token_id, user_id, team_id, role = caller
    month, declared, retired, budgets = screening
    job_id, name, spec, idempotency_key, submitted_at, trace_id, reason, fingerprint = job
    row = await conn.fetchrow(
        _INSERT_JOB_IF_CALLER,
        job_id,
        team_id,
        user_id,
        name,
        spec,
        idempotency_key,
        submitted_at,
        trace_id,
        *event,
        token_hash,
        token_id,
        role,
        month,
        declared,
        retired,
        budgets,
        reason,
        fingerprint,
    )
    assert row is not None  # a SELECT without FROM has one row
    return bool(row["held"]), bool(row["stored"])


async def insert_jobs_if_callers(
    conn: asyncpg.Connection, submissions: Sequence[Submission]
) -> list[tuple[bool, bool]]:
    """``insert_job_if_caller`` for each of ``submissions``, all in one statement (one
    transaction, one commit): each row's caller and screening checked as there (the same
    condition, ``_caller_held``), each row stored or not on its own, in order (a second row
    with the idempotency key of an earlier one in the same call is not stored, as if it had
    come after it: only the first of each user's key is inserted). The jobs are inserted in
    the order of their ``(user, idempotency key)``, so two calls under way at once that hold
    one user's keys wait for each other's keys in one order, never in a cycle (a deadlock,
    which would fail one of them); their events keep the order of ``submissions``. Returns
    ``(held, stored)`` per submission, in order."""
    columns: list[list[Any]] = [[] for _ in _BATCH_COLUMNS]
    for caller, screening, job, event in submissions:
        job_id, name, spec, key, submitted_at, trace_id, reason, fingerprint = job
        token_hash, token_id, user_id, team_id, role = caller
        month, declared, retired, budgets = screening
        event_id, subject, body, headers = event
        row = (
            job_id,
            team_id,
            user_id,
            name,
            json.dumps(spec),
            key,
            submitted_at,
            trace_id,
            event_id,
            subject,
            body,
            json.dumps(headers),
            token_hash,
            token_id,
            role,
            month,
            _text_array(declared),
            _text_array(retired),
            budgets,
            reason,
            fingerprint,
        )
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    rows = await conn.fetch(_INSERT_JOBS_IF_CALLERS, *columns)
    return [(bool(r["held"]), bool(r["stored"])) for r in rows]


def _text_array(items: Sequence[str]) -> str:
    """``items`` as a PostgreSQL array literal of text (every element quoted and escaped)."""
    quoted = (item.replace("\\", "\\\\").replace('"', '\\"') for item in items)
    return "{" + ",".join(f'"{item}"' for item in quoted) + "}"


async def job_by_idempotency_key(
    conn: asyncpg.Connection, team_id: int, user_id: int, key: str
) -> asyncpg.Record | None:
    """The job this user stored with this idempotency key: ``(id, spec,
    request_fingerprint)`` (the fingerprint NULL for a job stored before it was kept)."""
    return await conn.fetchrow(
        "SELECT id, spec, request_fingerprint FROM jobs"
        " WHERE team_id = $1 AND user_id = $2 AND idempotency_key = $3",
        team_id,
        user_id,
        key,
    )


_JOB_COLUMNS = """j.id, j.name, j.spec, j.status, j.submitted_at, j.updated_at,
    j.cancel_requested_at, j.pending_reason, j.pending_position, j.estimated_start,
    j.pending_blocking, j.pending_suggestion,
    j.allocation_id, j.node_id, j.gpu_indices, j.attempt, j.started_at, j.finished_at,
    j.metrics, j.metrics_step, j.failure, j.trace_id, u.name AS user_name, t.name AS team_name"""


async def team_of_job(conn: asyncpg.Connection, job_id: str) -> int | None:
    """The team of a job, for operators (who may address any team's job by id)."""
    found = await conn.fetchval("SELECT team_id FROM jobs WHERE id = $1", job_id)
    return None if found is None else int(found)


async def job_for_team(
    conn: asyncpg.Connection, team_id: int, job_id: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"""SELECT {_JOB_COLUMNS}
            FROM jobs j JOIN users u ON u.id = j.user_id JOIN teams t ON t.id = j.team_id
            WHERE j.team_id = $1 AND j.id = $2""",
        team_id,
        job_id,
    )


_SUMMARY_COLUMNS = """j.id, j.name, j.status, j.submitted_at, j.started_at, j.finished_at,
    j.node_id, j.attempt, j.metrics_step, j.estimated_start, u.name AS user_name,
    t.name AS team_name,
    jsonb_build_object('gpu_flavor', j.spec -> 'gpu_flavor', 'gpus', j.spec -> 'gpus',
        'project', j.spec -> 'project', 'experiment', j.spec -> 'experiment') AS spec,
    coalesce(CASE WHEN j.status IN ('PENDING', 'QUEUED') THEN j.pending_reason
                  WHEN j.status = 'FAILED' THEN j.failure ->> 'reason' END,
             (SELECT h.reason FROM job_history h WHERE h.job_id = j.id
              ORDER BY h.id DESC LIMIT 1)) AS reason"""
"""What ``views.job_summary`` reads of a job, and no more: a page of 50 then decodes no
spec, metrics or failure documents, only the two fields of the spec a summary shows."""


_FILTERS = {
    "id_prefix": "starts_with(j.id, ${n})",
    "user": "u.name = ${n}",
    "project": "coalesce(j.spec ->> 'project', 'default') = ${n}",
    "experiment": "j.spec ->> 'experiment' = ${n}",
    "label": "j.spec -> 'labels' @> ${n}::jsonb",
}
"""The conditions of ``GET /v1/jobs``'s filters: each narrows the walk of the list's index."""


def jobs_for_team_query(
    team_id: int | None,
    status: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
    filters: Mapping[str, str] | None = None,
) -> tuple[str, list[Any]]:
    """The SQL and parameters of ``jobs_for_team``. Each combination of filters is its own
    statement (no ``$n IS NULL OR ...``), so each keeps a plan that walks an index in list
    order: ``jobs_team_newest``, or ``jobs_team_status_newest`` with a status; the keyset
    ``after`` is a range condition of that same index.

    Every team's (``team_id`` None) is that same walk in each team, stopping at ``limit``
    jobs of each, merged: a page costs a team's page per team (about 0.5 k index entries
    for 10 teams and a page of 50, however many jobs they hold), and only the page's rows
    are summarised. The cost grows with the number of teams, one index descent and up to
    a page of entries each: 1,000 teams of 200 jobs read about 3.7 k buffers for a page of
    50 (about 8 k for one of 500), where one team's page reads a few hundred. No index of every team's jobs in list order serves it, on purpose: the
    planner takes such an index for one team's list too (filtering the newest jobs by
    team), which reads every newer job of the other teams when that team's are old."""
    where: list[str] = []
    params: list[Any] = []
    if team_id is not None:
        params.append(team_id)
        where.append(f"j.team_id = ${len(params)}")
    if status is not None:
        params.append(status)
        where.append(f"j.status = ${len(params)}")
    for name, value in sorted((filters or {}).items()):
        key, _, label_value = value.partition("=")
        params.append({key: label_value} if name == "label" else value)
        where.append(_FILTERS[name].format(n=len(params)))
    if after is not None:
        params.extend(after)
        where.append(f"(j.submitted_at, j.id) < (${len(params) - 1}, ${len(params)})")
    params.append(limit)
    lim = f"${len(params)}"
    costs = """CROSS JOIN LATERAL (
                    SELECT coalesce(sum(k.cost), 0) AS cost, min(k.currency) AS currency
                    FROM job_costs k WHERE k.job_id = j.id) c"""
    if team_id is not None:
        sql = f"""SELECT {_SUMMARY_COLUMNS}, c.cost, c.currency
            FROM jobs j JOIN users u ON u.id = j.user_id JOIN teams t ON t.id = j.team_id
                {costs}
            WHERE {" AND ".join(where)}
            ORDER BY j.submitted_at DESC, j.id DESC
            LIMIT {lim}"""
        return sql, params
    # The page's ids first, the summaries (costs, reasons) only of the page's rows. A user
    # is one team's (``u.team_id = e.id``): without that the planner pairs every team with
    # every user of that name, teams x users lookups (9 s for 1,000 teams x 20 jobs).
    users = (
        " JOIN users u ON u.id = j.user_id AND u.team_id = e.id"
        if "user" in (filters or {})
        else ""
    )
    each = " AND ".join(["j.team_id = e.id", *where])
    sql = f"""SELECT {_SUMMARY_COLUMNS}, c.cost, c.currency
            FROM (SELECT p.id FROM teams e CROSS JOIN LATERAL (
                      SELECT j.id, j.submitted_at FROM jobs j{users}
                      WHERE {each}
                      ORDER BY j.submitted_at DESC, j.id DESC LIMIT {lim}) p
                  ORDER BY p.submitted_at DESC, p.id DESC LIMIT {lim}) page
            JOIN jobs j ON j.id = page.id JOIN users u ON u.id = j.user_id
            JOIN teams t ON t.id = j.team_id
                {costs}
            ORDER BY j.submitted_at DESC, j.id DESC"""
    return sql, params


async def jobs_for_team(
    conn: asyncpg.Connection,
    team_id: int | None,
    status: str | None,
    limit: int,
    after: tuple[datetime, str] | None = None,
    filters: Mapping[str, str] | None = None,
) -> list[asyncpg.Record]:
    """The team's jobs (``team_id`` None: every team's), newest first (by ``submitted_at``,
    then id), each with its cost so far (the columns of ``views.job_summary``); with
    ``after`` (a job's ``(submitted_at, id)``), only those listed after it; with
    ``filters`` (``_FILTERS``), only those that match them all."""
    sql, params = jobs_for_team_query(team_id, status, after, limit, filters)
    rows: list[asyncpg.Record] = await conn.fetch(sql, *params)
    return rows


async def lock_job_for_team(
    conn: asyncpg.Connection, team_id: int, job_id: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT status, cancel_requested_at, user_id FROM jobs "
        "WHERE team_id = $1 AND id = $2 FOR UPDATE",
        team_id,
        job_id,
    )


async def set_cancel_requested(
    conn: asyncpg.Connection, team_id: int, job_id: str, at: datetime
) -> None:
    await conn.execute(
        "UPDATE jobs SET cancel_requested_at = $3, updated_at = $3 WHERE team_id = $1 AND id = $2",
        team_id,
        job_id,
        at,
    )


# --- the parts of a job view (the job's team was checked when the job was read) -------


async def history(conn: asyncpg.Connection, job_id: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT status, at, reason FROM job_history WHERE job_id = $1 ORDER BY id", job_id
    )
    return rows


async def checkpoints(conn: asyncpg.Connection, job_id: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT step, uri, sha256, size_bytes, saved_at FROM job_checkpoints "
        "WHERE job_id = $1 ORDER BY step, saved_at",
        job_id,
    )
    return rows


async def latest_model(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT model_name, version, artifact_uri, artifact_sha256, metrics, lineage "
        "FROM job_models WHERE job_id = $1 ORDER BY registered_at DESC, version DESC LIMIT 1",
        job_id,
    )


async def costs(conn: asyncpg.Connection, job_id: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT gpu_seconds, cost, currency, price_per_gpu_hour FROM job_costs "
        "WHERE job_id = $1 ORDER BY ended_at, allocation_id",
        job_id,
    )
    return rows


async def allocation_count(conn: asyncpg.Connection, job_id: str) -> int:
    return int(
        await conn.fetchval("SELECT count(*) FROM job_allocations WHERE job_id = $1", job_id)
    )


# --- event side: addressed by job id ------------------------------------------------


async def job_exists(conn: asyncpg.Connection, job_id: str) -> bool:
    return bool(await conn.fetchval("SELECT true FROM jobs WHERE id = $1", job_id))


async def lock_job(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT status, allocation_id, attempt, pending_reason, cancel_requested_at, failure "
        "FROM jobs WHERE id = $1 FOR UPDATE",
        job_id,
    )


async def set_cancel_requested_by_delegate(
    conn: asyncpg.Connection, job_id: str, at: datetime
) -> None:
    """Record a cancel asked on this service's behalf (the registry's), unless one was
    asked already (the first request's time stays)."""
    await conn.execute(
        "UPDATE jobs SET cancel_requested_at = $2, updated_at = clock_timestamp() "
        "WHERE id = $1 AND cancel_requested_at IS NULL",
        job_id,
        at,
    )


async def attempt_allocations(conn: asyncpg.Connection, job_id: str, attempt: int) -> list[str]:
    """The allocations granted to one attempt of the job (one per node of a gang)."""
    rows = await conn.fetch(
        "SELECT allocation_id FROM job_allocations WHERE job_id = $1 AND attempt = $2",
        job_id,
        attempt,
    )
    return [str(r["allocation_id"]) for r in rows]


async def insert_history(
    conn: asyncpg.Connection, job_id: str, status: str, at: datetime, reason: str | None
) -> None:
    await conn.execute(
        "INSERT INTO job_history (job_id, status, at, reason) VALUES ($1, $2, $3, $4)",
        job_id,
        status,
        at,
        reason,
    )


async def set_pending(
    conn: asyncpg.Connection,
    job_id: str,
    reason: str,
    position: int,
    estimated_start: datetime | None,
    blocking: str | None = None,
    suggestion: str | None = None,
) -> None:
    await conn.execute(
        """UPDATE jobs SET status = 'PENDING', pending_reason = $2, pending_position = $3,
                          estimated_start = $4, pending_blocking = $5,
                          pending_suggestion = $6, updated_at = clock_timestamp()
           WHERE id = $1""",
        job_id,
        reason,
        position,
        estimated_start,
        blocking,
        suggestion,
    )


async def set_scheduled(
    conn: asyncpg.Connection,
    job_id: str,
    allocation_id: str,
    node_id: str,
    gpu_indices: list[int],
    attempt: int,
) -> None:
    await conn.execute(
        """UPDATE jobs SET status = 'SCHEDULED', allocation_id = $2, node_id = $3,
                          gpu_indices = $4, attempt = $5, pending_reason = NULL,
                          pending_position = NULL, estimated_start = NULL,
                          pending_blocking = NULL, pending_suggestion = NULL,
                          updated_at = clock_timestamp()
           WHERE id = $1""",
        job_id,
        allocation_id,
        node_id,
        gpu_indices,
        attempt,
    )


async def set_running(conn: asyncpg.Connection, job_id: str, started_at: datetime) -> None:
    await conn.execute(
        """UPDATE jobs SET status = 'RUNNING', started_at = coalesce(started_at, $2),
                          updated_at = clock_timestamp()
           WHERE id = $1""",
        job_id,
        started_at,
    )


async def set_preempted(conn: asyncpg.Connection, job_id: str, status: str) -> None:
    """The job's allocation ended and it waits to run again: PREEMPTED, or QUEUED for a
    restart after its attempt failed (``domain.judge``)."""
    await conn.execute(
        "UPDATE jobs SET status = $2, updated_at = clock_timestamp() WHERE id = $1",
        job_id,
        status,
    )


async def set_failure(conn: asyncpg.Connection, job_id: str, failure: dict[str, Any]) -> None:
    """Record an attempt's failure; the status is the scheduler's to change."""
    await conn.execute(
        "UPDATE jobs SET failure = $2, updated_at = clock_timestamp() WHERE id = $1",
        job_id,
        failure,
    )


async def set_finished(
    conn: asyncpg.Connection,
    job_id: str,
    status: str,
    finished_at: datetime,
    failure: dict[str, Any] | None,
) -> None:
    """End the job: its terminal ``status`` (``ValueError`` for any other), when it
    finished, and ``failure`` if given. Every write of a terminal status in this service is
    this one, so it also deletes the runner reports the job kept waiting
    (``early_reports``): nothing moves an ended job any more, whatever path ended it, and
    the same statement does it (no extra round trip)."""
    if JobStatus(status) not in TERMINAL:
        raise ValueError(f"set_finished with {status}, which does not end a job")
    await conn.execute(
        # coalesce: a FAILED job turned CANCELLED keeps when and how its process ended.
        """WITH ended AS (
               UPDATE jobs SET status = $2, finished_at = coalesce(finished_at, $3),
                               failure = coalesce($4, failure), updated_at = clock_timestamp()
               WHERE id = $1 RETURNING id)
           DELETE FROM early_reports WHERE job_id IN (SELECT id FROM ended)""",
        job_id,
        status,
        finished_at,
        failure,
    )


async def insert_allocation(
    conn: asyncpg.Connection,
    allocation_id: str,
    job_id: str,
    node_id: str,
    gpu_indices: list[int],
    attempt: int,
    epoch: int,
    granted_at: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO job_allocations
               (allocation_id, job_id, node_id, gpu_indices, attempt, epoch, granted_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (allocation_id) DO NOTHING""",
        allocation_id,
        job_id,
        node_id,
        gpu_indices,
        attempt,
        epoch,
        granted_at,
    )


async def merge_metrics(
    conn: asyncpg.Connection,
    job_id: str,
    step: int | None,
    metrics: dict[str, float | None],
    at: datetime,
) -> None:
    """Keep the newest value of each metric; an event older than the last one is dropped."""
    await conn.execute(
        """UPDATE jobs SET metrics = metrics || $2::jsonb,
                          metrics_step = coalesce($3, metrics_step), metrics_at = $4,
                          updated_at = clock_timestamp()
           WHERE id = $1 AND (metrics_at IS NULL OR metrics_at <= $4)""",
        job_id,
        metrics,
        step,
        at,
    )


async def insert_checkpoint(
    conn: asyncpg.Connection,
    job_id: str,
    uri: str,
    manifest_uri: str,
    step: int,
    size_bytes: int,
    sha256: str,
    allocation_id: str,
    saved_at: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO job_checkpoints
               (job_id, uri, manifest_uri, step, size_bytes, sha256, allocation_id, saved_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (job_id, uri) DO NOTHING""",
        job_id,
        uri,
        manifest_uri,
        step,
        size_bytes,
        sha256,
        allocation_id,
        saved_at,
    )


async def insert_model(
    conn: asyncpg.Connection,
    model_version_id: str,
    job_id: str,
    model_name: str,
    version: int,
    artifact_uri: str,
    artifact_sha256: str,
    metrics: dict[str, float | None],
    lineage: dict[str, Any],
    registered_at: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO job_models (model_version_id, job_id, model_name, version, artifact_uri,
                                   artifact_sha256, metrics, lineage, registered_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT (model_version_id) DO NOTHING""",
        model_version_id,
        job_id,
        model_name,
        version,
        artifact_uri,
        artifact_sha256,
        metrics,
        lineage,
        registered_at,
    )


async def upsert_cost(
    conn: asyncpg.Connection,
    allocation_id: str,
    job_id: str,
    gpu_flavor: str,
    gpus: int,
    started_at: datetime,
    ended_at: datetime,
    gpu_seconds: float,
    price_per_gpu_hour: float,
    cost: float,
    currency: str,
    revision: int = 0,
) -> None:
    """Keep billing's figure for the allocation: one of a higher ``revision`` (a correction)
    replaces the row, one of the same revision with no earlier end too (billing from before
    revisions said 0 for every event; an amendment only lengthens a bill); an older one
    arriving late or again changes nothing."""
    await conn.execute(
        """INSERT INTO job_costs (allocation_id, job_id, gpu_flavor, gpus, started_at, ended_at,
                                  gpu_seconds, price_per_gpu_hour, cost, currency, revision)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
           ON CONFLICT (allocation_id) DO UPDATE SET
               gpu_flavor = EXCLUDED.gpu_flavor, gpus = EXCLUDED.gpus,
               started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at,
               gpu_seconds = EXCLUDED.gpu_seconds,
               price_per_gpu_hour = EXCLUDED.price_per_gpu_hour,
               cost = EXCLUDED.cost, currency = EXCLUDED.currency,
               revision = EXCLUDED.revision
           WHERE (job_costs.revision, job_costs.ended_at)
                 <= (EXCLUDED.revision, EXCLUDED.ended_at)""",
        allocation_id,
        job_id,
        gpu_flavor,
        gpus,
        started_at,
        ended_at,
        gpu_seconds,
        price_per_gpu_hour,
        cost,
        currency,
        revision,
    )
