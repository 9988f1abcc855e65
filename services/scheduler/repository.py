"""The scheduler's SQL: one function per query, each taking a connection (usually inside the
transaction of the event being handled). Tables are unqualified: the pool's ``search_path``
is the ``scheduler`` schema."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    Job,
    JobStatus,
    NodeStatus,
    Outcome,
)
from services.scheduler.policy import NodeState, QueuedJob, Snapshot
from shared.events.payloads import JobSpec

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
        "SELECT node_id, gpu_flavor, gpu_count, status, last_heartbeat FROM nodes "
        "WHERE node_id = $1 FOR UPDATE",
        node_id,
    )
    return row


async def upsert_node(
    conn: asyncpg.Connection,
    node_id: str,
    hostname: str,
    gpu_flavor: str,
    gpu_count: int,
    now: datetime,
) -> None:
    """Record a heartbeat: the node is READY, with what it reports now."""
    await conn.execute(
        """INSERT INTO nodes (node_id, hostname, gpu_flavor, gpu_count, status,
                              last_heartbeat, registered_at)
           VALUES ($1, $2, $3, $4, 'READY', $5, $5)
           ON CONFLICT (node_id) DO UPDATE SET
               hostname = EXCLUDED.hostname,
               gpu_flavor = EXCLUDED.gpu_flavor,
               gpu_count = EXCLUDED.gpu_count,
               status = 'READY',
               lost_at = NULL,
               last_heartbeat = GREATEST(nodes.last_heartbeat, EXCLUDED.last_heartbeat)""",
        node_id,
        hostname,
        gpu_flavor,
        gpu_count,
        now,
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


async def load_snapshot(conn: asyncpg.Connection) -> Snapshot:
    """Ready nodes with their live leases, and the queued jobs."""
    nodes = await conn.fetch(
        "SELECT node_id, gpu_flavor, gpu_count FROM nodes WHERE status = $1 ORDER BY node_id",
        NodeStatus.READY.value,
    )
    leases = await conn.fetch(
        "SELECT l.node_id, l.gpu_index, a.job_id FROM gpu_leases l "
        "JOIN allocations a USING (allocation_id) WHERE l.released_at IS NULL"
    )
    used: dict[str, dict[int, str]] = {}
    for lease in leases:
        used.setdefault(lease["node_id"], {})[lease["gpu_index"]] = lease["job_id"]
    queue = await conn.fetch(
        "SELECT job_id, seq, team, gpu_flavor, gpus, submitted_at FROM jobs "
        "WHERE status = $1 ORDER BY submitted_at, seq",
        JobStatus.QUEUED.value,
    )
    return Snapshot(
        nodes=tuple(
            NodeState(n["node_id"], n["gpu_flavor"], n["gpu_count"], used.get(n["node_id"], {}))
            for n in nodes
        ),
        queue=tuple(
            QueuedJob(
                j["job_id"], j["team"], j["gpu_flavor"], j["gpus"], j["submitted_at"], j["seq"]
            )
            for j in queue
        ),
    )


# --- jobs ------------------------------------------------------------------------------


async def insert_job(
    conn: asyncpg.Connection, job_id: str, spec: JobSpec, submitted_at: datetime, now: datetime
) -> bool:
    """Insert a QUEUED job; False when the job was already known (a re-submitted event)."""
    inserted = await conn.fetchval(
        """INSERT INTO jobs (job_id, team, user_name, gpu_flavor, gpus, max_restarts, spec,
                             status, submitted_at, updated_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, 'QUEUED', $8, $9)
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
    )
    return bool(inserted)


_JOB_COLUMNS = (
    "job_id, spec, status, status_reason, attempt, restarts, submitted_at, "
    "pending_reason, pending_position"
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
    job_id: str,
    status: JobStatus,
    now: datetime,
    reason: str | None = None,
) -> None:
    """Change a job's status; leaving QUEUED forgets its last published pending reason."""
    await conn.execute(
        "UPDATE jobs SET status = $2, updated_at = $3, status_reason = COALESCE($4, status_reason),"
        " pending_reason = NULL, pending_position = NULL WHERE job_id = $1",
        job_id,
        status.value,
        now,
        reason,
    )


async def requeue_job(
    conn: asyncpg.Connection, job_id: str, now: datetime, reason: str, count_restart: bool
) -> None:
    """Back to QUEUED for the next attempt (and one restart used, after a lost node)."""
    await conn.execute(
        "UPDATE jobs SET status = 'QUEUED', attempt = attempt + 1, "
        "restarts = restarts + $3::int, status_reason = $4, updated_at = $2, "
        "pending_reason = NULL, pending_position = NULL WHERE job_id = $1",
        job_id,
        now,
        1 if count_restart else 0,
        reason,
    )


async def set_pending(conn: asyncpg.Connection, job_id: str, reason: str, position: int) -> None:
    await conn.execute(
        "UPDATE jobs SET pending_reason = $2, pending_position = $3 WHERE job_id = $1",
        job_id,
        reason,
        position,
    )


# --- allocations and leases ------------------------------------------------------------

_ALLOCATION_COLUMNS = (
    "allocation_id, job_id, node_id, epoch, attempt, gpu_indices, status, granted_at"
)


async def next_epoch(conn: asyncpg.Connection) -> int:
    epoch: int = await conn.fetchval("SELECT nextval('allocation_epoch')")
    return epoch


async def insert_allocation(conn: asyncpg.Connection, allocation: Allocation) -> None:
    """Insert an allocation and one live lease per GPU (the unique index may refuse them)."""
    await conn.execute(
        f"INSERT INTO allocations ({_ALLOCATION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        uuid.UUID(allocation.allocation_id),
        allocation.job_id,
        allocation.node_id,
        allocation.epoch,
        allocation.attempt,
        list(allocation.gpu_indices),
        allocation.status.value,
        allocation.granted_at,
    )
    await conn.execute(
        "INSERT INTO gpu_leases (allocation_id, node_id, gpu_index) "
        "SELECT $1, $2, unnest($3::integer[])",
        uuid.UUID(allocation.allocation_id),
        allocation.node_id,
        list(allocation.gpu_indices),
    )


async def live_allocation(conn: asyncpg.Connection, job_id: str) -> Allocation | None:
    row = await conn.fetchrow(
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations "
        "WHERE job_id = $1 AND released_at IS NULL FOR UPDATE",
        job_id,
    )
    return Allocation.from_row(row) if row is not None else None


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


# --- the operator's queue view ---------------------------------------------------------


async def all_nodes(conn: asyncpg.Connection) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT node_id, hostname, gpu_flavor, gpu_count, status, last_heartbeat FROM nodes "
        "ORDER BY node_id"
    )
    return rows


async def running_allocations(conn: asyncpg.Connection) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT a.allocation_id, a.job_id, j.team, a.node_id, a.gpu_indices, a.epoch, "
        "a.attempt, a.status, a.granted_at, a.started_at, j.status AS job_status "
        "FROM allocations a JOIN jobs j USING (job_id) "
        "WHERE a.released_at IS NULL ORDER BY a.granted_at, a.epoch"
    )
    return rows


async def pending_jobs(conn: asyncpg.Connection) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT job_id, team, gpu_flavor, gpus, attempt, submitted_at, pending_reason, "
        "pending_position FROM jobs WHERE status = 'QUEUED' ORDER BY submitted_at, seq"
    )
    return rows
