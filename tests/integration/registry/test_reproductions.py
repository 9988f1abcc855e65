"""Reproduction verdicts from real events (NATS, PostgreSQL): decided once when the
reproduction ends, naming what differs; a failed reproduction is different by its status; a
reproduction claiming another team's job is not compared."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from tests.integration.registry.test_registry import envelopes, grant_of
from trainyard_platform.services.registry.service import NAME
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    CheckpointRef,
    Environment,
    JobFailed,
    JobSpec,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import RUNNER, SCHEDULER

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("registry")]

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CHECKPOINT = CheckpointRef(
    uri="s3://b/jobs/x/checkpoints/step-1/checkpoint.pt",
    manifest_uri="s3://b/jobs/x/checkpoints/step-1/manifest.json",
    step=1,
    size_bytes=10,
    sha256="c" * 64,
)


def spec(team: str = "vision", reproduces: str | None = None) -> JobSpec:
    return JobSpec(
        name="digits",
        team=team,
        user="alice",
        entrypoint="train.py",
        gpus=1,
        gpu_flavor="cpu",
        seed=1,
        max_runtime_seconds=600,
        hyperparameters={"lr": 0.1},
        reproduces=reproduces,
    )


def started(job: str, the_spec: JobSpec) -> JobStarted:
    return JobStarted(
        job_id=job,
        allocation_id=f"alloc-{job}",
        node_id="node-a",
        epoch=1,
        attempt=0,
        started_at=T0,
        spec=the_spec,
        code_version="src:sha256:" + "a" * 64,
        environment=Environment(
            python="CPython 3.11.9",
            torch="2.4.0",
            platform="Linux",
            hostname="h",
            node_id="node-a",
            gpu_flavor="cpu",
            gpu_names=["virtual-cpu-0"],
            packages=["torch==2.4.0"],
        ),
    )


async def publish(
    bus: Bus, payload: JobStarted | JobSucceeded | JobFailed, source: str = RUNNER
) -> str:
    if isinstance(payload, JobStarted):  # the registry believes a start only as granted
        await bus.publish(envelopes(grant_of(payload))[0])
    envelope: Envelope[Payload] = Envelope.wrap(payload, source=source, subject=payload.job_id)
    await bus.publish(envelope)
    return envelope.id


async def handled(pool: asyncpg.Pool, event_id: str) -> None:
    async with asyncio.timeout(20):
        while True:
            async with pool.acquire() as conn:
                if await conn.fetchval(
                    "SELECT count(*) FROM inbox WHERE consumer = $1 AND event_id = $2",
                    NAME,
                    event_id,
                ):
                    return
            await asyncio.sleep(0.05)


def failed(job: str) -> JobFailed:
    return JobFailed(
        job_id=job,
        allocation_id=f"alloc-{job}",
        node_id="node-a",
        epoch=1,
        finished_at=T0,
        exit_code=1,
        reason="exit 1",
    )


async def test_a_failed_reproduction_is_different_by_its_status_once(
    bus: Bus, pool: asyncpg.Pool
) -> None:
    original, repro = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(original, spec()))
    await publish(
        bus,
        JobSucceeded(
            job_id=original,
            allocation_id=f"alloc-{original}",
            node_id="node-a",
            epoch=1,
            finished_at=T0,
            metrics={"loss": 0.5},
            artifact=CHECKPOINT,
        ),
    )
    await publish(bus, started(repro, spec(reproduces=original)))
    await handled(pool, await publish(bus, failed(repro), source=SCHEDULER))
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM reproductions WHERE job_id = $1", repro)
        assert row is not None
        assert row["original_job_id"] == original and row["verdict"] == "different"
        fields = [d["field"] for d in row["differences"]]
        assert fields == ["status", "metrics.loss", "weights"]
        outcome = await conn.fetchrow("SELECT * FROM job_outcomes WHERE job_id = $1", original)
        assert outcome["checkpoint_sha256"] == "c" * 64 and outcome["metrics"] == {"loss": 0.5}
    # The end again (another event id): nothing changes.
    await handled(pool, await publish(bus, failed(repro), source=SCHEDULER))
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM reproductions WHERE job_id = $1", repro) == 1
        )
        assert (
            await conn.fetchval("SELECT count(*) FROM job_outcomes WHERE job_id = $1", repro) == 1
        )


def succeeded(job: str) -> JobSucceeded:
    return JobSucceeded(
        job_id=job,
        allocation_id=f"alloc-{job}",
        node_id="node-a",
        epoch=1,
        finished_at=T0,
        metrics={"loss": 0.5},
        artifact=CHECKPOINT,
    )


async def test_a_late_success_after_the_failure_its_lost_node_caused_is_the_end(
    bus: Bus, pool: asyncpg.Pool
) -> None:
    """A reproduction's node was declared lost and it used up its restarts: the scheduler
    said it failed. Its runner then reported success after all, and the scheduler said the
    success (``kept-success``, docs/events.md): the only move out of a terminal state.
    Before, the registry kept the first end: the run was tracked ``failed`` and the verdict
    said ``different`` by its status. Now the success replaces the failure in the outcome,
    the tracked run and the verdict; a failure said again after it changes nothing."""
    original, repro = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(original, spec()))
    await publish(bus, succeeded(original))
    await publish(bus, started(repro, spec(reproduces=original)))
    await publish(bus, failed(repro), source=SCHEDULER)
    await publish(bus, succeeded(repro), source=SCHEDULER)
    await handled(pool, await publish(bus, failed(repro), source=SCHEDULER))
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM reproductions WHERE job_id = $1", repro)
        ended = await conn.fetchval("SELECT status FROM job_outcomes WHERE job_id = $1", repro)
        tracked = await conn.fetchval("SELECT status FROM tracked_jobs WHERE job_id = $1", repro)
    assert row is not None
    assert (row["verdict"], row["differences"]) == ("identical", [])
    assert (ended, tracked) == ("succeeded", "succeeded")


async def test_a_reproduction_of_another_teams_job_is_not_compared(
    bus: Bus, pool: asyncpg.Pool
) -> None:
    original, repro = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    await publish(bus, started(original, spec(team="ml")))
    await handled(pool, await publish(bus, failed(original), source=SCHEDULER))
    await publish(bus, started(repro, spec(team="vision", reproduces=original)))
    await handled(pool, await publish(bus, failed(repro), source=SCHEDULER))
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM reproductions WHERE job_id = $1", repro) == 0
        )
        assert await conn.fetchval("SELECT status FROM job_outcomes WHERE job_id = $1", repro) == (
            "failed"
        )
