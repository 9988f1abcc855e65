"""An attempt's ``max_runtime_seconds`` runs from its grant, its preparation included, but
for the platform's own waits (``services.runner.deadline``): a launch whose deadline
passes while it prepares is stopped, naming the phase, and the platform's waits never run
it out. The clock is injected: no test here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from pydantic import SecretStr

from tests.unit.runner.test_launch import GRANT
from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.agent import _Launch, _LaunchStopped
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.deadline import (
    MAX_DELIVERY_S,
    AttemptDeadline,
    cap_timeout,
    current,
)
from trainyard_platform.services.runner.environments import MARKER, STORE, EnvironmentCache
from trainyard_platform.services.runner.sandbox import JobUser, create_sandbox
from trainyard_platform.shared.storage import ObjectStore

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


def test_a_deadline_that_passes_before_any_phase_says_what_the_grant_left() -> None:
    # Before, it said the whole limit was left, whatever the delivery had taken of it.
    clock = Clock()
    deadline = AttemptDeadline.from_grant(RECEIVED - timedelta(seconds=15), RECEIVED, 60, clock)
    clock.now += 45
    assert deadline.expired()
    assert deadline.ran_out().startswith(
        "max_runtime_seconds: preparing the job took longer than the 45 s left of the job's 60 s"
    )


def test_a_grant_whose_delivery_took_its_whole_limit_is_the_platforms_delay() -> None:
    clock = Clock()
    eaten = AttemptDeadline.from_grant(RECEIVED - timedelta(seconds=45), RECEIVED, 30, clock)
    assert eaten.expired()
    assert eaten.delivered_too_late() == (
        "the grant reached the node 45 s after the scheduler made it, the whole of the job's "
        "max_runtime_seconds (30 s), before anything of the job's was done: the platform's "
        "delay (its bus, or the clocks of the scheduler and the node apart), not the job's; "
        "the platform retries it"
    )
    # Time left on its receipt: the job's, whatever then runs it out.
    left = AttemptDeadline.from_grant(RECEIVED - timedelta(seconds=45), RECEIVED, 60, clock)
    clock.now += 15
    assert left.expired() and left.delivered_too_late() is None


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


async def _held_once(deadline: AttemptDeadline, work: asyncio.Future[object]) -> bool:
    """Whether the platform holds ``deadline`` up while ``work`` is blocked; looked at until
    it does, ``work`` ends, or 30 s have passed (a guard against a hang, not a measure)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 30
    while not work.done() and loop.time() < give_up:
        if deadline.held:
            return True
        await asyncio.sleep(0.01)
    return deadline.held


async def test_waiting_for_another_launchs_build_of_the_environment_is_not_the_jobs_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another job's build of the same requirements holds the environment's lock: this job
    # waits in the platform's queue. Before, the wait was its own time: a build that another
    # tenant's short max_runtime_seconds cut off after minutes ran this job out too, as its
    # own max_runtime (not retried, billed).
    building, finish = threading.Event(), threading.Event()

    def build(self: EnvironmentCache, key: str, requirements: list[str], base: object) -> None:
        building.set()
        assert finish.wait(60), "the test lets the build finish"
        target = self.root / STORE / f"{key}.fake"
        target.mkdir(parents=True)
        (target / MARKER).write_text(json.dumps({"packages": ["six==1.16.0"]}))
        self.path(key).symlink_to(os.path.relpath(target, self.root))

    monkeypatch.setattr(EnvironmentCache, "_build", build)
    cache = EnvironmentCache(tmp_path / "envs", sys.executable, "pip")
    other = asyncio.ensure_future(asyncio.to_thread(cache.resolve, ["six==1.16.0"], "other"))
    assert await asyncio.to_thread(building.wait, 60)

    clock = Clock()
    deadline = AttemptDeadline(600, clock=clock)
    with deadline.applies():
        waiting = asyncio.ensure_future(asyncio.to_thread(cache.resolve, ["six==1.16.0"], "t"))
    try:
        assert await _held_once(deadline, waiting), "the wait for the lock is the platform's"
        clock.now += 3000  # the other job's build: its requirements installed, at length
    finally:
        finish.set()
    env = await asyncio.wait_for(waiting, timeout=60)
    await asyncio.wait_for(other, timeout=60)
    assert env.cached and env.packages == ["six==1.16.0"]
    assert not deadline.held and deadline.remaining() == 600


def test_cleaning_the_slot_of_the_last_jobs_leftovers_is_not_the_jobs_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last job of the slot's uid may leave a million files in /tmp: their removal, and
    # the sandbox made after it, is this node's work, not the next job's time.
    clock = Clock()
    deadline = AttemptDeadline(60, clock=clock)
    seen: list[bool] = []

    def slow_removal(uids: range) -> int:
        seen.append(deadline.held)
        clock.now += 600
        return 1_000_000

    monkeypatch.setattr(launch, "kill_leftovers", lambda uids, groups: 0)
    monkeypatch.setattr(launch, "remove_leftovers_of", slow_removal)
    monkeypatch.setattr(launch, "fetch_code", lambda *args: None)  # the spec names none
    monkeypatch.setattr(launch, "resume_from", lambda *args: None)
    settings = Settings(
        admin_token=SecretStr("t"), work_dir=tmp_path, job_disk_gib=0, job_network="host"
    )
    user = JobUser(None, None)
    # A uid of its own to clean, the sandbox made as the runner's own user.
    monkeypatch.setattr(
        launch, "create_sandbox", lambda *args: create_sandbox(tmp_path / "boxes", "a1", user)
    )
    with deadline.applies():
        fetched = launch.fetch(GRANT, settings, cast(ObjectStore, None), JobUser(200_001, 200_001))
    assert fetched.code_id is None and fetched.resumed_from is None
    assert seen == [True]
    assert deadline.remaining() == 60
