"""Outcomes, records and reproduction verdicts in the registry's database.

Contract (``handlers`` calls ``on_ended`` in the transaction of the event that ended a job):
- Every job's end is recorded once in ``job_outcomes`` (status, final metrics, final
  committed checkpoint: the one ``job.succeeded`` reported, else the newest recorded); a
  redelivery changes nothing. A success replaces a failure, once: the scheduler's late
  success of an attempt on a node it had declared lost (docs/events.md), the only move
  out of an end; a reproduction's verdict is then decided again.
- When the job that ended is a reproduction (its final run's spec names ``reproduces``), its
  verdict is decided (``reproduction.compare``) and stored once in ``reproductions``, in
  the same transaction. A reproduction of another team's job is not compared (logged):
  submission never makes one, and the registry does not compare across teams.
- Nothing here raises for a job the registry knows nothing about (never started here): its
  outcome is still recorded; without a run there is no spec to say it is a reproduction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.registry import domain
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry import tracking_repository as tracking
from trainyard_platform.services.registry.reproduction import (
    DatasetInput,
    Decision,
    Outcome,
    ParentInput,
    Record,
    Status,
    compare,
)
from trainyard_platform.shared.events.payloads import CheckpointRef

log = logging.getLogger(__name__)


def stored_metrics(metrics: Mapping[str, float]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for key, value in metrics.items():
        if math.isfinite(value):
            out[key] = value
        else:
            out[key] = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return out


def _read_metrics(stored: Mapping[str, Any]) -> dict[str, float]:
    return {key: float(value) for key, value in stored.items()}


async def record(conn: asyncpg.Connection, job_id: str) -> Record | None:
    """The job's record, from its final (latest started) run; None when it never started."""
    runs = await repo.runs_of_job(conn, job_id)
    if not runs:
        return None
    final = max(runs, key=lambda r: (r.started_at, r.attempt))
    rows = await conn.fetch(
        """SELECT d.team, d.name, v.version, v.uri, v.sha256, v.size_bytes, v.feature_version
           FROM dataset_access a
           JOIN dataset_versions v ON v.id = a.dataset_version_id
           JOIN datasets d ON d.id = v.dataset_id
           WHERE a.job_id = $1 ORDER BY d.team, d.name, v.version""",
        job_id,
    )
    datasets = [
        DatasetInput(
            reference=f"{r['team']}/{r['name']}:{r['version']}",
            uri=r["uri"],
            sha256=r["sha256"],
            size_bytes=r["size_bytes"],
            feature_version=r["feature_version"],
        )
        for r in rows
    ]
    parent = await conn.fetchrow(
        """SELECT m.team, m.name, v.version, v.artifact_sha256
           FROM job_parents p
           JOIN model_versions v ON v.id = p.parent_version_id
           JOIN models m ON m.id = v.model_id
           WHERE p.job_id = $1""",
        job_id,
    )
    return Record(
        job_id=job_id,
        spec=final.spec,
        code_version=final.code_version,
        environment=final.environment,
        datasets=datasets,
        parent=None
        if parent is None
        else ParentInput(
            reference=f"{parent['team']}/{parent['name']}:{parent['version']}",
            sha256=parent["artifact_sha256"],
        ),
    )


async def outcome(conn: asyncpg.Connection, job_id: str) -> Outcome | None:
    """How the job ended, as recorded; None when its end is not recorded."""
    row = await conn.fetchrow("SELECT * FROM job_outcomes WHERE job_id = $1", job_id)
    if row is None:
        return None
    return Outcome(
        status=row["status"],
        metrics=_read_metrics(row["metrics"]),
        checkpoint_uri=row["checkpoint_uri"],
        checkpoint_sha256=row["checkpoint_sha256"],
    )


async def _final_checkpoint(
    conn: asyncpg.Connection, job_id: str, reported: CheckpointRef | None
) -> CheckpointRef | None:
    if reported is not None:
        return reported
    newest = domain.latest_checkpoint(await repo.checkpoints_of_job(conn, job_id))
    return None if newest is None else newest.ref


