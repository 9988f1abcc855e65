"""The scheduler's SQL: one function per query, each taking a connection (usually inside the
transaction of the event being handled). Tables are unqualified: the pool's ``search_path``
is the ``scheduler`` schema."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from services.scheduler.convert import PendingNote, SnapshotRows, implicit_queue
from services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    Job,
    JobStatus,
    NodeStatus,
    Outcome,
)
from shared.events.payloads import JobSpec
from shared.telemetry import inject

Row = Mapping[str, Any]
"""A fetched record (asyncpg.Record), read by column name."""

# --- locks -----------------------------------------------------------------------------

PASS_LOCK = "trainyard:scheduler:pass"


async def lock_scheduler(conn: asyncpg.Connection) -> None:
    """Serialise scheduler work across replicas until the transaction ends (re-entrant)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", PASS_LOCK)


# --- nodes -----------------------------------------------------------------------------


async def node_for_update(conn: asyncpg.Connection, node_id: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        "SELECT node_id, gpu_flavor, gpu_count, topology, status, last_heartbeat FROM nodes "
        "WHERE node_id = $1 FOR UPDATE",
        node_id,
    )
    return row


async def touch_node(
    conn: asyncpg.Connection,
    node_id: str,
    hostname: str,
    gpu_flavor: str,
    gpu_count: int,
    topology: str,
    now: datetime,
) -> bool:
    """A heartbeat that changes no supply: a READY node reporting what it reported before
    only moves its last heartbeat. False when anything else changed (or the node is new)."""
    touched = await conn.fetchval(
        """UPDATE nodes SET hostname = $2,
                            last_heartbeat = GREATEST(last_heartbeat, $6)
           WHERE node_id = $1 AND status = 'READY' AND gpu_flavor = $3 AND gpu_count = $4
                 AND topology = $5
           RETURNING true""",
        node_id,
        hostname,
        gpu_flavor,
        gpu_count,
        topology,
        now,
    )
    return bool(touched)


async def upsert_node(
    conn: asyncpg.Connection,
    node_id: str,
    hostname: str,
    gpu_flavor: str,
    gpu_count: int,
    now: datetime,
    topology: str = "default",
) -> None:
    """Record a heartbeat: the node is READY, with what it reports now (its flavor is
    registered if new)."""
    await conn.execute("INSERT INTO flavors (name) VALUES ($1) ON CONFLICT DO NOTHING", gpu_flavor)
    await conn.execute(
        """INSERT INTO nodes (node_id, hostname, gpu_flavor, gpu_count, topology, status,
                              last_heartbeat, registered_at)
           VALUES ($1, $2, $3, $4, $6, 'READY', $5, $5)
           ON CONFLICT (node_id) DO UPDATE SET
               hostname = EXCLUDED.hostname,
               gpu_flavor = EXCLUDED.gpu_flavor,
               gpu_count = EXCLUDED.gpu_count,
               topology = EXCLUDED.topology,
               status = 'READY',
               lost_at = NULL,
               last_heartbeat = GREATEST(nodes.last_heartbeat, EXCLUDED.last_heartbeat)""",
        node_id,
        hostname,
        gpu_flavor,
        gpu_count,
        now,
        topology,
    )


async def mark_lost_nodes(conn: asyncpg.Connection, cutoff: datetime, now: datetime) -> list[Row]:
    """READY nodes silent since before ``cutoff`` become LOST; returns them."""
    rows: list[Row] = await conn.fetch(
        "UPDATE nodes SET status = 'LOST', lost_at = $2 "
        "WHERE status = 'READY' AND last_heartbeat < $1 "
        "RETURNING node_id, last_heartbeat",
        cutoff,
        now,
    )
    return rows


