"""Reproducibility over HTTP (docs/reproducibility.md).

- ``GET /v1/jobs/{job_id}/record``: the job's reproducibility record (``reproduction.Record``:
  code, data, spec, hyper-parameters, seed, environment, hardware) and its outcome (status,
  final metrics, final committed checkpoint), with the reproductions made of it.
- ``GET /v1/jobs/{job_id}/reproduction``: the verdict on a reproduction (``identical``,
  ``within_tolerance`` or ``different``, and every difference named); ``verdict`` is null
  while the reproduction has not ended.

Both answer 404 for a job the registry has no run of (it never started), one that is not a
reproduction (``/reproduction``), or one of another team (operators see every team's).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import asyncpg
from litestar import get
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
from pydantic import BaseModel

from trainyard_platform.services.registry import reproduction_repository as store
from trainyard_platform.shared.http_app import error_responses
from trainyard_platform.shared.identity import Principal

Caller = NamedDependency[Principal]


class ReproductionSummary(BaseModel):
    job_id: str
    verdict: Literal["identical", "within_tolerance", "different"]
    decided_at: datetime


class JobRecord(BaseModel):
    """A job's reproducibility record and how it ended."""

    job_id: str
    record: dict[str, Any]
    """Code, data, spec, hyper-parameters, seed, environment and hardware (docs)."""
    outcome: dict[str, Any] | None
    """``status``, ``metrics`` (final), ``checkpoint_uri``, ``checkpoint_sha256``; null while
    the job runs."""
    reproductions: list[ReproductionSummary]
    """The decided reproductions of this job, oldest first."""


class Difference(BaseModel):
    field: str
    original: Any
    reproduction: Any


class ReproductionVerdict(BaseModel):
    """The verdict on one reproduction of a job."""

    job_id: str
    original_job_id: str
    verdict: Literal["identical", "within_tolerance", "different"] | None
    """Null while the reproduction has not ended."""
    differences: list[Difference]
    """Everything that differs, each field named (record fields, ``status``, ``metrics.<key>``,
    ``weights``); empty for ``identical`` and ``within_tolerance``."""
    metrics: dict[str, dict[str, Any]]
    """Per final metric: ``original``, ``reproduction``, ``relative_difference``."""
    weights: dict[str, Any]
    """``original_sha256``, ``reproduction_sha256`` (final committed checkpoints),
    ``compared``, ``equal``, ``deterministic``."""
    relative_tolerance: float | None
    decided_at: datetime | None


def reproduction_routes(pool: asyncpg.Pool) -> list[HTTPRouteHandler]:
    """The routes of the module docstring over the registry's pool."""

    @get(
        "/v1/jobs/{job_id:str}/record",
        summary="A job's reproducibility record and outcome",
        responses=error_responses(404),
    )
    async def job_record(job_id: FromPath[str], principal: Caller) -> JobRecord:
        async with pool.acquire() as conn:
            found = await store.record(conn, job_id)
            if found is None or not principal.may_see_team(found.spec.team):
                raise NotFoundException(f"no record of job {job_id!r}")
            ended = await store.outcome(conn, job_id)
            made = await store.reproductions_of(conn, job_id)
        return JobRecord(
            job_id=job_id,
            record=found.as_json(),
            outcome=None
            if ended is None
            else {
                "status": ended.status,
                "metrics": store.stored_metrics(ended.metrics),
                "checkpoint_uri": ended.checkpoint_uri,
                "checkpoint_sha256": ended.checkpoint_sha256,
            },
            reproductions=[
                ReproductionSummary(
                    job_id=r["job_id"], verdict=r["verdict"], decided_at=r["decided_at"]
                )
                for r in made
            ],
        )

    @get(
        "/v1/jobs/{job_id:str}/reproduction",
        summary="The verdict on a reproduction of a job",
        responses=error_responses(404),
    )
    async def job_reproduction(job_id: FromPath[str], principal: Caller) -> ReproductionVerdict:
        missing = NotFoundException(f"job {job_id!r} is not a reproduction the registry knows")
        async with pool.acquire() as conn:
            found = await store.record(conn, job_id)
            if (
                found is None
                or found.spec.reproduces is None
                or not principal.may_see_team(found.spec.team)
            ):
                raise missing
            row = await store.verdict(conn, job_id)
        if row is None:
            return ReproductionVerdict(
                job_id=job_id,
                original_job_id=found.spec.reproduces,
                verdict=None,
                differences=[],
                metrics={},
                weights={},
                relative_tolerance=None,
                decided_at=None,
            )
        return ReproductionVerdict(
            job_id=job_id,
            original_job_id=row["original_job_id"],
            verdict=row["verdict"],
            differences=[Difference(**d) for d in row["differences"]],
            metrics=row["metrics"],
            weights=row["weights"],
            relative_tolerance=row["relative_tolerance"],
            decided_at=row["decided_at"],
        )

    return [job_record, job_reproduction]


__all__: Sequence[str] = ["reproduction_routes"]
