"""SQL of the model lifecycle: listing models, aliases and their moves, tombstones.

One function per query, each on a caller's connection (the registry's ``search_path``).
Writes that must not interleave (an alias move, a version's deletion, a registration) are
made with the model's row locked (``repository.lock_model`` or ``lock_existing_model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.registry.domain import RecordedCheckpoint

Row = Mapping[str, Any]


@dataclass(frozen=True)
class ModelRow:
    id: int
    team: str
    name: str
    project: str
    latest_version: int
    versions: int
    created_at: datetime
    aliases: dict[str, int]

    @classmethod
    def from_row(cls, row: Row) -> ModelRow:
        return cls(
            id=int(row["id"]),
            team=row["team"],
            name=row["name"],
            project=row["project"],
            latest_version=int(row["latest_version"]),
            versions=int(row["versions"]),
            created_at=row["created_at"],
            aliases=dict(zip(row["alias_names"], row["alias_versions"], strict=True)),
        )


_MODEL_COLUMNS = """m.id, m.team, m.name, m.project, m.latest_version, m.created_at,
    (SELECT count(*) FROM model_versions v
      WHERE v.model_id = m.id AND v.deleted_at IS NULL) AS versions,
    ARRAY(SELECT a.alias FROM model_aliases a WHERE a.model_id = m.id ORDER BY a.alias)
      AS alias_names,
    ARRAY(SELECT a.version FROM model_aliases a WHERE a.model_id = m.id ORDER BY a.alias)
      AS alias_versions"""


async def list_models(
    conn: asyncpg.Connection,
    team: str | None,
    after: tuple[str, str] | None,
    limit: int,
    project: str | None = None,
    grantee: str | None = None,
) -> list[ModelRow]:
    """Models ordered by (team, name), of ``team`` (None: every team) and ``project`` (None:
    every project), after the cursor; with ``grantee``, only those granted to that team."""
    rows = await conn.fetch(
        f"""SELECT {_MODEL_COLUMNS} FROM models m
            WHERE m.deleted_at IS NULL
              AND ($1::text IS NULL OR m.team = $1)
              AND ($2::text IS NULL OR (m.team, m.name) > ($2, $3))
              AND ($5::text IS NULL OR m.project = $5)
              AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM model_grants g
                                              WHERE g.model_id = m.id AND g.grantee_team = $6))
            ORDER BY m.team, m.name LIMIT $4""",
        team,
        after[0] if after else None,
        after[1] if after else None,
        limit,
        project,
        grantee,
    )
    return [ModelRow.from_row(r) for r in rows]


async def model(conn: asyncpg.Connection, team: str, name: str) -> ModelRow | None:
    row = await conn.fetchrow(
        f"SELECT {_MODEL_COLUMNS} FROM models m "
        "WHERE m.team = $1 AND m.name = $2 AND m.deleted_at IS NULL",
        team,
        name,
    )
    return ModelRow.from_row(row) if row is not None else None


async def model_id(conn: asyncpg.Connection, team: str, name: str) -> int | None:
    found = await conn.fetchval(
        "SELECT id FROM models WHERE team = $1 AND name = $2 AND deleted_at IS NULL", team, name
    )
    return int(found) if found is not None else None


async def lock_existing_model(conn: asyncpg.Connection, team: str, name: str) -> int | None:
    """The model's id with its row locked until the transaction ends; None if there is none."""
    found = await conn.fetchval(
        "SELECT id FROM models WHERE team = $1 AND name = $2 AND deleted_at IS NULL FOR UPDATE",
        team,
        name,
    )
    return int(found) if found is not None else None


# --- jobs and checkpoints, as explicit registration needs them ---------------------------


async def committed_checkpoint(
    conn: asyncpg.Connection, job_id: str, uri: str
) -> RecordedCheckpoint | None:
    row = await conn.fetchrow(
        "SELECT * FROM checkpoints WHERE job_id = $1 AND uri = $2", job_id, uri
    )
    return RecordedCheckpoint.from_row(row) if row is not None else None


async def final_metrics(conn: asyncpg.Connection, job_id: str) -> dict[str, float]:
    """The value each metric of the job reported last (tracking's summaries)."""
    rows = await conn.fetch("SELECT key, last_value FROM metric_series WHERE job_id = $1", job_id)
    return {r["key"]: float(r["last_value"]) for r in rows}


