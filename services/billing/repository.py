"""Billing's SQL: one function per query, each taking a connection. Tables are unqualified:
the pool's ``search_path`` is the ``billing`` schema."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.billing.domain import Usage
from trainyard_platform.services.billing.waste_rollups import OWN_REPORT
from trainyard_platform.shared.events.payloads import AllocationGranted
from trainyard_platform.shared.worst_case import billed_until

Row = Mapping[str, Any]
"""A fetched record (asyncpg.Record), read by column name."""


async def insert_usage(
    conn: asyncpg.Connection, usage: Usage, event_id: str, now: datetime
) -> bool:
    """Record ``usage``, and mark its announced allocation ``released``; False when its
    allocation was billed already."""
    inserted = await conn.fetchval(
        """INSERT INTO usage_ledger (allocation_id, job_id, team, user_name, node_id, gpu_flavor,
                                     gpus, started_at, ended_at, outcome, gpu_seconds,
                                     price_per_gpu_hour, currency, cost, event_id, recorded_at,
                                     cpus, memory_gib, charged_to)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                   $18, $19)
           ON CONFLICT (allocation_id) DO NOTHING RETURNING true""",
        usage.allocation_id,
        usage.job_id,
        usage.team,
        usage.user,
        usage.node_id,
        usage.gpu_flavor,
        usage.gpus,
        usage.started_at,
        usage.ended_at,
        usage.outcome,
        usage.gpu_seconds,
        usage.price_per_gpu_hour,
        usage.currency,
        usage.cost,
        event_id,
        now,
        usage.cpus,
        usage.memory_gib,
        usage.charged_to,
    )
    if inserted:  # its node's held GPUs are no longer looked for among the open (``_HELD``)
        await conn.execute(
            "UPDATE announced_allocations SET released = true WHERE allocation_id = $1",
            usage.allocation_id,
        )
    return bool(inserted)


async def insert_announced(
    conn: asyncpg.Connection, grant: AllocationGranted, event_id: str, now: datetime
) -> bool:
    """Remember an allocation the scheduler announced, with the CPUs and memory it holds
    (its GPUs x the spec's per-GPU amounts) and the latest end of its bill
    (``worst_case.billed_until``: the scheduler releases it no later); False when it was
    known already."""
    inserted = await conn.fetchval(
        """INSERT INTO announced_allocations (allocation_id, job_id, node_id, team, user_name,
                                              gpu_flavor, gpus, granted_at, event_id,
                                              recorded_at, project, queue, attempt, epoch,
                                              cpus, memory_gib, billed_until)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                   $17)
           ON CONFLICT (allocation_id) DO NOTHING RETURNING true""",
        grant.allocation_id,
        grant.job_id,
        grant.node_id,
        grant.spec.team,
        grant.spec.user,
        grant.spec.gpu_flavor,
        len(grant.gpu_indices),
        grant.granted_at,
        event_id,
        now,
        grant.spec.project,
        grant.queue,
        grant.attempt,
        grant.epoch,
        len(grant.gpu_indices) * grant.spec.cpus_per_gpu,
        len(grant.gpu_indices) * grant.spec.memory_gib_per_gpu,
        billed_until(grant.granted_at, grant.spec.max_runtime_seconds),
    )
    return bool(inserted)


async def announced(conn: asyncpg.Connection, allocation_id: str) -> Row | None:
    """The announced allocation (columns as in ``announced_allocations``), or None; its row
    locked until the transaction ends, so that its release and its runner's end report,
    applied concurrently, see each other (``platform_failed``)."""
    row: Row | None = await conn.fetchrow(
        "SELECT * FROM announced_allocations WHERE allocation_id = $1 FOR UPDATE", allocation_id
    )
    return row


async def platform_failed(conn: asyncpg.Connection, allocation_id: str) -> bool:
    """Whether the runner's end report of the allocation (the first one recorded of its
    own: its job, node and epoch, ``waste_rollups.OWN_REPORT``) said that the attempt
    failed through the platform."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM waste_run_reports r "
            f"JOIN announced_allocations a ON {OWN_REPORT} "
            "WHERE r.allocation_id = $1 AND r.failure_kind = 'platform_error')",
            allocation_id,
        )
    )


_SUMS = "currency, sum(gpu_seconds) AS gpu_seconds, sum(cost) AS cost, count(*) AS allocations"
_TEAMS_BILLS = "charged_to = 'team' AND ($1::text IS NULL OR team = $1)"
"""The bills of ``$1`` (every team's when NULL) that its team pays: not the platform's."""


async def usage_by_team(conn: asyncpg.Connection, team: str | None) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        f"SELECT team, {_SUMS} FROM usage_ledger WHERE {_TEAMS_BILLS} "
        "GROUP BY team, currency ORDER BY team, currency",
        team,
    )
    return rows


async def usage_by_user(conn: asyncpg.Connection, team: str | None) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        f"SELECT team, user_name, {_SUMS} FROM usage_ledger WHERE {_TEAMS_BILLS} "
        "GROUP BY team, user_name, currency ORDER BY team, user_name, currency",
        team,
    )
    return rows


async def usage_by_job(
    conn: asyncpg.Connection, team: str | None, limit: int, after: tuple[Any, ...] | None
) -> list[Row]:
    """At most ``limit`` rows of the per-job usage (one per job, flavor and currency) after
    the key ``after`` (``JOB_USAGE_KEY`` of the previous page's last row), in key order."""
    rows: list[Row] = await conn.fetch(
        f"SELECT team, user_name, job_id, gpu_flavor, min(started_at) AS first_started_at, "
        f"max(ended_at) AS last_ended_at, {_SUMS} FROM usage_ledger WHERE {_TEAMS_BILLS} "
        "GROUP BY team, user_name, job_id, gpu_flavor, currency "
        "HAVING $3::text IS NULL OR (team, user_name, min(started_at), job_id, gpu_flavor, "
        "currency) > ($3, $4, $5::timestamptz, $6, $7, $8) "
        "ORDER BY team, user_name, min(started_at), job_id, gpu_flavor, currency LIMIT $2",
        team,
        limit,
        *(after or (None,) * len(JOB_USAGE_KEY)),
    )
    return rows


JOB_USAGE_KEY = ("team", "user_name", "first_started_at", "job_id", "gpu_flavor", "currency")
"""The columns of a per-job usage row that order and page them (unique per row)."""
