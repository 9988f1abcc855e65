"""The lineage graph's reads (``lineage``): one query per hop, each on an indexed column."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from trainyard_platform.services.registry.domain import ModelVersion
from trainyard_platform.services.registry.repository import VERSION_COLUMNS


@dataclass(frozen=True)
class JobFacts:
    """What the graph shows of a job: whose, what, and how it went."""

    job_id: str
    team: str
    name: str
    project: str
    status: str
    """``running``, ``succeeded``, ``failed`` or ``cancelled`` (tracking's); ``unknown``
    when the registry saw no start of it."""
    started_at: datetime | None
    ended_at: datetime | None
    resumed_from: list[str]
    """Every checkpoint a restart of the job really resumed from (``job.started``)."""


async def job_facts(conn: asyncpg.Connection, job_id: str) -> JobFacts:
    row = await conn.fetchrow(
        """SELECT team, name, spec->>'project' AS project, status, started_at, ended_at
           FROM tracked_jobs WHERE job_id = $1""",
        job_id,
    )
    resumed = await conn.fetch(
        """SELECT DISTINCT ON (resumed_from) resumed_from FROM runs
           WHERE job_id = $1 AND resumed_from IS NOT NULL
           ORDER BY resumed_from, started_at""",
        job_id,
    )
    if row is None:
        first = await conn.fetchrow(
            """SELECT spec->>'team' AS team, spec->>'name' AS name,
                      spec->>'project' AS project, started_at
               FROM runs WHERE job_id = $1 ORDER BY started_at LIMIT 1""",
            job_id,
        )
        return JobFacts(
            job_id=job_id,
            team=first["team"] if first else "",
            name=first["name"] if first else "",
            project=(first["project"] if first else None) or "default",
            status="unknown",
            started_at=first["started_at"] if first else None,
            ended_at=None,
            resumed_from=[r["resumed_from"] for r in resumed],
        )
    return JobFacts(
        job_id=job_id,
        team=row["team"],
        name=row["name"],
        project=row["project"] or "default",
        status=row["status"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        resumed_from=[r["resumed_from"] for r in resumed],
    )


async def versions_of_job(conn: asyncpg.Connection, job_id: str) -> list[ModelVersion]:
    """Every version registered from ``job_id``'s checkpoints, deleted ones included."""
    rows = await conn.fetch(
        f"SELECT {VERSION_COLUMNS} FROM model_versions v JOIN models m ON m.id = v.model_id "
        "WHERE v.job_id = $1 ORDER BY m.team, m.name, v.version",
        job_id,
    )
    return [ModelVersion.from_row(r) for r in rows]


async def version_by_id(conn: asyncpg.Connection, version_id: str) -> ModelVersion | None:
    row = await conn.fetchrow(
        f"SELECT {VERSION_COLUMNS} FROM model_versions v JOIN models m ON m.id = v.model_id "
        "WHERE v.id = $1",
        uuid.UUID(version_id),
    )
    return None if row is None else ModelVersion.from_row(row)


async def parent_of_job(conn: asyncpg.Connection, job_id: str) -> str | None:
    """The id of the model version ``job_id`` fine-tuned from, if it named one."""
    found = await conn.fetchval(
        "SELECT parent_version_id FROM job_parents WHERE job_id = $1", job_id
    )
    return None if found is None else str(found)


async def children_of_version(conn: asyncpg.Connection, version_id: str) -> list[str]:
    """The jobs that fine-tuned from model version ``version_id``: those the registry saw
    start. A parent is recorded from the job's admission (``job_inputs``), when the registry
    knows nothing else of the job (not even its team); a job still waiting, or cancelled
    before it started, read and made nothing yet, and is no lineage node."""
    rows = await conn.fetch(
        """SELECT p.job_id FROM job_parents p
           WHERE p.parent_version_id = $1
             AND (EXISTS (SELECT 1 FROM tracked_jobs t WHERE t.job_id = p.job_id)
                  OR EXISTS (SELECT 1 FROM runs r WHERE r.job_id = p.job_id))
           ORDER BY p.recorded_at, p.job_id""",
        uuid.UUID(version_id),
    )
    return [r["job_id"] for r in rows]
