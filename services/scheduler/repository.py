"""The scheduler's SQL: one function per query, each taking a connection (usually inside the
transaction of the event being handled). Tables are unqualified: the pool's ``search_path``
is the ``scheduler`` schema."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from trainyard_platform.services.scheduler import budget_holds
from trainyard_platform.services.scheduler.convert import PendingNote, SnapshotRows, implicit_queue
from trainyard_platform.services.scheduler.domain import (
    Job,
    JobStatus,
    NodeStatus,
)
from trainyard_platform.services.scheduler.inventory import (
    NO_FLAVOR,
    SAY_MIN_INTERVAL,
    Declared,
    InventoryMode,
    Supply,
)
from trainyard_platform.shared.events.payloads import JobSpec
from trainyard_platform.shared.telemetry import inject

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
    address: str = "127.0.0.1",
    mode: InventoryMode = InventoryMode.OPTIONAL,
) -> bool:
    """A heartbeat that changes no supply: a READY node claiming what it claimed before,
    whose supply was judged under ``mode`` and by its declaration as it is now (its
    revision; none, for an undeclared node), only moves its last heartbeat (and takes its
    hostname and address as reported). False when anything else changed (or the node is
    new), or its supply's version was held back from being said longer than
    ``inventory.SAY_MIN_INTERVAL``: ``upsert_node`` judges it again."""
    touched = await conn.fetchval(
        """UPDATE nodes SET hostname = $2, address = $7,
                            last_heartbeat = GREATEST(last_heartbeat, $6)
           WHERE node_id = $1 AND status = 'READY' AND reported_flavor = $3
                 AND reported_gpu_count = $4 AND reported_topology = $5
                 AND inventory_mode = $8
                 AND inventory_revision IS NOT DISTINCT FROM
                     (SELECT revision FROM node_inventory WHERE node_id = $1)
                 AND (supply_said_version = supply_version OR supply_said_at > $6::timestamptz - $9::interval)
           RETURNING true""",
        node_id,
        hostname,
        gpu_flavor,
        gpu_count,
        topology,
        now,
        address,
        mode.value,
        SAY_MIN_INTERVAL,
    )
    return bool(touched)


@dataclass(frozen=True)
class Judged:
    """A known node as a pass reads it (``load_snapshot_rows``) and as its supply was last
    judged: what a new judgement of it is compared with."""

    ready: bool
    """Its status is READY: a pass places on it."""
    supply: tuple[str, int, str]
    """Its flavor, GPU count and topology: what a pass places on."""
    capped: frozenset[str]
    """The fields its last judgement capped (``inventory.Capped.field``)."""
    by: tuple[str, int | None] | None
    """The inventory mode and declaration revision its supply was judged by (None: never
    judged: before ``0015``, or reset by ``0016``)."""

    def places_as(self, supply: Supply) -> bool:
        """Whether a pass reads the node, READY with ``supply``, as it reads it now."""
        return self.ready and self.supply == (supply.gpu_flavor, supply.gpu_count, supply.topology)


async def judged(conn: asyncpg.Connection, node_id: str) -> Judged | None:
    """The node as it is before a judgement (None: a new node), its row locked until the
    transaction ends."""
    row = await conn.fetchrow(
        "SELECT status, gpu_flavor, gpu_count, topology, capped, inventory_mode, "
        "inventory_revision FROM nodes WHERE node_id = $1 FOR UPDATE",
        node_id,
    )
    if row is None:
        return None
    mode = row["inventory_mode"]
    return Judged(
        ready=row["status"] == NodeStatus.READY.value,
        supply=(row["gpu_flavor"], row["gpu_count"], row["topology"]),
        capped=frozenset(row["capped"]),
        by=None if mode is None else (mode, row["inventory_revision"]),
    )


async def declaration(conn: asyncpg.Connection, node_id: str) -> Declared | None:
    """The node's declaration in the inventory (None: it has none)."""
    row = await conn.fetchrow(
        "SELECT gpu_flavor, gpu_count, topology, revision FROM node_inventory WHERE node_id = $1",
        node_id,
    )
    if row is None:
        return None
    return Declared(row["gpu_flavor"], row["gpu_count"], row["topology"], row["revision"])