async def on_ended(
    conn: asyncpg.Connection,
    job_id: str,
    status: Status,
    ended_at: datetime,
    now: datetime,
    *,
    metrics: Mapping[str, float] | None = None,
    artifact: CheckpointRef | None = None,
) -> None:
    """Record the job's outcome and, for a reproduction, its verdict (module docstring)."""
    checkpoint = await _final_checkpoint(conn, job_id, artifact) if status == "succeeded" else None
    inserted = await conn.fetchval(
        """INSERT INTO job_outcomes (job_id, status, metrics, checkpoint_uri, checkpoint_sha256,
                                     ended_at)
           VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (job_id) DO UPDATE
           SET status = EXCLUDED.status, metrics = EXCLUDED.metrics,
               checkpoint_uri = EXCLUDED.checkpoint_uri,
               checkpoint_sha256 = EXCLUDED.checkpoint_sha256, ended_at = EXCLUDED.ended_at
           WHERE job_outcomes.status = 'failed' AND EXCLUDED.status = 'succeeded'
           RETURNING true""",
        job_id,
        status,
        stored_metrics(metrics or {}),
        None if checkpoint is None else checkpoint.uri,
        None if checkpoint is None else checkpoint.sha256,
        ended_at,
    )
    if not inserted:
        log.info("job %s: its end is recorded already", job_id)
        return
    mine = await record(conn, job_id)
    if mine is None or mine.spec.reproduces is None:
        return
    original_id = mine.spec.reproduces
    original = await record(conn, original_id)
    if original is not None and original.spec.team != mine.spec.team:
        log.warning(
            "job %s of team %s names job %s of team %s as its original; not compared",
            job_id,
            mine.spec.team,
            original_id,
            original.spec.team,
        )
        return
    original_outcome = await outcome(conn, original_id) or await _tracked_outcome(conn, original_id)
    mine_outcome = await outcome(conn, job_id)
    assert mine_outcome is not None  # inserted above
    decision = compare(original, original_outcome, mine, mine_outcome)
    await _store(conn, job_id, original_id, mine.spec.team, decision, now)
    log.info(
        "reproduction %s of job %s: %s%s",
        job_id,
        original_id,
        decision.verdict,
        "".join(f"; {d.field} differs" for d in decision.differences),
    )


async def _tracked_outcome(conn: asyncpg.Connection, job_id: str) -> Outcome | None:
    """The outcome of a job that ended before outcomes were recorded: its tracked status,
    the last value of each metric, its newest committed checkpoint."""
    row = await conn.fetchrow(
        "SELECT status FROM tracked_jobs WHERE job_id = $1 AND status <> 'running'", job_id
    )
    if row is None:
        return None
    metrics = {
        r["key"]: float(r["last_value"]) for r in await tracking.final_metrics(conn, [job_id])
    }
    checkpoint = (
        await _final_checkpoint(conn, job_id, None) if row["status"] == "succeeded" else None
    )
    return Outcome(
        status=row["status"],
        metrics=metrics,
        checkpoint_uri=None if checkpoint is None else checkpoint.uri,
        checkpoint_sha256=None if checkpoint is None else checkpoint.sha256,
    )


async def _store(
    conn: asyncpg.Connection,
    job_id: str,
    original_id: str,
    team: str,
    decision: Decision,
    now: datetime,
) -> None:
    await conn.execute(
        """INSERT INTO reproductions (job_id, original_job_id, team, verdict, differences,
                                      metrics, weights, relative_tolerance, decided_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT (job_id) DO UPDATE
           SET verdict = EXCLUDED.verdict, differences = EXCLUDED.differences,
               metrics = EXCLUDED.metrics, weights = EXCLUDED.weights,
               relative_tolerance = EXCLUDED.relative_tolerance,
               decided_at = EXCLUDED.decided_at""",
        job_id,
        original_id,
        team,
        decision.verdict,
        [d.as_json() for d in decision.differences],
        decision.metrics,
        decision.weights,
        decision.relative_tolerance,
        now,
    )


async def verdict(conn: asyncpg.Connection, job_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        "SELECT * FROM reproductions WHERE job_id = $1", job_id
    )
    return row


async def reproductions_of(conn: asyncpg.Connection, original_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(  # type: ignore[no-any-return]
        "SELECT job_id, verdict, decided_at FROM reproductions WHERE original_job_id = $1 "
        "ORDER BY decided_at, job_id",
        original_id,
    )
