"""SQL of the operator's configuration: flavors, cohorts, queues with quotas, priority
classes, the node inventory, and what uses them. One function per query, each taking a connection; tables are the
``scheduler`` schema's (the pool's ``search_path``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.scheduler.domain import JobStatus

Row = Mapping[str, Any]

_UNFINISHED = [s.value for s in JobStatus if not s.is_terminal]

CONFIG_CHANNEL = "trainyard_scheduler_config"
"""Admin changes notify this channel when they commit; the leader's pass loop listens."""

# --- flavors ---------------------------------------------------------------------------

_FLAVOR_VIEW = """SELECT f.name, f.description, f.created_at,
           count(n.node_id) AS nodes,
           count(n.node_id) FILTER (WHERE n.status = 'READY') AS ready_nodes,
           COALESCE(sum(n.gpu_count), 0) AS gpus,
           COALESCE(sum(n.gpu_count) FILTER (WHERE n.status = 'READY'), 0) AS ready_gpus
    FROM flavors f LEFT JOIN nodes n ON n.gpu_flavor = f.name AND n.retired_at IS NULL"""
"""A flavor with its nodes, retired ones left out."""


async def flavors(conn: asyncpg.Connection, limit: int, after: str = "") -> list[Row]:
    """At most ``limit`` flavors named after ``after``, by name."""
    rows: list[Row] = await conn.fetch(
        f"{_FLAVOR_VIEW} WHERE f.name > $2 GROUP BY f.name ORDER BY f.name LIMIT $1", limit, after
    )
    return rows


async def flavor(conn: asyncpg.Connection, name: str) -> Row | None:
    row: Row | None = await conn.fetchrow(f"{_FLAVOR_VIEW} WHERE f.name = $1 GROUP BY f.name", name)
    return row


async def flavor_names(conn: asyncpg.Connection, names: Sequence[str]) -> set[str]:
    """Which of ``names`` are known flavors."""
    rows = await conn.fetch("SELECT name FROM flavors WHERE name = ANY($1::text[])", list(names))
    return {r["name"] for r in rows}


async def upsert_flavor(conn: asyncpg.Connection, name: str, description: str) -> bool:
    """Create or describe a flavor; True when it was created."""
    created: bool = await conn.fetchval(
        "INSERT INTO flavors (name, description) VALUES ($1, $2) "
        "ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description "
        "RETURNING xmax = 0",
        name,
        description,
    )
    return created


async def next_flavor_revision(conn: asyncpg.Connection) -> int:
    """The next revision of the published flavor catalogue (``flavor.declared``/``retired``)."""
    revision: int = await conn.fetchval("SELECT nextval('flavor_revisions')")
    return revision


async def transaction_time(conn: asyncpg.Connection) -> datetime:
    """When the current transaction began (the time a change is said to happen)."""
    now: datetime = await conn.fetchval("SELECT now()")
    return now


async def nodes_of_flavor(conn: asyncpg.Connection, name: str) -> list[str]:
    """Every node of the flavor, ready or lost (a lost node may come back), but not a
    retired one (an operator said it will not)."""
    rows = await conn.fetch(
        "SELECT node_id FROM nodes WHERE gpu_flavor = $1 AND retired_at IS NULL ORDER BY node_id",
        name,
    )
    return [r["node_id"] for r in rows]


# --- nodes -----------------------------------------------------------------------------


async def node_to_retire(conn: asyncpg.Connection, node_id: str) -> Row | None:
    """The node's status and last heartbeat, its row locked until the transaction ends (a
    heartbeat meanwhile waits, then makes it ready again)."""
    row: Row | None = await conn.fetchrow(
        "SELECT status, last_heartbeat FROM nodes WHERE node_id = $1 FOR UPDATE", node_id
    )
    return row


