"""The registry's dataset tables (migrations/0007_datasets.sql): datasets, their immutable
versions, grants to other teams, and the access audit of jobs.

Contract:
- ``add_version`` numbers versions per dataset under the dataset's row lock (created on first
  use), so concurrent registrations get successive numbers; a version row is never updated or
  deleted (the table's trigger refuses it). A dataset's name is unique in its team regardless
  of case: a new one differing only by case from another is ``NameTaken`` (409).
- ``readable`` is the one read-permission rule: the owning team, a granted team, or an
  operator (``team`` None) — ``grants.DATASETS``, the rule models share (``grants``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.registry import grants
from trainyard_platform.shared.http_errors import NameTaken


@dataclass(frozen=True)
class DatasetVersion:
    id: str
    team: str
    name: str
    version: int
    uri: str
    sha256: str
    size_bytes: int
    schema: Any
    feature_version: str
    producing_job_id: str | None
    created_at: datetime
    created_by: str

    @property
    def reference(self) -> str:
        return f"{self.team}/{self.name}:{self.version}"

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> DatasetVersion:
        return cls(
            id=str(row["id"]),
            team=row["team"],
            name=row["name"],
            version=row["version"],
            uri=row["uri"],
            sha256=row["sha256"],
            size_bytes=row["size_bytes"],
            schema=json.loads(row["schema"]),
            feature_version=row["feature_version"],
            producing_job_id=row["producing_job_id"],
            created_at=row["created_at"],
            created_by=row["created_by"],
        )


@dataclass(frozen=True)
class Dataset:
    id: int
    team: str
    name: str
    latest_version: int
    created_at: datetime
    grants: list[str]


_VERSION = """SELECT v.*, d.team, d.name FROM dataset_versions v
              JOIN datasets d ON d.id = v.dataset_id"""
_DATASET = """SELECT d.*, COALESCE(ARRAY(SELECT g.grantee_team FROM dataset_grants g
                                       WHERE g.dataset_id = d.id ORDER BY g.grantee_team),
                                 '{}') AS grants
              FROM datasets d"""


async def _refuse_case_twin(conn: asyncpg.Connection, team: str, name: str) -> None:
    """``NameTaken`` when ``team`` has no dataset spelled ``name`` but one whose name differs
    from it only by case."""
    found: str | None = await conn.fetchval(
        "SELECT name FROM datasets WHERE team = $1 AND lower(name) = lower($2) "
        "ORDER BY name = $2 DESC, id LIMIT 1",
        team,
        name,
    )
    if found is not None and found != name:
        raise NameTaken("name", "dataset", found, f"team {team}")


async def add_version(
    conn: asyncpg.Connection,
    team: str,
    name: str,
    *,
    uri: str,
    sha256: str,
    size_bytes: int,
    schema: Any,
    feature_version: str,
    producing_job_id: str | None,
    actor: str,
    now: datetime,
) -> DatasetVersion:
    """A new version (the next number) of ``team/name``, creating the dataset on first use.
    Call inside a transaction. ``NameTaken`` (field ``name``) when the team has a dataset
    whose name differs from ``name`` only by case and none spelled so (the unique index on
    ``(team, lower(name))`` holds this against a concurrent create too)."""
    await _refuse_case_twin(conn, team, name)
    try:
        async with conn.transaction():  # a savepoint: the clash below is answered, not fatal
            row = await conn.fetchrow(
                """INSERT INTO datasets (team, name, latest_version, created_at, created_by)
                   VALUES ($1, $2, 1, $3, $4)
                   ON CONFLICT (team, name)
                   DO UPDATE SET latest_version = datasets.latest_version + 1
                   RETURNING id, latest_version""",
                team,
                name,
                now,
                actor,
            )
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != "datasets_name_any_case":
            raise
        await _refuse_case_twin(conn, team, name)  # a concurrent create of a case twin won
        raise
    assert row is not None
    version_id = uuid.uuid4()
    await conn.execute(
        """INSERT INTO dataset_versions (id, dataset_id, version, uri, sha256, size_bytes,
                                         schema, feature_version, producing_job_id,
                                         created_at, created_by)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)""",
        version_id,
        row["id"],
        row["latest_version"],
        uri,
        sha256,
        size_bytes,
        json.dumps(schema),
        feature_version,
        producing_job_id,
        now,
        actor,
    )
    found = await version(conn, team, name, row["latest_version"])
    assert found is not None
    return found


async def version(
    conn: asyncpg.Connection, team: str, name: str, number: int | None
) -> DatasetVersion | None:
    """Version ``number`` of ``team/name`` (None: the latest)."""
    if number is None:
        row = await conn.fetchrow(
            f"{_VERSION} WHERE d.team = $1 AND d.name = $2 AND v.version = d.latest_version",
            team,
            name,
        )
    else:
        row = await conn.fetchrow(
            f"{_VERSION} WHERE d.team = $1 AND d.name = $2 AND v.version = $3",
            team,
            name,
            number,
        )
    return None if row is None else DatasetVersion.from_row(row)


async def version_by_id(conn: asyncpg.Connection, version_id: str) -> DatasetVersion | None:
    row = await conn.fetchrow(f"{_VERSION} WHERE v.id = $1", uuid.UUID(version_id))
    return None if row is None else DatasetVersion.from_row(row)


async def versions(
    conn: asyncpg.Connection, team: str, name: str, limit: int, after: int = 0
) -> list[DatasetVersion]:
    """At most ``limit`` versions of the dataset numbered above ``after``, oldest first."""
    rows = await conn.fetch(
        f"{_VERSION} WHERE d.team = $1 AND d.name = $2 AND v.version > $4 "
        "ORDER BY v.version LIMIT $3",
        team,
        name,
        limit,
        after,
    )
    return [DatasetVersion.from_row(r) for r in rows]


async def produced_by(conn: asyncpg.Connection, job_id: str) -> list[DatasetVersion]:
    rows = await conn.fetch(
        f"{_VERSION} WHERE v.producing_job_id = $1 ORDER BY d.team, d.name, v.version", job_id
    )
    return [DatasetVersion.from_row(r) for r in rows]


def _dataset(row: asyncpg.Record) -> Dataset:
    return Dataset(
        id=row["id"],
        team=row["team"],
        name=row["name"],
        latest_version=row["latest_version"],
        created_at=row["created_at"],
        grants=list(row["grants"]),
    )


async def dataset(conn: asyncpg.Connection, team: str, name: str) -> Dataset | None:
    row = await conn.fetchrow(f"{_DATASET} WHERE d.team = $1 AND d.name = $2", team, name)
    return None if row is None else _dataset(row)


async def readable_datasets(
    conn: asyncpg.Connection, team: str | None, limit: int, after: tuple[str, str] | None = None
) -> list[Dataset]:
    """Datasets ``team`` may read (its own and those granted to it; None: every one), by
    team and name, the first ``limit`` after ``after`` (``(team, name)``)."""
    rows = await conn.fetch(
        f"""{_DATASET}
            WHERE ($1::text IS NULL OR d.team = $1
                   OR EXISTS (SELECT 1 FROM dataset_grants g
                              WHERE g.dataset_id = d.id AND g.grantee_team = $1))
              AND ($3::text IS NULL OR (d.team, d.name) > ($3, $4::text))
            ORDER BY d.team, d.name LIMIT $2""",
        team,
        limit,
        None if after is None else after[0],
        None if after is None else after[1],
    )
    return [_dataset(r) for r in rows]


async def readable(conn: asyncpg.Connection, reader: str | None, team: str, name: str) -> bool:
    """Whether ``reader`` (a team; None: an operator) may read ``team/name``."""
    return await grants.DATASETS.readable(conn, reader, team, name)


async def grant(
    conn: asyncpg.Connection, dataset_id: int, grantee: str, actor: str, now: datetime
) -> bool:
    """Grant ``grantee`` read access; False when it had it already."""
    return await grants.DATASETS.grant(conn, dataset_id, grantee, actor, now)


async def revoke(conn: asyncpg.Connection, dataset_id: int, grantee: str) -> bool:
    """Take ``grantee``'s read access away; False when it had none."""
    return await grants.DATASETS.revoke(conn, dataset_id, grantee)


async def record_access(
    conn: asyncpg.Connection,
    job_id: str,
    version: DatasetVersion,
    team: str,
    allocation_id: str,
    now: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO dataset_access (job_id, dataset_version_id, team, allocation_id,
                                       recorded_at)
           VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING""",
        job_id,
        uuid.UUID(version.id),
        team,
        allocation_id,
        now,
    )


async def accessed_by(conn: asyncpg.Connection, job_id: str) -> list[DatasetVersion]:
    """Every dataset version ``job_id`` was given (the access audit)."""
    rows = await conn.fetch(
        f"""{_VERSION} JOIN dataset_access a ON a.dataset_version_id = v.id
            WHERE a.job_id = $1 ORDER BY d.team, d.name, v.version""",
        job_id,
    )
    return [DatasetVersion.from_row(r) for r in rows]


async def readers_of(conn: asyncpg.Connection, version_id: str) -> list[str]:
    """The jobs given dataset version ``version_id``, in the order they were."""
    rows = await conn.fetch(
        """SELECT job_id FROM dataset_access WHERE dataset_version_id = $1
           ORDER BY recorded_at, job_id""",
        uuid.UUID(version_id),
    )
    return [r["job_id"] for r in rows]