async def load_snapshot_rows(conn: asyncpg.Connection) -> SnapshotRows:
    """Everything a pass needs (see ``convert.SnapshotRows``); call under the pass lock so
    the queries see one state — except for jobs submitted meanwhile, which only add rows
    that the next pass takes."""
    ready = NodeStatus.READY.value
    return SnapshotRows(
        # Pending jobs first: submissions are inserted without the pass lock (see
        # handlers.dispatch), and a job seen here has its queue committed already, so the
        # queries below find it.
        pending=await conn.fetch(
            "SELECT job_id, queue, gpu_flavor, gpus, priority_class, submitted_at, "
            "max_runtime_seconds, seq, pending_reason, pending_position, pending_blocking, "
            "pending_suggestion, pending_estimated_start "
            "FROM jobs WHERE status = $1",
            JobStatus.QUEUED.value,
        ),
        nodes=await conn.fetch(
            "SELECT node_id, gpu_flavor, gpu_count, topology FROM nodes WHERE status = $1",
            ready,
        ),
        leases=await conn.fetch(
            "SELECT l.node_id, l.gpu_index, a.job_id FROM gpu_leases l "
            "JOIN allocations a USING (allocation_id) JOIN nodes n ON n.node_id = l.node_id "
            "WHERE l.released_at IS NULL AND n.status = $1",
            ready,
        ),
        running=await conn.fetch(
            "SELECT a.allocation_id, a.epoch, a.job_id, j.queue, j.gpu_flavor, j.gpus, "
            "j.priority_class, "
            "j.max_runtime_seconds, j.status AS job_status, j.updated_at AS job_updated_at, "
            "a.node_id, a.gpu_indices, a.granted_at, a.last_checkpoint_at, a.notice_at, "
            "a.borrowed FROM allocations a JOIN jobs j USING (job_id) "
            "WHERE a.released_at IS NULL"
        ),
        queues=await conn.fetch("SELECT name, team, cohort, weight, implicit FROM queues"),
        quotas=await conn.fetch(
            "SELECT queue, flavor, nominal, borrowing_limit, lending_limit FROM quotas"
        ),
        classes=await conn.fetch(
            "SELECT name, value, preemptible, min_runtime_seconds FROM priority_classes"
        ),
        usage=await conn.fetch("SELECT team, gpu_seconds, as_of FROM usage"),
    )


# --- jobs ------------------------------------------------------------------------------


async def queue_for_team(conn: asyncpg.Connection, team: str) -> str:
    """The team's queue; a team without one gets its implicit queue (``default:<team>``)."""
    name: str | None = await conn.fetchval("SELECT name FROM queues WHERE team = $1", team)
    if name is not None:
        return name
    name = implicit_queue(team)
    await conn.execute(
        "INSERT INTO queues (name, team, implicit) VALUES ($1, $2, true) ON CONFLICT DO NOTHING",
        name,
        team,
    )
    return name


async def insert_job(
    conn: asyncpg.Connection,
    job_id: str,
    spec: JobSpec,
    submitted_at: datetime,
    now: datetime,
    queue: str | None = None,
) -> bool:
    """Insert a QUEUED job into ``queue`` (default: its team's), with the current trace
    context; False when the job was already known (a re-submitted event)."""
    queue = queue or await queue_for_team(conn, spec.team)
    inserted = await conn.fetchval(
        """INSERT INTO jobs (job_id, team, user_name, gpu_flavor, gpus, max_restarts, spec,
                             status, submitted_at, updated_at, queue, priority_class,
                             max_runtime_seconds, trace_context)
           VALUES ($1, $2, $3, $4, $5, $6, $7, 'QUEUED', $8, $9, $10, $11, $12, $13)
           ON CONFLICT (job_id) DO NOTHING RETURNING true""",
        job_id,
        spec.team,
        spec.user,
        spec.gpu_flavor,
        spec.gpus,
        spec.max_restarts,
        spec.model_dump(mode="json"),
        submitted_at,
        now,
        queue,
        spec.priority,
        max(1, spec.max_runtime_seconds),
        inject() or None,
    )
    return bool(inserted)


_JOB_COLUMNS = (
    "job_id, spec, status, status_reason, attempt, restarts, submitted_at, "
    "pending_reason, pending_position, queue, trace_context"
)


async def job_for_update(conn: asyncpg.Connection, job_id: str) -> Job | None:
    row = await conn.fetchrow(
        f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1 FOR UPDATE", job_id
    )
    return Job.from_row(row) if row is not None else None


async def jobs_by_id(conn: asyncpg.Connection, job_ids: Sequence[str]) -> dict[str, Job]:
    rows = await conn.fetch(
        f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ANY($1::text[]) FOR UPDATE",
        list(job_ids),
    )
    return {r["job_id"]: Job.from_row(r) for r in rows}


async def set_job_status(
    conn: asyncpg.Connection,
    job_ids: Sequence[str],
    status: JobStatus,
    now: datetime,
    reason: str | None = None,
) -> None:
    """Change these jobs' status; leaving QUEUED forgets their last published pending note."""
    await conn.execute(
        "UPDATE jobs SET status = $2, updated_at = $3, status_reason = COALESCE($4, status_reason),"
        f" {_NO_PENDING} WHERE job_id = ANY($1::text[])",
        list(job_ids),
        status.value,
        now,
        reason,
    )


async def trace_contexts(
    conn: asyncpg.Connection, job_ids: Sequence[str]
) -> dict[str, Mapping[str, str]]:
    """The trace context each job's submission started (jobs without one are left out)."""
    rows = await conn.fetch(
        "SELECT job_id, trace_context FROM jobs "
        "WHERE job_id = ANY($1::text[]) AND trace_context IS NOT NULL",
        list(job_ids),
    )
    return {r["job_id"]: r["trace_context"] for r in rows}


