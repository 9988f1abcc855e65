"""The registry's SQL: one function per query, each taking a connection. Tables are
unqualified: the pool's ``search_path`` is the ``registry`` schema."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.registry.domain import ModelVersion, RecordedCheckpoint, Run
from trainyard_platform.shared.events.payloads import AllocationGranted, CheckpointSaved, dump
from trainyard_platform.shared.http_errors import NameTaken

Row = Mapping[str, Any]


def _json_metrics(metrics: Mapping[str, float]) -> dict[str, float | str]:
    # jsonb has no NaN or infinity; they are kept as the strings float() reads back.
    return {k: v if math.isfinite(v) else str(v) for k, v in metrics.items()}


# --- runs and checkpoints --------------------------------------------------------------


async def insert_run(conn: asyncpg.Connection, run: Run, now: datetime) -> bool:
    """Record a started run; False when it was recorded already."""
    inserted = await conn.fetchval(
        """INSERT INTO runs (allocation_id, job_id, attempt, epoch, node_id, started_at, spec,
                             code_version, environment, resumed_from, recorded_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
           ON CONFLICT (allocation_id) DO NOTHING RETURNING true""",
        run.allocation_id,
        run.job_id,
        run.attempt,
        run.epoch,
        run.node_id,
        run.started_at,
        dump(run.spec),
        run.code_version,
        dump(run.environment),
        run.resumed_from,
        now,
    )
    return bool(inserted)


async def insert_grant(
    conn: asyncpg.Connection, grant: AllocationGranted, spec_sha256: str, now: datetime
) -> None:
    """Remember the scheduler's grant (once per allocation)."""
    await conn.execute(
        """INSERT INTO granted_allocations (allocation_id, job_id, node_id, attempt, epoch,
                                            spec_sha256, recorded_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (allocation_id) DO NOTHING""",
        grant.allocation_id,
        grant.job_id,
        grant.node_id,
        grant.attempt,
        grant.epoch,
        spec_sha256,
        now,
    )


async def grant_of(conn: asyncpg.Connection, allocation_id: str) -> asyncpg.Record | None:
    """The scheduler's grant of ``allocation_id`` as remembered, or None."""
    return await conn.fetchrow(
        "SELECT * FROM granted_allocations WHERE allocation_id = $1", allocation_id
    )


async def run_identity(conn: asyncpg.Connection, allocation_id: str) -> tuple[str, int, str] | None:
    """``(job id, epoch, node id)`` of the run of ``allocation_id``, or None when none is
    recorded."""
    row = await conn.fetchrow(
        "SELECT job_id, epoch, node_id FROM runs WHERE allocation_id = $1", allocation_id
    )
    return None if row is None else (row["job_id"], row["epoch"], row["node_id"])


async def runs_of_job(conn: asyncpg.Connection, job_id: str) -> list[Run]:
    rows = await conn.fetch(
        "SELECT * FROM runs WHERE job_id = $1 ORDER BY started_at, attempt", job_id
    )
    return [Run.from_row(r) for r in rows]


async def insert_checkpoint(conn: asyncpg.Connection, saved: CheckpointSaved) -> bool:
    """Record a checkpoint; False when this object was recorded for the job already."""
    ref = saved.checkpoint
    inserted = await conn.fetchval(
        """INSERT INTO checkpoints (job_id, uri, allocation_id, epoch, step, manifest_uri,
                                    size_bytes, sha256, saved_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT (job_id, uri) DO NOTHING RETURNING true""",
        saved.job_id,
        ref.uri,
        saved.allocation_id,
        saved.epoch,
        ref.step,
        ref.manifest_uri,
        ref.size_bytes,
        ref.sha256,
        saved.saved_at,
    )
    return bool(inserted)


async def checkpoints_of_job(conn: asyncpg.Connection, job_id: str) -> list[RecordedCheckpoint]:
    rows = await conn.fetch(
        "SELECT * FROM checkpoints WHERE job_id = $1 ORDER BY step, saved_at", job_id
    )
    return [RecordedCheckpoint.from_row(r) for r in rows]


# --- models and versions ----------------------------------------------------------------

_VERSION_COLUMNS = """v.id, m.team, m.name, v.version, v.job_id, v.allocation_id,
    v.artifact_uri, v.artifact_manifest_uri, v.artifact_step, v.artifact_size_bytes,
    v.artifact_sha256, v.metrics, v.lineage, v.registered_at, v.origin, v.source_uri,
    v.artifact_key, v.tags, v.description, v.created_by, v.deleted_at,
    m.deleted_at AS model_deleted_at"""
VERSION_COLUMNS = _VERSION_COLUMNS
"""The columns ``ModelVersion.from_row`` reads (``model_versions v`` joined to ``models m``)."""


async def version_of_job(conn: asyncpg.Connection, job_id: str) -> ModelVersion | None:
    """The version a job's success registered, if it did (explicit ones do not count)."""
    row = await conn.fetchrow(
        f"SELECT {_VERSION_COLUMNS} FROM model_versions v JOIN models m ON m.id = v.model_id "
        "WHERE v.job_id = $1 AND v.origin = 'job_success'",
        job_id,
    )
    return ModelVersion.from_row(row) if row is not None else None


async def lock_model(
    conn: asyncpg.Connection, team: str, name: str, now: datetime, project: str = "default"
) -> tuple[int, int]:
    """``(model id, latest version)``, creating the model (in ``project``) if needed, with its
    row locked until the transaction ends (so concurrent registrations number versions in
    turn, and alias moves and deletions of its versions take turns with them).
    ``NameTaken`` (field ``name``) when the team has a model whose name differs from
    ``name`` only by case and none spelled so (the unique index on ``(team, lower(name))``
    holds this against a concurrent create too)."""
    await conn.execute(
        "INSERT INTO models (team, name, created_at, project) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT DO NOTHING",
        team,
        name,
        now,
        project,
    )
    row = await conn.fetchrow(
        "SELECT id, name, latest_version FROM models WHERE team = $1 AND lower(name) = lower($2) "
        "AND deleted_at IS NULL ORDER BY name = $2 DESC, id LIMIT 1 FOR UPDATE",
        team,
        name,
    )
    assert row is not None  # inserted above, or a model not deleted is there already
    if row["name"] != name:
        raise NameTaken("name", "model", row["name"], f"team {team}")
    return int(row["id"]), int(row["latest_version"])


async def model_spelling(conn: asyncpg.Connection, team: str, name: str) -> str | None:
    """How ``team``'s model named ``name`` regardless of case is spelled: ``name`` when a
    model is spelled so, else the oldest whose name differs only by case; None when none."""
    found: str | None = await conn.fetchval(
        "SELECT name FROM models WHERE team = $1 AND lower(name) = lower($2) "
        "AND deleted_at IS NULL ORDER BY name = $2 DESC, id LIMIT 1",
        team,
        name,
    )
    return found


async def insert_version(conn: asyncpg.Connection, model_id: int, version: ModelVersion) -> None:
    """Store ``version`` and make it the model's latest (same transaction as ``lock_model``)."""
    artifact = version.artifact
    await conn.execute(
        """INSERT INTO model_versions (id, model_id, version, job_id, allocation_id,
               artifact_uri, artifact_manifest_uri, artifact_step, artifact_size_bytes,
               artifact_sha256, metrics, lineage, code_version, dataset, registered_at,
               origin, source_uri, artifact_key, tags, description, created_by)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                   $16, $17, $18, $19, $20, $21)""",
        version.id,
        model_id,
        version.version,
        version.job_id,
        version.allocation_id,
        artifact.uri,
        artifact.manifest_uri,
        artifact.step,
        artifact.size_bytes,
        artifact.sha256,
        _json_metrics(version.metrics),
        dump(version.lineage),
        version.lineage.code_version,
        version.lineage.dataset,
        version.registered_at,
        version.origin,
        version.source_uri,
        version.artifact_key,
        list(version.tags),
        version.description,
        version.created_by,
    )
    await conn.execute(
        "UPDATE models SET latest_version = $2 WHERE id = $1", model_id, version.version
    )


async def versions_of_model(
    conn: asyncpg.Connection, model_id: int, limit: int, after: int = 0
) -> list[ModelVersion]:
    """At most ``limit`` of model ``model_id``'s versions that are not deleted, numbered
    above ``after``, oldest first (by the model's id: its name may name another model by
    the next page)."""
    rows = await conn.fetch(
        f"SELECT {_VERSION_COLUMNS} FROM model_versions v JOIN models m ON m.id = v.model_id "
        "WHERE v.model_id = $1 AND v.deleted_at IS NULL AND v.version > $3 "
        "ORDER BY v.version LIMIT $2",
        model_id,
        limit,
        after,
    )
    return [ModelVersion.from_row(r) for r in rows]


async def version_by_id(conn: asyncpg.Connection, version_id: str) -> ModelVersion | None:
    """The version of id ``version_id``, deleted or of a deleted model too (``deleted_at``
    and ``model_deleted_at`` say so)."""
    row = await conn.fetchrow(
        f"SELECT {_VERSION_COLUMNS} FROM model_versions v JOIN models m ON m.id = v.model_id "
        "WHERE v.id = $1",
        uuid.UUID(version_id),
    )
    return ModelVersion.from_row(row) if row is not None else None


async def model_version(
    conn: asyncpg.Connection, team: str, name: str, version: int
) -> ModelVersion | None:
    """One version, deleted ones included (``deleted_at`` says so)."""
    row = await conn.fetchrow(
        f"SELECT {_VERSION_COLUMNS} FROM model_versions v JOIN models m ON m.id = v.model_id "
        "WHERE m.team = $1 AND m.name = $2 AND m.deleted_at IS NULL AND v.version = $3",
        team,
        name,
        version,
    )
    return ModelVersion.from_row(row) if row is not None else None
