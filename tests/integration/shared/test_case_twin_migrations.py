"""The migrations that make names unique regardless of case (submission's teams and users;
the registry's models, datasets and experiments), on a database that already holds names
differing only by case: the upgrade succeeds, every row stays as it was spelled, the later
ones of each group are marked (``case_twin``, the list docs/operations.md tells operators
to read), and a new name differing only by case from any of them is refused by the
index."""

from __future__ import annotations

import shutil
from pathlib import Path

import asyncpg
import pytest

from trainyard_platform.shared.db import migrate, migration_files, open_pool
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

SERVICES = Path(__file__).parents[3] / "services"
INSERTS = {
    "models": "INSERT INTO models (team, name, created_at) VALUES ($1, $2, now())",
    "datasets": "INSERT INTO datasets (team, name, created_at, created_by) "
    "VALUES ($1, $2, now(), 'x')",
    "experiments": "INSERT INTO experiments (team, project, name, created_at) "
    "VALUES ($1, 'default', $2, now())",
}


def _copy_before(service: str, last: str, into: Path) -> Path:
    """``into``, holding ``service``'s migration files before ``last``."""
    into.mkdir()
    for path in migration_files(SERVICES / service / "migrations"):
        if path.name == last:
            break
        shutil.copy(path, into / path.name)
    return into


async def _migrate_up_to(pool: asyncpg.Pool, service: str, last: str, into: Path) -> None:
    """Apply ``service``'s migrations before ``last`` (copied into ``into``)."""
    await migrate(pool, service, _copy_before(service, last, into))


async def test_submission_keeps_existing_case_twins_and_refuses_new_ones(
    database_url: str, tmp_path: Path
) -> None:
    async with open_pool(DatabaseSettings(url=database_url), "submission") as pool:
        await _migrate_up_to(
            pool, "submission", "0008_names_unique_regardless_of_case.sql", tmp_path / "before"
        )
        ml = await pool.fetchval("INSERT INTO teams (name) VALUES ('ml') RETURNING id")
        for team in ("vision", "Vision", "VISION"):
            await pool.execute("INSERT INTO teams (name) VALUES ($1)", team)
        for user in ("alice", "Alice", "bob"):
            await pool.execute(
                "INSERT INTO users (team_id, name, role) VALUES ($1, $2, 'member')", ml, user
            )

        applied = await migrate(pool, "submission", SERVICES / "submission" / "migrations")

        assert "service/0008_names_unique_regardless_of_case.sql" in applied
        teams = await pool.fetch("SELECT name, case_twin FROM teams ORDER BY id")
        assert [tuple(r) for r in teams] == [
            ("ml", ""),
            ("vision", ""),
            ("Vision", "Vision"),
            ("VISION", "VISION"),
        ]
        users = await pool.fetch("SELECT name, case_twin FROM users ORDER BY id")
        assert [tuple(r) for r in users] == [("alice", ""), ("Alice", "Alice"), ("bob", "")]
        with pytest.raises(asyncpg.UniqueViolationError, match="teams_name_any_case"):
            await pool.execute("INSERT INTO teams (name) VALUES ('ViSiOn')")
        with pytest.raises(asyncpg.UniqueViolationError, match="users_name_any_case"):
            await pool.execute(
                "INSERT INTO users (team_id, name, role) VALUES ($1, 'ALICE', 'member')", ml
            )
        with pytest.raises(asyncpg.UniqueViolationError, match="users_name_any_case"):
            await pool.execute(
                "INSERT INTO users (team_id, name, role) VALUES ($1, 'Bob', 'member')", ml
            )


async def test_registry_keeps_existing_case_twins_and_refuses_new_ones(
    database_url: str, tmp_path: Path
) -> None:
    async with open_pool(DatabaseSettings(url=database_url), "registry") as pool:
        await _migrate_up_to(
            pool, "registry", "0010_names_unique_regardless_of_case.sql", tmp_path / "before"
        )
        for team, name in (("ml", "resnet"), ("ml", "ResNet"), ("vision", "ResNet")):
            for insert in INSERTS.values():
                await pool.execute(insert, team, name)

        applied = await migrate(pool, "registry", SERVICES / "registry" / "migrations")

        assert "service/0010_names_unique_regardless_of_case.sql" in applied
        for table in INSERTS:
            rows = await pool.fetch(f"SELECT team, name, case_twin FROM {table} ORDER BY id")
            assert [tuple(r) for r in rows] == [
                ("ml", "resnet", ""),
                ("ml", "ResNet", "ResNet"),
                ("vision", "ResNet", ""),
            ]
            with pytest.raises(asyncpg.UniqueViolationError, match=f"{table}_name_any_case"):
                await pool.execute(INSERTS[table], "vision", "resnet")