async def jobs_holding(conn: asyncpg.Connection, node_id: str) -> list[str]:
    """The jobs with a live allocation or a live GPU lease on the node, by id."""
    rows = await conn.fetch(
        "SELECT job_id FROM allocations WHERE node_id = $1 AND released_at IS NULL "
        "UNION SELECT a.job_id FROM gpu_leases l JOIN allocations a USING (allocation_id) "
        "WHERE l.node_id = $1 AND l.released_at IS NULL ORDER BY job_id",
        node_id,
    )
    return [r["job_id"] for r in rows]


async def retire_node(conn: asyncpg.Connection, node_id: str, now: datetime) -> None:
    """Mark the (lost) node retired as of ``now``; one already retired keeps its time."""
    await conn.execute(
        "UPDATE nodes SET retired_at = COALESCE(retired_at, $2) WHERE node_id = $1",
        node_id,
        now,
    )


# --- the node inventory ----------------------------------------------------------------

_DECLARATION_VIEW = """SELECT i.node_id, i.gpu_flavor, i.gpu_count, i.topology, i.description,
           n.reported_flavor, n.reported_gpu_count, n.reported_topology, n.status,
           n.last_heartbeat
    FROM node_inventory i LEFT JOIN nodes n ON n.node_id = i.node_id AND n.retired_at IS NULL"""
"""A declaration with its node's latest claim (none for a node never heard, or retired)."""


async def declarations(conn: asyncpg.Connection, limit: int, after: str = "") -> list[Row]:
    """At most ``limit`` declarations of nodes after ``after``, by node id."""
    rows: list[Row] = await conn.fetch(
        f"{_DECLARATION_VIEW} WHERE i.node_id > $2 ORDER BY i.node_id LIMIT $1", limit, after
    )
    return rows


async def declaration(conn: asyncpg.Connection, node_id: str, lock: bool = False) -> Row | None:
    """The node's declaration (None: none), its row locked with ``lock``."""
    row: Row | None = await conn.fetchrow(
        f"{_DECLARATION_VIEW} WHERE i.node_id = $1" + (" FOR UPDATE OF i" if lock else ""),
        node_id,
    )
    return row


async def upsert_declaration(
    conn: asyncpg.Connection,
    node_id: str,
    gpu_flavor: str,
    gpu_count: int,
    topology: str | None,
    description: str,
) -> bool:
    """Declare the node (a new revision, so its next heartbeat is judged by it); True when
    it was not declared before."""
    created: bool = await conn.fetchval(
        "INSERT INTO node_inventory (node_id, gpu_flavor, gpu_count, topology, description, "
        "revision) VALUES ($1, $2, $3, $4, $5, nextval('node_inventory_revisions')) "
        "ON CONFLICT (node_id) DO UPDATE SET gpu_flavor = EXCLUDED.gpu_flavor, "
        "gpu_count = EXCLUDED.gpu_count, topology = EXCLUDED.topology, "
        "description = EXCLUDED.description, revision = EXCLUDED.revision, updated_at = now() "
        "RETURNING xmax = 0",
        node_id,
        gpu_flavor,
        gpu_count,
        topology,
        description,
    )
    return created


async def delete_declaration(conn: asyncpg.Connection, node_id: str) -> None:
    await conn.execute("DELETE FROM node_inventory WHERE node_id = $1", node_id)


async def declared_nodes_of_flavor(conn: asyncpg.Connection, flavor: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT node_id FROM node_inventory WHERE gpu_flavor = $1 ORDER BY node_id", flavor
    )
    return [r["node_id"] for r in rows]


async def queues_with_quota_of(conn: asyncpg.Connection, flavor: str) -> list[str]:
    rows = await conn.fetch("SELECT queue FROM quotas WHERE flavor = $1 ORDER BY queue", flavor)
    return [r["queue"] for r in rows]


