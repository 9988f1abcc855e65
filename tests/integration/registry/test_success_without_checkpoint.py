"""A job that succeeds without any checkpoint made no model: the registry registers nothing
and dead-letters nothing (it used to dead-letter every such success)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from tests.integration.registry.conftest import EventLog
from tests.integration.registry.test_registry import envelopes
from trainyard_platform.services.registry.service import NAME
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    Environment,
    JobSpec,
    JobStarted,
    JobSucceeded,
    ModelRegistered,
)
from trainyard_platform.shared.events.trust import RUNNER

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("registry")]

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _spec() -> JobSpec:
    return JobSpec(
        name="no-model",
        team="vision",
        user="alice",
        entrypoint="examples.digits_cnn",
        gpus=1,
        gpu_flavor="cpu",
        seed=1,
        max_runtime_seconds=600,
        register_model=True,
    )


async def test_a_success_without_any_checkpoint_registers_nothing_and_is_no_dead_letter(
    bus: Bus, events: EventLog, pool: asyncpg.Pool
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    started = JobStarted(
        job_id=job,
        allocation_id="alloc-1",
        node_id="node-a",
        epoch=1,
        attempt=0,
        started_at=T0,
        spec=_spec(),
        code_version="none",
        environment=Environment(
            python="CPython 3.11.9",
            torch="2.13.0",
            platform="Linux",
            hostname="h",
            node_id="node-a",
            gpu_flavor="cpu",
            gpu_names=[],
        ),
    )
    success = Envelope.wrap(
        JobSucceeded(
            job_id=job, allocation_id="alloc-1", node_id="node-a", epoch=1, finished_at=T0
        ),
        source=RUNNER,
        subject=job,
    )
    for envelope in envelopes(started, job):
        await bus.publish(envelope)
    await bus.publish(success)

    async def handled() -> bool:
        async with pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM inbox WHERE consumer = $1 AND event_id = $2",
                    NAME,
                    success.id,
                )
            )

    async with asyncio.timeout(20):
        while not await handled():
            await asyncio.sleep(0.05)
    info = await bus.jetstream.consumer_info(bus.settings.stream, NAME)
    assert info.num_ack_pending == 0 and info.num_redelivered == 0
    dead = await bus.jetstream.stream_info(bus.settings.deadletter_stream)
    assert dead.state.messages == 0
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM model_versions WHERE job_id = $1", job) == 0
        )
    assert not [e for e in events.events if isinstance(e.data, ModelRegistered)]