async def requeue_job(
    conn: asyncpg.Connection, job_id: str, now: datetime, reason: str, count_restart: bool
) -> None:
    """Back to QUEUED for the next attempt (and one restart used, after a lost node)."""
    await conn.execute(
        "UPDATE jobs SET status = 'QUEUED', attempt = attempt + 1, "
        "restarts = restarts + $3::int, status_reason = $4, updated_at = $2, "
        f"{_NO_PENDING} WHERE job_id = $1",
        job_id,
        now,
        1 if count_restart else 0,
        reason,
    )


async def set_pending(conn: asyncpg.Connection, notes: Sequence[tuple[str, PendingNote]]) -> None:
    """Remember the notes published for these queued jobs (one pipelined statement each)."""
    await conn.executemany(
        "UPDATE jobs SET pending_reason = $2, pending_position = $3, pending_blocking = $4, "
        "pending_suggestion = $5, pending_estimated_start = $6 WHERE job_id = $1",
        [
            (job_id, n.reason, n.position, n.blocking, n.suggestion, n.estimated_start)
            for job_id, n in notes
        ],
    )


_NO_PENDING = (
    "pending_reason = NULL, pending_position = NULL, pending_blocking = NULL, "
    "pending_suggestion = NULL, pending_estimated_start = NULL"
)

# --- allocations and leases ------------------------------------------------------------

_ALLOCATION_COLUMNS = (
    "allocation_id, job_id, node_id, epoch, attempt, gpu_indices, status, granted_at, "
    "gang_id, gang_size, borrowed, notice_at"
)


async def next_epochs(conn: asyncpg.Connection, count: int) -> list[int]:
    """``count`` fresh fencing epochs, ascending."""
    rows = await conn.fetch(
        "SELECT nextval('allocation_epoch') AS epoch FROM generate_series(1, $1) ORDER BY 1",
        count,
    )
    return [r["epoch"] for r in rows]


async def insert_allocations(conn: asyncpg.Connection, allocations: Sequence[Allocation]) -> None:
    """Insert allocations and one live lease per GPU (the unique index may refuse them), in
    two statements however many there are."""
    await conn.execute(
        f"INSERT INTO allocations ({_ALLOCATION_COLUMNS}) "
        "SELECT a.id, a.job_id, a.node_id, a.epoch, a.attempt, a.gpus::integer[], a.status, "
        "a.granted_at, a.gang_id, a.gang_size, a.borrowed, NULL "
        "FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::integer[], "
        "$6::text[], $7::text[], $8::timestamptz[], $9::uuid[], $10::integer[], "
        "$11::boolean[]) AS a(id, job_id, node_id, epoch, attempt, gpus, status, granted_at, "
        "gang_id, gang_size, borrowed)",
        [uuid.UUID(a.allocation_id) for a in allocations],
        [a.job_id for a in allocations],
        [a.node_id for a in allocations],
        [a.epoch for a in allocations],
        [a.attempt for a in allocations],
        # One array per row: as array literals, since unnest() would flatten a 2-D array.
        ["{" + ",".join(map(str, a.gpu_indices)) + "}" for a in allocations],
        [a.status.value for a in allocations],
        [a.granted_at for a in allocations],
        [uuid.UUID(a.gang_id or a.allocation_id) for a in allocations],
        [a.gang_size for a in allocations],
        [a.borrowed for a in allocations],
    )
    leases = [(a.allocation_id, a.node_id, i) for a in allocations for i in a.gpu_indices]
    await conn.execute(
        "INSERT INTO gpu_leases (allocation_id, node_id, gpu_index) "
        "SELECT * FROM unnest($1::uuid[], $2::text[], $3::integer[])",
        [uuid.UUID(a) for a, _, _ in leases],
        [n for _, n, _ in leases],
        [i for _, _, i in leases],
    )


async def live_allocations(conn: asyncpg.Connection, job_id: str) -> list[Allocation]:
    """The job's live allocations: none, one, or one per node of its gang."""
    rows = await conn.fetch(
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations "
        "WHERE job_id = $1 AND released_at IS NULL ORDER BY node_id FOR UPDATE",
        job_id,
    )
    return [Allocation.from_row(r) for r in rows]


async def live_allocations_on(conn: asyncpg.Connection, node_id: str) -> list[Allocation]:
    rows = await conn.fetch(
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations "
        "WHERE node_id = $1 AND released_at IS NULL ORDER BY granted_at FOR UPDATE",
        node_id,
    )
    return [Allocation.from_row(r) for r in rows]


async def allocations_by_id(
    conn: asyncpg.Connection, allocation_ids: Sequence[uuid.UUID]
) -> list[tuple[Allocation, bool]]:
    """The allocations with these ids, each with whether it is still live."""
    rows = await conn.fetch(
        f"SELECT {_ALLOCATION_COLUMNS}, released_at IS NULL AS live FROM allocations "
        "WHERE allocation_id = ANY($1::uuid[])",
        list(allocation_ids),
    )
    return [(Allocation.from_row(r), r["live"]) for r in rows]