async def delete_flavor(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("DELETE FROM flavors WHERE name = $1", name)


# --- cohorts ---------------------------------------------------------------------------

_COHORT_VIEW = """SELECT c.name, c.description, c.created_at, c.updated_at,
           COALESCE(array_agg(q.name ORDER BY q.name) FILTER (WHERE q.name IS NOT NULL),
                    '{}') AS queues
    FROM cohorts c LEFT JOIN queues q ON q.cohort = c.name"""


async def cohorts(conn: asyncpg.Connection, limit: int, after: str = "") -> list[Row]:
    """At most ``limit`` cohorts named after ``after``, by name."""
    rows: list[Row] = await conn.fetch(
        f"{_COHORT_VIEW} WHERE c.name > $2 GROUP BY c.name ORDER BY c.name LIMIT $1", limit, after
    )
    return rows


async def cohort(conn: asyncpg.Connection, name: str) -> Row | None:
    row: Row | None = await conn.fetchrow(f"{_COHORT_VIEW} WHERE c.name = $1 GROUP BY c.name", name)
    return row


async def upsert_cohort(conn: asyncpg.Connection, name: str, description: str) -> bool:
    created: bool = await conn.fetchval(
        "INSERT INTO cohorts (name, description) VALUES ($1, $2) "
        "ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description, "
        "updated_at = now() RETURNING xmax = 0",
        name,
        description,
    )
    return created


async def delete_cohort(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("DELETE FROM cohorts WHERE name = $1", name)


# --- queues and quotas -----------------------------------------------------------------


async def queues(conn: asyncpg.Connection, limit: int | None = None, after: str = "") -> list[Row]:
    """At most ``limit`` queues named after ``after``, by name (None: every one, for the
    scheduler's own passes and its whole-cluster view, never for a listing)."""
    rows: list[Row] = await conn.fetch(
        "SELECT name, team, cohort, weight, implicit, created_at, updated_at FROM queues "
        "WHERE name > $2 ORDER BY name LIMIT $1",
        limit,
        after,
    )
    return rows


async def queue(conn: asyncpg.Connection, name: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        "SELECT name, team, cohort, weight, implicit, created_at, updated_at FROM queues "
        "WHERE name = $1",
        name,
    )
    return row


async def queue_of_team(conn: asyncpg.Connection, team: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        "SELECT name, team, cohort, weight, implicit FROM queues WHERE team = $1", team
    )
    return row


async def quotas(conn: asyncpg.Connection, queue_names: Sequence[str] | None = None) -> list[Row]:
    """Quota rows of these queues (all queues when None), by queue and flavor."""
    rows: list[Row] = await conn.fetch(
        "SELECT queue, flavor, nominal, borrowing_limit, lending_limit FROM quotas "
        "WHERE $1::text[] IS NULL OR queue = ANY($1::text[]) ORDER BY queue, flavor",
        None if queue_names is None else list(queue_names),
    )
    return rows


async def upsert_queue(
    conn: asyncpg.Connection, name: str, team: str, cohort: str | None, weight: float
) -> bool:
    created: bool = await conn.fetchval(
        "INSERT INTO queues (name, team, cohort, weight) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (name) DO UPDATE SET cohort = EXCLUDED.cohort, weight = EXCLUDED.weight, "
        "updated_at = now() RETURNING xmax = 0",
        name,
        team,
        cohort,
        weight,
    )
    return created


async def replace_quotas(
    conn: asyncpg.Connection,
    queue_name: str,
    rows: Sequence[tuple[str, int, int | None, int | None]],
) -> None:
    """The queue's quotas become ``rows`` of (flavor, nominal, borrowing, lending limit)."""
    await conn.execute("DELETE FROM quotas WHERE queue = $1", queue_name)
    await conn.executemany(
        "INSERT INTO quotas (queue, flavor, nominal, borrowing_limit, lending_limit) "
        "VALUES ($1, $2, $3, $4, $5)",
        [(queue_name, *row) for row in rows],
    )


async def adopt_implicit_queue(
    conn: asyncpg.Connection, implicit: str, name: str, cohort: str | None, weight: float
) -> None:
    """Turn a team's implicit queue into its named queue; its jobs follow (the foreign key
    cascades the rename)."""
    await conn.execute(
        "UPDATE queues SET name = $2, implicit = false, cohort = $3, weight = $4, "
        "updated_at = now() WHERE name = $1 AND implicit",
        implicit,
        name,
        cohort,
        weight,
    )


async def queue_has_jobs(conn: asyncpg.Connection, name: str) -> bool:
    """Whether any job, finished or not, names the queue."""
    found: bool = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = $1)", name)
    return found


async def make_queue_implicit(conn: asyncpg.Connection, name: str, implicit: str) -> None:
    """Turn a queue without quotas back into its team's implicit queue named ``implicit``;
    its jobs follow (the foreign key cascades the rename)."""
    await conn.execute(
        "UPDATE queues SET name = $2, implicit = true, cohort = NULL, weight = DEFAULT, "
        "updated_at = now() WHERE name = $1",
        name,
        implicit,
    )


async def delete_queue(conn: asyncpg.Connection, name: str) -> None:
    """Delete a queue no job names; its quotas go with it (``ON DELETE CASCADE``)."""
    await conn.execute("DELETE FROM queues WHERE name = $1", name)


# --- priority classes ------------------------------------------------------------------

_CLASS_COLUMNS = (
    "name, value, preemptible, min_runtime_seconds, description, created_at, updated_at"
)


async def priority_classes(
    conn: asyncpg.Connection, limit: int, after: tuple[int, str] | None = None
) -> list[Row]:
    """At most ``limit`` classes after the class ``after`` (its value and name), highest
    value first, then by name."""
    rows: list[Row] = await conn.fetch(
        f"SELECT {_CLASS_COLUMNS} FROM priority_classes "
        "WHERE $2::bigint IS NULL OR (-value, name) > (-$2::bigint, $3::text) "
        "ORDER BY value DESC, name LIMIT $1",
        limit,
        *(after if after else (None, None)),
    )
    return rows


async def priority_class(conn: asyncpg.Connection, name: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        f"SELECT {_CLASS_COLUMNS} FROM priority_classes WHERE name = $1", name
    )
    return row


async def upsert_priority_class(
    conn: asyncpg.Connection,
    name: str,
    value: int,
    preemptible: bool,
    min_runtime_seconds: float,
    description: str,
) -> bool:
    created: bool = await conn.fetchval(
        "INSERT INTO priority_classes (name, value, preemptible, min_runtime_seconds, "
        "description) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, "
        "preemptible = EXCLUDED.preemptible, min_runtime_seconds = EXCLUDED.min_runtime_seconds, "
        "description = EXCLUDED.description, updated_at = now() RETURNING xmax = 0",
        name,
        value,
        preemptible,
        min_runtime_seconds,
        description,
    )
    return created


async def delete_priority_class(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("DELETE FROM priority_classes WHERE name = $1", name)


# --- jobs ------------------------------------------------------------------------------


async def unfinished_jobs(
    conn: asyncpg.Connection,
    *,
    flavor: str | None = None,
    queue: str | None = None,
    priority_class: str | None = None,
) -> list[str]:
    """Ids of the jobs not yet in a terminal status with the given flavor, queue and class
    (each filter optional), in arrival order."""
    rows = await conn.fetch(
        "SELECT job_id FROM jobs WHERE status = ANY($1::text[]) "
        "AND ($2::text IS NULL OR gpu_flavor = $2) AND ($3::text IS NULL OR queue = $3) "
        "AND ($4::text IS NULL OR priority_class = $4) ORDER BY seq",
        _UNFINISHED,
        flavor,
        queue,
        priority_class,
    )
    return [r["job_id"] for r in rows]


# --- change notification ---------------------------------------------------------------


async def notify_config_changed(conn: asyncpg.Connection) -> None:
    """Wake the leader's pass loop when this transaction commits."""
    await conn.execute("SELECT pg_notify($1, '')", CONFIG_CHANNEL)
