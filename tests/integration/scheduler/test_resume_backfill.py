"""The optional backfill of the scheduler's resume points from the registry's checkpoints,
as docs/operations.md gives it ("Upgrade", the scheduler's ``0012``): the SQL block is read
from that file and run as it stands, on a database with both schemas migrated, so the
docs cannot drift from what it does. It copies, for each job not yet ended, the newest
checkpoint by step reported of one of the job's own allocations (id, job and epoch as the
scheduler has them), and keeps a row the scheduler already has."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[3]
SERVICES = ROOT / "services"
OPERATIONS = ROOT / "docs" / "operations.md"
NOTE = "**Jobs resume only from the checkpoint the scheduler recorded**"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def backfill_sql() -> str:
    """The first ``sql`` block after the note's heading in docs/operations.md."""
    text = OPERATIONS.read_text()
    start = text.index(NOTE)
    block = re.compile(r"```sql\n(.*?)```", re.DOTALL).search(text, start)
    assert block is not None, f"no sql block after {NOTE} in {OPERATIONS.name}"
    return block.group(1)


def _sha(n: int) -> str:
    return f"{n:064x}"


async def _job(conn: asyncpg.Connection, job_id: str, status: str) -> None:
    await conn.execute(
        "INSERT INTO scheduler.jobs (job_id, team, user_name, gpu_flavor, gpus, max_restarts, "
        "spec, status, submitted_at, updated_at, queue) "
        "VALUES ($1, 'ml', 'alice', 'h100', 1, 3, '{}', $2, $3, $3, 'default:ml')",
        job_id,
        status,
        T0,
    )


async def _allocation(conn: asyncpg.Connection, job_id: str, epoch: int) -> str:
    allocation_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO scheduler.allocations (allocation_id, job_id, node_id, epoch, attempt, "
        "gpu_indices, status, granted_at, released_at, outcome, gang_id) "
        "VALUES ($1, $2, 'n1', $3, 0, '{0}', 'RELEASED', $4, $4, 'preempted', $1)",
        allocation_id,
        job_id,
        epoch,
        T0,
    )
    return str(allocation_id)


async def _reported(
    conn: asyncpg.Connection, job_id: str, allocation_id: str, epoch: int, step: int
) -> None:
    """A checkpoint the registry recorded (``checkpoint.saved``) of step ``step``."""
    folder = f"s3://bucket/jobs/{job_id}/checkpoints/step-{step:08d}"
    await conn.execute(
        "INSERT INTO registry.checkpoints (job_id, uri, allocation_id, epoch, step, "
        "manifest_uri, size_bytes, sha256, saved_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        job_id,
        f"{folder}/checkpoint.pt",
        allocation_id,
        epoch,
        step,
        f"{folder}/manifest.json",
        step * 10,
        _sha(step),
        T0 + timedelta(seconds=step),
    )


async def test_the_documented_backfill_copies_the_newest_checkpoint_of_each_live_jobs_own_allocations(
    database_url: str,
) -> None:
    settings = DatabaseSettings(url=database_url)
    for service in ("scheduler", "registry"):
        async with open_pool(settings, service) as pool:
            await migrate(pool, service, SERVICES / service / "migrations")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO scheduler.nodes (node_id, hostname, gpu_flavor, gpu_count, status, "
            "last_heartbeat, registered_at, reported_flavor, reported_gpu_count, "
            "reported_topology) VALUES ('n1', 'n1', 'h100', 8, 'READY', $1, $1, 'h100', 8, "
            "'default')",
            T0,
        )
        await conn.execute(
            "INSERT INTO scheduler.queues (name, team, implicit) VALUES ('default:ml', 'ml', true)"
        )
        for job_id, status in (
            ("queued", "QUEUED"),
            ("running", "RUNNING"),
            ("kept", "QUEUED"),
            ("succeeded", "SUCCEEDED"),
            ("failed", "FAILED"),
            ("cancelled", "CANCELLED"),
            ("other", "QUEUED"),
        ):
            await _job(conn, job_id, status)
        a1 = await _allocation(conn, "queued", 1)
        a2 = await _allocation(conn, "queued", 2)
        await _reported(conn, "queued", a1, 1, 300)  # the newest step, of an earlier attempt
        await _reported(conn, "queued", a2, 2, 200)
        # Another job's allocation, or its own at a wrong epoch: not the job's own reports.
        await _reported(conn, "queued", await _allocation(conn, "other", 3), 3, 900)
        await _reported(conn, "queued", a2, 7, 800)
        await _reported(conn, "queued", str(uuid.uuid4()), 2, 700)
        a4 = await _allocation(conn, "running", 4)
        await _reported(conn, "running", a4, 4, 50)
        a5 = await _allocation(conn, "kept", 5)
        await _reported(conn, "kept", a5, 5, 600)
        await conn.execute(
            "INSERT INTO scheduler.resume_checkpoints (job_id, uri, manifest_uri, step, "
            "size_bytes, sha256, saved_at) VALUES ('kept', 'mine', 'mine.json', 100, 1, $1, $2)",
            _sha(1),
            T0,
        )
        for n, ended in enumerate(("succeeded", "failed", "cancelled"), start=10):
            await _reported(conn, ended, await _allocation(conn, ended, n), n, n)

        await conn.execute(backfill_sql())

        rows = await conn.fetch(
            "SELECT job_id, uri, manifest_uri, step, size_bytes, sha256, saved_at "
            "FROM scheduler.resume_checkpoints ORDER BY job_id"
        )
        got = {r["job_id"]: dict(r) for r in rows}
        assert sorted(got) == ["kept", "queued", "running"]
        folder = "s3://bucket/jobs/queued/checkpoints/step-00000300"
        assert got["queued"] == {
            "job_id": "queued",
            "uri": f"{folder}/checkpoint.pt",
            "manifest_uri": f"{folder}/manifest.json",
            "step": 300,
            "size_bytes": 3000,
            "sha256": _sha(300),
            "saved_at": T0 + timedelta(seconds=300),
        }
        assert got["running"]["step"] == 50
        assert (got["kept"]["uri"], got["kept"]["step"]) == ("mine", 100)
    finally:
        await conn.close()
