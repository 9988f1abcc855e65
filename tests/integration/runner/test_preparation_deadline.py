"""An attempt's ``max_runtime_seconds`` counts from its grant, its preparation included
(``services.runner.deadline``): a job whose code fetch or environment build outlasts it
ends at its deadline, the git or installer command the runner started for it killed, as
``max_runtime`` naming the phase; a job that starts runs only what is left of it; and the
platform's own waits (an earlier launch on its GPUs) are not the job's time.

The clock of the deadlines is injected where a test needs time to pass (the agent's
``clock``): no assertion depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.git_servers import Listener
from tests.integration.runner.conftest import (
    EventLog,
    RunningRunner,
    StartRunner,
    grant,
    publish,
)
from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.environments import EnvironmentCache
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CodeGit,
    JobFailed,
    JobStarted,
    JobSucceeded,
)

pytestmark = pytest.mark.integration

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def with_requirements(allocation: AllocationGranted, requirements: list[str]) -> AllocationGranted:
    spec = allocation.spec.model_copy(update={"requirements": requirements})
    return allocation.model_copy(update={"spec": spec})


async def slot_freed(runner: RunningRunner, allocation_id: str) -> None:
    """Wait until the launch's thread returned (its slot is freed only then): the child
    process it ran has ended. The bound is far below that process's own timeout."""
    async with asyncio.timeout(60):
        while allocation_id in runner.agent._slots:
            await asyncio.sleep(0.05)


async def test_a_git_fetch_that_stalls_past_max_runtime_ends_the_attempt_at_its_deadline(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """Before, the runner waited for git as long as git's own 10 minutes, the GPUs held,
    whatever the job's max_runtime_seconds; the clock started only with the process."""
    runner = await start_runner(settings)
    with Listener(hold=True) as stalling:
        allocation = grant(settings.node_id, ["succeed", str(launches)], max_runtime_seconds=2)
        code = CodeGit(repository=f"git://127.0.0.1:{stalling.port}/repo", commit=COMMIT)
        allocation = allocation.model_copy(
            update={"spec": allocation.spec.model_copy(update={"code": code})}
        )
        await publish(bus, allocation, settings.node_id)
        failed = await events.first(JobFailed, allocation.job_id, timeout=60)
        assert failed.failure_kind == "max_runtime"
        assert failed.exit_code is None and not failed.node_fault
        assert failed.reason.startswith(
            "max_runtime_seconds: fetching the job's code took longer than the "
        )
        assert "left of the job's 2 s (counted from its grant" in failed.reason
        await slot_freed(runner, allocation.allocation_id)  # git was killed, not waited for
        assert stalling.accepted >= 1
    assert events.of(JobStarted, allocation.job_id) == []
    assert not (launches / allocation.allocation_id).exists()


async def test_a_grant_whose_delivery_took_its_whole_max_runtime_fails_as_the_platforms(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches: Path
) -> None:
    """The scheduler's clock 45 s behind the node's (or the bus 45 s late) and a limit of 30
    s: nothing of the job's ran, nor could. Before, it failed as the job's own max_runtime,
    not retried, the reason saying its preparation took longer than the 30 s left."""
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)], max_runtime_seconds=30)
    allocation = allocation.model_copy(
        update={"granted_at": datetime.now(UTC) - timedelta(seconds=45)}
    )
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=60)
    assert failed.failure_kind == "platform_error"
    assert failed.exit_code is None and not failed.node_fault
    assert failed.reason.startswith("the grant reached the node ")
    assert (
        " s after the scheduler made it, the whole of the job's max_runtime_seconds (30 s)"
        in failed.reason
    )
    assert events.of(JobStarted, allocation.job_id) == []
    assert not (launches / allocation.allocation_id).exists()


async def test_an_environment_build_past_max_runtime_is_stopped_and_its_installer_killed(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def slow_build(
        self: EnvironmentCache, key: str, requirements: Sequence[str], base: Any
    ) -> None:
        # The installer's command, as the cache runs it, taking far longer than the job may.
        self._run(["sleep", "600"], "uv pip install", installing=True, requirements=requirements)

    monkeypatch.setattr(EnvironmentCache, "_build", slow_build)
    runner = await start_runner(settings)
    allocation = with_requirements(
        grant(settings.node_id, ["succeed", str(launches)], max_runtime_seconds=3),
        ["tabulate==0.9.0"],
    )
    await publish(bus, allocation, settings.node_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=60)
    assert failed.failure_kind == "max_runtime"
    assert failed.reason.startswith(
        "max_runtime_seconds: building the job's environment took longer than the "
    )
    await slot_freed(runner, allocation.allocation_id)  # the installer was killed
    assert events.of(JobStarted, allocation.job_id) == []


async def test_the_process_runs_only_what_its_preparation_left_of_max_runtime(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Preparing takes 118 s of its 120 (by the injected clock, which stands still
    otherwise): the process is stopped for its max runtime once the 2 s left have passed,
    not after 120 s (it waits to be stopped)."""
    clock = Clock()
    runner = await start_runner(settings)
    runner.agent.clock = clock
    real_prepare = launch.prepare

    def prepare(*args: Any, **kwargs: Any) -> launch.Prepared:
        clock.now += 118
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(launch, "prepare", prepare)
    # Stamped after its receipt by the runner's clock: counted from the receipt, so the
    # delivery takes nothing of the job's time and only the preparation's 118 s do.
    allocation = grant(settings.node_id, ["wait", str(launches)], max_runtime_seconds=120)
    allocation = allocation.model_copy(
        update={"granted_at": datetime.now(UTC) + timedelta(minutes=5)}
    )
    await publish(bus, allocation, settings.node_id)
    await events.first(JobStarted, allocation.job_id)
    failed = await events.first(JobFailed, allocation.job_id, timeout=60)
    assert failed.failure_kind == "max_runtime"
    assert (
        failed.reason
        == "max runtime exceeded (120 s, counted from its grant, its preparation included)"
    )


async def test_waiting_for_an_earlier_launch_on_its_gpus_is_not_the_jobs_time(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The platform's queue: a launch waits for the earlier one on its GPU (here an hour, by
    the injected clock) and still has its whole max_runtime_seconds."""
    clock = Clock()
    runner = await start_runner(settings)
    runner.agent.clock = clock
    first = grant(settings.node_id, ["succeed", str(launches)], max_runtime_seconds=36_000)
    second = grant(settings.node_id, ["succeed", str(launches)], max_runtime_seconds=60)
    real_prepare = launch.prepare
    entered, release = threading.Event(), threading.Event()

    def prepare(*args: Any, **kwargs: Any) -> launch.Prepared:
        if args[0].allocation_id == first.allocation_id:
            entered.set()
            release.wait(timeout=120)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(launch, "prepare", prepare)
    try:
        await publish(bus, first, settings.node_id)
        async with asyncio.timeout(30):
            while not entered.is_set():
                await asyncio.sleep(0.05)
        await publish(bus, second, settings.node_id)
        async with asyncio.timeout(30):  # until the second waits behind the first
            while not (
                second.allocation_id in runner.agent._launches
                and runner.agent._launches[second.allocation_id].deadline.held
            ):
                await asyncio.sleep(0.05)
        clock.now += 3600  # for an hour
    finally:
        release.set()
    await events.first(JobSucceeded, first.job_id)
    await events.first(JobSucceeded, second.job_id)
