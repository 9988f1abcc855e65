"""The registry's retention prunes the ends of jobs it kept for a parent not heard of yet
(``jobs_ended_unheard``) once they were kept longer than the event stream keeps an event,
as it prunes its inbox. Before, one row per job that ended without starting in the
registry's view stayed forever."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from trainyard_platform.services.registry import job_inputs
from trainyard_platform.services.registry.retention import RegistryPruned, RegistryRetention

pytestmark = pytest.mark.integration


async def test_kept_ends_older_than_the_horizon_are_pruned_in_batches(pool: asyncpg.Pool) -> None:
    now = datetime.now(UTC)
    old = [f"old-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    new = f"new-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        for job_id in [*old, new]:
            async with conn.transaction():
                await job_inputs.ended(conn, job_id, now)  # cancelled before anything else
        await conn.execute(
            "UPDATE jobs_ended_unheard SET kept_at = $2 WHERE job_id = ANY($1::text[])",
            old,
            now - timedelta(days=8),
        )

    retention = RegistryRetention(pool, horizon_hours=168, batch=2)
    pruned = await retention.prune_once(now - timedelta(days=7))

    assert isinstance(pruned, RegistryPruned)
    assert pruned.ended_unheard == 5
    async with pool.acquire() as conn:
        left = await conn.fetch(
            "SELECT job_id FROM jobs_ended_unheard WHERE job_id = ANY($1::text[])", [*old, new]
        )
    assert [r["job_id"] for r in left] == [new]


async def test_a_kept_end_counts_from_when_the_registry_kept_it_not_the_job_s_end(
    pool: asyncpg.Pool,
) -> None:
    """A job's end is what its runner's clock said: one long past, handled now, is kept for
    a whole horizon from now, while a late event naming its parent can still come."""
    now = datetime.now(UTC)
    job_id = f"late-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn, conn.transaction():
        await job_inputs.ended(conn, job_id, now - timedelta(days=30))

    await RegistryRetention(pool, horizon_hours=168).prune_once(now - timedelta(days=7))

    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT 1 FROM jobs_ended_unheard WHERE job_id = $1", job_id)