async def mark_allocation_started(
    conn: asyncpg.Connection, allocation_id: str, started_at: datetime
) -> None:
    await conn.execute(
        "UPDATE allocations SET status = $2, started_at = $3 WHERE allocation_id = $1",
        uuid.UUID(allocation_id),
        AllocationStatus.RUNNING.value,
        started_at,
    )


async def release_allocation(
    conn: asyncpg.Connection, allocation_id: str, released_at: datetime, outcome: Outcome
) -> None:
    """End an allocation and free its GPUs."""
    aid = uuid.UUID(allocation_id)
    await conn.execute(
        "UPDATE allocations SET status = $2, released_at = $3, outcome = $4 "
        "WHERE allocation_id = $1",
        aid,
        AllocationStatus.RELEASED.value,
        released_at,
        outcome,
    )
    await conn.execute(
        "UPDATE gpu_leases SET released_at = $2 WHERE allocation_id = $1 AND released_at IS NULL",
        aid,
        released_at,
    )


async def set_notice(
    conn: asyncpg.Connection, allocation_ids: Sequence[str], at: datetime, reason: str
) -> None:
    """A preemption notice on these live allocations (a notice already given stands)."""
    await conn.execute(
        "UPDATE allocations SET notice_at = $2, notice_reason = $3 "
        "WHERE allocation_id = ANY($1::uuid[]) AND released_at IS NULL AND notice_at IS NULL",
        [uuid.UUID(a) for a in allocation_ids],
        at,
        reason,
    )


async def jobs_with_expired_notice(conn: asyncpg.Connection, cutoff: datetime) -> list[str]:
    """Jobs holding a live allocation whose preemption notice was given at or before
    ``cutoff`` (their grace is over)."""
    rows = await conn.fetch(
        "SELECT DISTINCT job_id FROM allocations "
        "WHERE released_at IS NULL AND notice_at IS NOT NULL AND notice_at <= $1 ORDER BY job_id",
        cutoff,
    )
    return [r["job_id"] for r in rows]


async def record_checkpoint(
    conn: asyncpg.Connection, allocation_id: str, saved_at: datetime
) -> None:
    """The job's latest complete checkpoint, on every live allocation of its gang."""
    await conn.execute(
        "UPDATE allocations SET last_checkpoint_at = GREATEST(last_checkpoint_at, $2) "
        "WHERE released_at IS NULL AND gang_id = "
        "(SELECT gang_id FROM allocations WHERE allocation_id = $1)",
        uuid.UUID(allocation_id),
        saved_at,
    )


# --- fair-share usage ------------------------------------------------------------------


async def usage_for_update(conn: asyncpg.Connection, team: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        "SELECT gpu_seconds, as_of FROM usage WHERE team = $1 FOR UPDATE", team
    )
    return row


async def set_usage(
    conn: asyncpg.Connection, team: str, gpu_seconds: float, as_of: datetime
) -> None:
    await conn.execute(
        "INSERT INTO usage (team, gpu_seconds, as_of) VALUES ($1, $2, $3) "
        "ON CONFLICT (team) DO UPDATE SET gpu_seconds = EXCLUDED.gpu_seconds, "
        "as_of = EXCLUDED.as_of",
        team,
        max(0.0, gpu_seconds),
        as_of,
    )


# --- the operator's queue view ---------------------------------------------------------


async def all_nodes(conn: asyncpg.Connection) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT node_id, hostname, gpu_flavor, gpu_count, topology, status, last_heartbeat "
        "FROM nodes ORDER BY node_id"
    )
    return rows


async def running_allocations(conn: asyncpg.Connection) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT a.allocation_id, a.job_id, j.team, j.queue, j.gpu_flavor, j.priority_class, "
        "a.node_id, a.gpu_indices, a.epoch, a.attempt, a.status, a.granted_at, a.started_at, "
        "a.gang_id, a.borrowed, a.notice_at, a.notice_reason, a.last_checkpoint_at, "
        "j.status AS job_status "
        "FROM allocations a JOIN jobs j USING (job_id) "
        "WHERE a.released_at IS NULL ORDER BY a.granted_at, a.epoch"
    )
    return rows


async def pending_jobs(conn: asyncpg.Connection) -> list[Row]:
    """Queued jobs in the order of their last published position in each queue."""
    rows: list[Row] = await conn.fetch(
        "SELECT job_id, team, queue, gpu_flavor, gpus, priority_class, attempt, submitted_at, "
        "pending_reason, pending_position, pending_blocking, pending_suggestion, "
        "pending_estimated_start FROM jobs WHERE status = 'QUEUED' "
        "ORDER BY queue, pending_position NULLS LAST, submitted_at, seq"
    )
    return rows
