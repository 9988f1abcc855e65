"""Submission's ``0014_early_reports_by_node.sql`` applies over kept reports a hostile node
could have left: an event whose JSON holds a ``\\u0000`` escape cannot be read as jsonb,
and one such row must not stop the migration (and so the service's start) for good."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainyard_platform.services.submission.service import MIGRATIONS
from trainyard_platform.shared.db import migrate, migration_files, open_pool
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

BY_NODE = "0014_early_reports_by_node.sql"


async def test_kept_reports_get_their_node_and_an_unreadable_one_stops_nothing(
    database_url: str, tmp_path: Path
) -> None:
    before = tmp_path / "migrations"
    before.mkdir()
    for path in migration_files(MIGRATIONS):
        if path.name < BY_NODE:
            shutil.copy(path, before / path.name)
    async with open_pool(DatabaseSettings(url=database_url), "submission") as pool:
        await migrate(pool, "submission", before)
        async with pool.acquire() as conn:
            # Kept reports of a job: the job row's own columns are beside the point here.
            await conn.execute("SET session_replication_role = replica")
            await conn.execute(
                "INSERT INTO early_reports (allocation_id, job_id, event) VALUES "
                "('a-1', 'job-1', $1), ('a\\u0000', 'job-1', $2)",
                b'{"type": "trainyard.job.started.v1", "data": {"node_id": "node-a"}}',
                b'{"type": "trainyard.job.started.v1", "data": {"node_id": "node-b", '
                b'"allocation_id": "a\\u0000"}}',
            )
            await conn.execute("SET session_replication_role = DEFAULT")
        applied = await migrate(pool, "submission", MIGRATIONS)
        assert f"service/{BY_NODE}" in applied
        rows = await pool.fetch("SELECT allocation_id, node_id FROM early_reports ORDER BY seq")
    assert [(r["allocation_id"], r["node_id"]) for r in rows] == [
        ("a-1", "node-a"),
        ("a\\u0000", None),  # counted with the reports naming no node
    ]