async def upsert_node(
    conn: asyncpg.Connection,
    node_id: str,
    hostname: str,
    gpu_flavor: str,
    gpu_count: int,
    now: datetime,
    topology: str = "default",
    address: str = "127.0.0.1",
    *,
    supply: Supply | None = None,
    mode: InventoryMode | None = None,
    revision: int | None = None,
) -> None:
    """Record a heartbeat: the node is READY, claiming ``gpu_flavor``, ``gpu_count`` and
    ``topology``, with ``supply`` (``inventory.cap`` of that claim under ``mode`` by the
    declaration of ``revision``; None: the claim itself, judged by nothing) for placement;
    the supply's flavor is registered if new (an undeclared node in a mode that requires a
    declaration has none: ``NO_FLAVOR``). A retired node is an ordinary node again. A supply
    of another flavor or GPU count than the node had gets the next ``supply_version``
    (``node_supply``)."""
    supply = supply or Supply(gpu_flavor, gpu_count, topology)
    if supply.gpu_flavor != NO_FLAVOR:
        await conn.execute(
            "INSERT INTO flavors (name) VALUES ($1) ON CONFLICT DO NOTHING", supply.gpu_flavor
        )
    await conn.execute(
        """INSERT INTO nodes (node_id, hostname, gpu_flavor, gpu_count, topology, status,
                              last_heartbeat, registered_at, address, reported_flavor,
                              reported_gpu_count, reported_topology, capped, inventory_mode,
                              inventory_revision)
           VALUES ($1, $2, $3, $4, $6, 'READY', $5, $5, $7, $8, $9, $10, $11, $12, $13)
           ON CONFLICT (node_id) DO UPDATE SET
               hostname = EXCLUDED.hostname,
               gpu_flavor = EXCLUDED.gpu_flavor,
               gpu_count = EXCLUDED.gpu_count,
               topology = EXCLUDED.topology,
               address = EXCLUDED.address,
               reported_flavor = EXCLUDED.reported_flavor,
               reported_gpu_count = EXCLUDED.reported_gpu_count,
               reported_topology = EXCLUDED.reported_topology,
               capped = EXCLUDED.capped,
               inventory_mode = EXCLUDED.inventory_mode,
               inventory_revision = EXCLUDED.inventory_revision,
               status = 'READY',
               lost_at = NULL,
               retired_at = NULL,
               last_heartbeat = GREATEST(nodes.last_heartbeat, EXCLUDED.last_heartbeat),
               supply_version = nodes.supply_version
                   + CASE WHEN (nodes.gpu_flavor, nodes.gpu_count)
                               = (EXCLUDED.gpu_flavor, EXCLUDED.gpu_count)
                          THEN 0 ELSE 1 END""",
        node_id,
        hostname,
        supply.gpu_flavor,
        supply.gpu_count,
        now,
        supply.topology,
        address,
        gpu_flavor,
        gpu_count,
        topology,
        supply.capped_fields,
        None if mode is None else mode.value,
        revision,
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


_PENDING_ROWS = (
    "SELECT job_id, queue, gpu_flavor, gpus, priority_class, submitted_at, "
    "max_runtime_seconds, seq, pending_reason, pending_position, pending_blocking, "
    "pending_suggestion, pending_estimated_start, eligible_at, attempt, restarts, max_restarts, "
    "platform_retries, team, spec->>'project' AS project, lowered_from, "
    # What a budget reserves the job at (budget_holds.reservation).
    "coalesce((spec->>'cpus_per_gpu')::int, 0) AS cpus_per_gpu, "
    "coalesce((spec->>'memory_gib_per_gpu')::int, 0) AS memory_gib_per_gpu FROM jobs"
)


async def queued_rows(conn: asyncpg.Connection, job_ids: Sequence[str]) -> dict[str, Row]:
    """Those of these jobs that are queued, as ``load_snapshot_rows`` reads pending jobs."""
    rows = await conn.fetch(
        f"{_PENDING_ROWS} WHERE status = $1 AND job_id = ANY($2::text[])",
        JobStatus.QUEUED.value,
        list(job_ids),
    )
    return {r["job_id"]: r for r in rows}


async def load_snapshot_rows(conn: asyncpg.Connection) -> SnapshotRows:
    """Everything a pass needs (see ``convert.SnapshotRows``); call under the pass lock so
    the queries see one state — except for jobs submitted meanwhile, which only add rows
    that the next pass takes."""
    ready = NodeStatus.READY.value
    return SnapshotRows(
        # Pending jobs first: submissions are inserted without the pass lock (see
        # handlers.dispatch), and a job seen here has its queue committed already, so the
        # queries below find it.
        pending=await conn.fetch(f"{_PENDING_ROWS} WHERE status = $1", JobStatus.QUEUED.value),
        nodes=await conn.fetch(
            "SELECT node_id, gpu_flavor, gpu_count, topology, address, "
            "cordoned_at IS NOT NULL AS cordoned FROM nodes WHERE status = $1",
            ready,
        ),
        leases=await conn.fetch(
            "SELECT l.node_id, l.gpu_index, a.job_id, "
            "l.stopping_since IS NOT NULL AS stopping, CASE WHEN l.stopping_since IS NOT NULL "
            "THEN (SELECT j.team FROM jobs j WHERE j.job_id = a.job_id) END AS team "
            "FROM gpu_leases l "
            "JOIN allocations a USING (allocation_id) JOIN nodes n ON n.node_id = l.node_id "
            "WHERE l.released_at IS NULL AND n.status = $1",
            ready,
        ),
        running=await conn.fetch(
            "SELECT a.allocation_id, a.epoch, a.job_id, j.queue, j.gpu_flavor, j.gpus, "
            "j.priority_class, j.submitted_at, j.seq, "
            "j.max_runtime_seconds, j.status AS job_status, j.updated_at AS job_updated_at, "
            "a.node_id, a.gpu_indices, a.granted_at, a.started_at, a.last_checkpoint_at, "
            "a.notice_at, a.borrowed, (SELECT count(DISTINCT p.attempt) FROM allocations p "
            "WHERE p.job_id = a.job_id AND p.outcome = 'preempted' "
            # Only the policy's own preemptions (it gave a notice): a runner that restarted
            # or drained also ends its jobs 'preempted', which is no thrash to bound, and a
            # job its spent budget stopped (budget_holds.stops) was no victim of the policy.
            "AND p.notice_at IS NOT NULL "
            f"AND coalesce(p.notice_reason, '') NOT LIKE '{budget_holds.STOP_PREFIX}%') "
            "AS preemptions, "
            "j.team, j.spec->>'project' AS project, "
            "coalesce((j.spec->>'cpus_per_gpu')::int, 0) AS cpus_per_gpu, "
            "coalesce((j.spec->>'memory_gib_per_gpu')::int, 0) AS memory_gib_per_gpu "
            "FROM allocations a JOIN jobs j USING (job_id) "
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
        budgets=await budget_holds.load(conn),
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


async def waiting_jobs(conn: asyncpg.Connection, team: str, most: int) -> int:
    """How many of ``team``'s jobs wait (``QUEUED``), counted up to ``most`` at most (the
    index of queued jobs by team: never more than ``most`` entries read)."""
    count: int = await conn.fetchval(
        "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE team = $1 AND status = 'QUEUED' "
        "LIMIT $2) waiting",
        team,
        most,
    )
    return count


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


@dataclass(frozen=True)
class NewJob:
    """A submitted job to queue (``insert_jobs``)."""

    job_id: str
    spec: JobSpec
    submitted_at: datetime
    queue: str
    trace_context: Mapping[str, str] | None
    """The trace context its submission's handling runs in (None: none)."""
    lowered_from: str | None = None
    """The class it asked for when a spent budget had submission admit it at ``low``
    (``job.submitted``'s ``lowered_from``); None: admitted at the class it asked for."""


async def insert_jobs(conn: asyncpg.Connection, jobs: Sequence[NewJob], now: datetime) -> set[str]:
    """Insert QUEUED jobs as ``insert_job`` does, in one statement however many there are,
    in this order (their ``seq``, the tie-break of equal submit times, follows it); returns
    the ids inserted: a job already known (a re-submitted event) is left as it is. The ids
    must be distinct."""
    if not jobs:
        return set()
    rows = await conn.fetch(
        """INSERT INTO jobs (job_id, team, user_name, gpu_flavor, gpus, max_restarts, spec,
                             status, submitted_at, updated_at, queue, priority_class,
                             max_runtime_seconds, trace_context, lowered_from)
           SELECT j.job_id, j.team, j.user_name, j.gpu_flavor, j.gpus, j.max_restarts, j.spec,
                  'QUEUED', j.submitted_at, $12, j.queue, j.priority_class, j.runtime,
                  j.trace_context, j.lowered_from
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::integer[],
                       $6::integer[], $7::jsonb[], $8::timestamptz[], $9::text[], $10::text[],
                       $11::integer[], $13::jsonb[], $14::text[])
                WITH ORDINALITY AS j(job_id, team, user_name, gpu_flavor, gpus, max_restarts,
                                     spec, submitted_at, queue, priority_class, runtime,
                                     trace_context, lowered_from, n)
           ORDER BY j.n
           ON CONFLICT (job_id) DO NOTHING RETURNING job_id""",
        [j.job_id for j in jobs],
        [j.spec.team for j in jobs],
        [j.spec.user for j in jobs],
        [j.spec.gpu_flavor for j in jobs],
        [j.spec.gpus for j in jobs],
        [j.spec.max_restarts for j in jobs],
        [j.spec.model_dump(mode="json") for j in jobs],
        [j.submitted_at for j in jobs],
        [j.queue for j in jobs],
        [j.spec.priority for j in jobs],
        [max(1, j.spec.max_runtime_seconds) for j in jobs],
        now,
        [dict(j.trace_context) if j.trace_context else None for j in jobs],
        [j.lowered_from for j in jobs],
    )
    return {r["job_id"] for r in rows}


_JOB_COLUMNS = (
    "job_id, spec, status, status_reason, attempt, restarts, submitted_at, "
    "pending_reason, pending_position, queue, trace_context, updated_at, platform_retries"
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
    """Change these jobs' status; leaving QUEUED forgets their last published pending note and
    their back-off."""
    await conn.execute(
        "UPDATE jobs SET status = $2, updated_at = $3, status_reason = COALESCE($4, status_reason),"
        f" eligible_at = NULL, {_NO_PENDING} WHERE job_id = ANY($1::text[])",
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


class Requeue(NamedTuple):
    """A job going back to QUEUED for its next attempt (``requeue_jobs``)."""

    job_id: str
    reason: str
    restart: bool
    """It uses up one of the job's ``max_restarts``."""
    platform_retry: bool
    """It uses up one of the platform's retries (``jobs.platform_retries``)."""
    eligible_at: datetime | None
    """None: placeable at once."""


async def requeue_jobs(
    conn: asyncpg.Connection, requeues: Sequence[Requeue], now: datetime
) -> None:
    """Back to QUEUED for the next attempt, in one statement however many there are."""
    if not requeues:
        return
    await conn.execute(
        "UPDATE jobs j SET status = 'QUEUED', attempt = j.attempt + 1, "
        "restarts = j.restarts + r.restart::int, "
        "platform_retries = j.platform_retries + r.platform_retry::int, "
        f"status_reason = r.reason, updated_at = $6, eligible_at = r.eligible_at, {_NO_PENDING} "
        "FROM unnest($1::text[], $2::text[], $3::boolean[], $4::boolean[], $5::timestamptz[]) "
        "     AS r(job_id, reason, restart, platform_retry, eligible_at) "
        "WHERE j.job_id = r.job_id",
        [r.job_id for r in requeues],
        [r.reason for r in requeues],
        [r.restart for r in requeues],
        [r.platform_retry for r in requeues],
        [r.eligible_at for r in requeues],
        now,
    )


async def next_eligible_at(conn: asyncpg.Connection, now: datetime) -> datetime | None:
    """When the next job backing off after a failure becomes placeable (None: none waits)."""
    at: datetime | None = await conn.fetchval(
        "SELECT min(eligible_at) FROM jobs WHERE eligible_at > $1", now
    )
    return at


async def set_pending(conn: asyncpg.Connection, notes: Sequence[tuple[str, PendingNote]]) -> None:
    """Remember the notes published for these queued jobs, in one statement however many
    there are (a pass over a long queue can publish thousands)."""
    if not notes:
        return
    await conn.execute(
        "UPDATE jobs j SET pending_reason = n.reason, pending_position = n.position, "
        "pending_blocking = n.blocking, pending_suggestion = n.suggestion, "
        "pending_estimated_start = n.estimated_start "
        "FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], "
        "$6::timestamptz[]) AS n(job_id, reason, position, blocking, suggestion, estimated_start) "
        "WHERE j.job_id = n.job_id",
        [job_id for job_id, _ in notes],
        [n.reason for _, n in notes],
        [n.position for _, n in notes],
        [n.blocking for _, n in notes],
        [n.suggestion for _, n in notes],
        [n.estimated_start for _, n in notes],
    )


_NO_PENDING = (
    "pending_reason = NULL, pending_position = NULL, pending_blocking = NULL, "
    "pending_suggestion = NULL, pending_estimated_start = NULL"
)

# --- the operator's queue view ---------------------------------------------------------


async def all_nodes(conn: asyncpg.Connection, retired: bool = False) -> list[Row]:
    """Every node by id, the retired ones only when ``retired``."""
    rows: list[Row] = await conn.fetch(
        "SELECT node_id, hostname, gpu_flavor, gpu_count, topology, status, last_heartbeat, "
        "cordoned_at, cordon_reason, cordoned_by, cordoned_until, retired_at, capped, "
        "reported_flavor, reported_gpu_count, reported_topology FROM nodes "
        "WHERE $1 OR retired_at IS NULL ORDER BY node_id",
        retired,
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


async def stopping_leases(conn: asyncpg.Connection) -> list[Row]:
    """GPUs still leased to ended allocations while their runners stop them (``leases``):
    node_id, gpu_index, job_id."""
    rows: list[Row] = await conn.fetch(
        "SELECT l.node_id, l.gpu_index, a.job_id FROM gpu_leases l "
        "JOIN allocations a USING (allocation_id) "
        "WHERE l.released_at IS NULL AND l.stopping_since IS NOT NULL "
        "ORDER BY l.node_id, l.gpu_index"
    )
    return rows


_PENDING_COLUMNS = (
    "job_id, team, queue, gpu_flavor, gpus, priority_class, attempt, submitted_at, "
    "pending_reason, pending_position, pending_blocking, pending_suggestion, "
    "pending_estimated_start, eligible_at, seq"
)
_LAST_POSITION = 2**31 - 1
"""Stands for no position yet in the waiting order's key: after every real one (an integer
column), as ``NULLS LAST`` sorts it."""


async def pending_heads(conn: asyncpg.Connection, per_queue: int) -> list[Row]:
    """The first ``per_queue`` queued jobs of each queue in the order of their last
    published position, each with ``waiting``: how many wait in its queue in all."""
    rows: list[Row] = await conn.fetch(
        f"SELECT * FROM (SELECT {_PENDING_COLUMNS}, "
        "row_number() OVER w AS place, count(*) OVER (PARTITION BY queue) AS waiting "
        "FROM jobs WHERE status = 'QUEUED' WINDOW w AS (PARTITION BY queue "
        "ORDER BY pending_position NULLS LAST, submitted_at, seq)) AS ranked "
        "WHERE place <= $1 ORDER BY queue, place",
        per_queue,
    )
    return rows


def pending_key(row: Row) -> tuple[int, datetime, int]:
    """A queued job's place in its queue's waiting order (``pending_page``'s key)."""
    position = row["pending_position"]
    return (_LAST_POSITION if position is None else position, row["submitted_at"], row["seq"])


async def pending_page(
    conn: asyncpg.Connection, queue: str, limit: int, after: tuple[int, datetime, int] | None
) -> list[Row]:
    """At most ``limit`` queued jobs of ``queue`` in waiting order, after the key ``after``
    (``pending_key``; None: from the first)."""
    rows: list[Row] = await conn.fetch(
        f"SELECT {_PENDING_COLUMNS} FROM jobs WHERE status = 'QUEUED' AND queue = $1 "
        "AND ($3::integer IS NULL "
        "OR (COALESCE(pending_position, $6), submitted_at, seq) "
        "> ($3::integer, $4::timestamptz, $5::bigint)) "
        "ORDER BY pending_position NULLS LAST, submitted_at, seq LIMIT $2",
        queue,
        limit,
        *(after if after else (None, None, None)),
        _LAST_POSITION,
    )
    return rows