# --- aliases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AliasMove:
    alias: str
    from_version: int | None
    to_version: int | None
    actor: str
    at: datetime
    id: int = 0
    """Its place in the history (moves are listed and paged by it)."""


async def aliases_page(
    conn: asyncpg.Connection, model_id: int, limit: int, after: str = ""
) -> list[tuple[str, int]]:
    """At most ``limit`` (alias, version) of the model named after ``after``, by name."""
    rows = await conn.fetch(
        "SELECT alias, version FROM model_aliases WHERE model_id = $1 AND alias > $3 "
        "ORDER BY alias LIMIT $2",
        model_id,
        limit,
        after,
    )
    return [(r["alias"], int(r["version"])) for r in rows]


async def aliases(conn: asyncpg.Connection, model_id: int) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT alias, version FROM model_aliases WHERE model_id = $1 ORDER BY alias", model_id
    )
    return {r["alias"]: int(r["version"]) for r in rows}


async def aliases_of_version(conn: asyncpg.Connection, model_id: int, version: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT alias FROM model_aliases WHERE model_id = $1 AND version = $2 ORDER BY alias",
        model_id,
        version,
    )
    return [r["alias"] for r in rows]


async def set_alias(
    conn: asyncpg.Connection, model_id: int, alias: str, version: int, actor: str, now: datetime
) -> int | None:
    """Point ``alias`` at ``version`` and record the move; the version it pointed at before
    (None: new). Call with the model's row locked; a move to where it points is no move."""
    before = await conn.fetchval(
        "SELECT version FROM model_aliases WHERE model_id = $1 AND alias = $2", model_id, alias
    )
    if before == version:
        return int(before)
    await conn.execute(
        """INSERT INTO model_aliases (model_id, alias, version, moved_at, moved_by)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (model_id, alias)
           DO UPDATE SET version = $3, moved_at = $4, moved_by = $5""",
        model_id,
        alias,
        version,
        now,
        actor,
    )
    await _record_move(conn, model_id, alias, before, version, actor, now)
    return int(before) if before is not None else None


async def remove_alias(
    conn: asyncpg.Connection, model_id: int, alias: str, actor: str, now: datetime
) -> int | None:
    """Delete ``alias`` and record it; the version it pointed at (None: there was none)."""
    before = await conn.fetchval(
        "DELETE FROM model_aliases WHERE model_id = $1 AND alias = $2 RETURNING version",
        model_id,
        alias,
    )
    if before is None:
        return None
    await _record_move(conn, model_id, alias, int(before), None, actor, now)
    return int(before)


async def _record_move(
    conn: asyncpg.Connection,
    model_id: int,
    alias: str,
    before: int | None,
    after: int | None,
    actor: str,
    now: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO model_alias_moves (model_id, alias, from_version, to_version, actor, at)
           VALUES ($1, $2, $3, $4, $5, $6)""",
        model_id,
        alias,
        before,
        after,
        actor,
        now,
    )


async def alias_moves(
    conn: asyncpg.Connection, model_id: int, alias: str, limit: int, after: int = 0
) -> list[AliasMove]:
    """At most ``limit`` moves of the alias after the move ``after`` (its id), oldest first."""
    rows = await conn.fetch(
        """SELECT id, alias, from_version, to_version, actor, at FROM model_alias_moves
           WHERE model_id = $1 AND alias = $2 AND id > $4 ORDER BY id LIMIT $3""",
        model_id,
        alias,
        limit,
        after,
    )
    return [
        AliasMove(r["alias"], r["from_version"], r["to_version"], r["actor"], r["at"], r["id"])
        for r in rows
    ]


# --- deletion ------------------------------------------------------------------------------


async def mark_deleted(
    conn: asyncpg.Connection, model_id: int, version: int, actor: str, now: datetime
) -> bool:
    """Make the version a tombstone; False when it was one already."""
    done = await conn.fetchval(
        """UPDATE model_versions SET deleted_at = $3, deleted_by = $4
           WHERE model_id = $1 AND version = $2 AND deleted_at IS NULL RETURNING true""",
        model_id,
        version,
        now,
        actor,
    )
    return bool(done)


async def referenced_keys(conn: asyncpg.Connection) -> set[str]:
    """Every object key a live model version owns (the collector keeps them)."""
    rows = await conn.fetch(
        "SELECT artifact_key FROM model_versions WHERE artifact_key IS NOT NULL "
        "AND deleted_at IS NULL"
    )
    return {r["artifact_key"] for r in rows}
