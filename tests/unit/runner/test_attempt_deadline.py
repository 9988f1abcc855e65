"""An attempt's ``max_runtime_seconds`` runs from its grant, its preparation included, but
for the platform's own waits (``services.runner.deadline``): a launch whose deadline
passes while it prepares is stopped, naming the phase, and the platform's waits never run
it out. The clock is injected: no test here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import pytest

from trainyard_platform.services.runner.agent import _Launch, _LaunchStopped
from trainyard_platform.services.runner.deadline import (
    MAX_DELIVERY_S,
    AttemptDeadline,
    cap_timeout,
    current,
)

GPU = frozenset({0})
RECEIVED = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_starts_at_the_grant_as_its_bill_does() -> None:
    clock = Clock()
    granted = RECEIVED - timedelta(seconds=20)
    assert AttemptDeadline.from_grant(granted, RECEIVED, 600, clock).remaining() == 580


def test_a_grant_stamped_after_its_receipt_counts_from_the_receipt() -> None:
    # The scheduler's clock ahead of the runner's: the job loses nothing to it.
    clock = Clock()
    granted = RECEIVED + timedelta(hours=1)
    assert AttemptDeadline.from_grant(granted, RECEIVED, 600, clock).remaining() == 600


def test_a_grant_delivered_very_late_costs_the_job_at_most_the_delivery_bound() -> None:
    # The bus or the runner away (or the clocks far apart): the platform's delay.
    clock = Clock()
    granted = RECEIVED - timedelta(hours=2)
    deadline = AttemptDeadline.from_grant(granted, RECEIVED, 600, clock)
    assert deadline.remaining() == 600 - MAX_DELIVERY_S


def test_the_jobs_time_runs_and_the_platforms_moves_the_deadline() -> None:
    clock = Clock()
    deadline = AttemptDeadline(600, clock=clock)
    clock.now += 100  # the job's: its code fetched, say
    assert deadline.remaining() == 500
    with deadline.platform():
        clock.now += 3000  # waiting for an earlier launch on its GPUs, or the store
        assert deadline.held and deadline.remaining() == 500
        with deadline.platform():  # one wait inside another counts once
            clock.now += 50
        assert deadline.held
    assert not deadline.held and deadline.remaining() == 500
    clock.now += 500
    assert deadline.expired() and deadline.remaining() == 0


def test_a_deadline_that_passes_names_the_phase_and_what_was_left_of_the_limit() -> None:
    clock = Clock()
    deadline = AttemptDeadline(60, clock=clock)
    clock.now += 48
    with deadline.phase("building the job's environment"):
        clock.now += 30
        assert deadline.ran_out() == (
            "max_runtime_seconds: building the job's environment took longer than the 12 s "
            "left of the job's 60 s (counted from its grant, its preparation included); "
            "stopped before the job started"
        )


async def test_the_launchs_threads_see_its_deadline_and_its_child_processes_are_capped() -> None:
    clock = Clock()
    deadline = AttemptDeadline(60, clock=clock)
    assert current() is None and cap_timeout(600) == 600  # outside a launch: as asked
    with deadline.applies():
        assert await asyncio.to_thread(cap_timeout, 600) == 60
        assert await asyncio.to_thread(cap_timeout, 5) == 5
        clock.now += 60
        assert await asyncio.to_thread(cap_timeout, 600) == 0  # killed at once
    assert current() is None


async def test_a_launch_whose_deadline_passes_while_it_waits_stops_naming_the_phase() -> None:
    clock = Clock()
    launching = _Launch(1, GPU, AttemptDeadline(60, clock=clock))
    release = threading.Event()
    install = asyncio.ensure_future(asyncio.to_thread(lambda: release.wait(30) and "built"))
    with launching.deadline.phase("building the job's environment"):
        clock.now += 61
        with pytest.raises(_LaunchStopped):
            await asyncio.wait_for(launching.unless_stopped(install, runs_on=True), timeout=10)
    assert launching.revoked is not None
    request, _grace = launching.revoked
    assert request.kind == "max_runtime"
    assert request.reason.startswith(
        "max_runtime_seconds: building the job's environment took longer than the 60 s left"
    )
    release.set()  # the thread it stopped waiting for is still handed back
    assert await asyncio.wait_for(launching.left_running(), timeout=10) == ["built"]


async def test_a_launch_stops_at_its_deadline_while_its_work_still_runs() -> None:
    # The real clock, with a fraction of a second left: the wait does not outlast it.
    launching = _Launch(1, GPU, AttemptDeadline(1, spent_s=0.95))
    never = asyncio.Event()
    with pytest.raises(_LaunchStopped):
        await asyncio.wait_for(launching.unless_stopped(never.wait()), timeout=30)
    assert launching.revoked is not None and launching.revoked[0].kind == "max_runtime"


async def test_the_platforms_wait_never_runs_the_jobs_time_out() -> None:
    clock = Clock()
    launching = _Launch(1, GPU, AttemptDeadline(60, clock=clock))

    async def waited_for() -> str:
        clock.now += 7200  # two hours behind another launch on its GPUs
        return "its turn"

    with launching.deadline.platform():
        assert await launching.unless_stopped(waited_for()) == "its turn"
    assert launching.revoked is None
    assert launching.deadline.remaining() == 60


async def test_a_deadline_that_passed_before_the_platforms_wait_still_stops_the_launch() -> None:
    clock = Clock()
    launching = _Launch(1, GPU, AttemptDeadline(60, clock=clock))
    clock.now += 60
    with launching.deadline.platform(), pytest.raises(_LaunchStopped):
        await launching.unless_stopped(asyncio.sleep(0))
    assert launching.revoked is not None and launching.revoked[0].kind == "max_runtime"
