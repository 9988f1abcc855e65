"""A launch that raises what none of its steps expected still ends its allocation: before,
the launch's task died with the error, the allocation stayed live for ever (the job
RUNNING to the platform, its GPUs held) and nothing said why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.runner.conftest import EventLog, StartRunner, grant, publish
from trainyard_platform.services.runner import agent as agent_module
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import JobFailed, JobStarted

pytestmark = pytest.mark.integration


async def test_a_launch_that_breaks_unexpectedly_ends_its_allocation_as_the_platforms(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = await start_runner(settings)

    def broken_store(*args: object, **kwargs: object) -> None:
        raise ValueError("s3://platform-internal/secret-bucket is not a store")

    # The checkpoint store of the job, opened just before its spawn.
    monkeypatch.setattr(agent_module, "open_store", broken_store)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=60)
    assert failed.failure_kind == "platform_error" and not failed.node_fault
    assert failed.reason == (
        f"the runner of node {settings.node_id} could not launch the job (an internal "
        "error, ValueError, in its log); the platform retries it"
    )
    assert "secret-bucket" not in failed.reason
    assert events.of(JobStarted, allocation.job_id) == []
    async with asyncio.timeout(60):  # its launch ends once the end is said
        while allocation.allocation_id in runner.agent.running_allocations():
            await asyncio.sleep(0.05)
    assert allocation.allocation_id not in runner.agent._slots
    assert not (launches / allocation.allocation_id).exists()
