"""Launches that want the same GPU go one after the other, in the order they came."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from trainyard_platform.services.runner.agent import NodeAgent, _Launch, _LaunchStopped
from trainyard_platform.services.runner.deadline import AttemptDeadline
from trainyard_platform.services.runner.domain import StopRequest
from trainyard_platform.shared.bus import NotNow

from .test_launch import GRANT

GPU = frozenset({0})


async def test_three_launches_on_one_gpu_go_in_turn_and_none_waits_for_good() -> None:
    # Each waited for any other launch on its GPUs: with A launching, B and C waited for A;
    # once A ended, B waited for C and C for B, for good (and the drain with them).
    agent = SimpleNamespace(_launches={})
    for name in "ABC":
        agent._launches[name] = _Launch(1, GPU, AttemptDeadline(3600))
    b = asyncio.create_task(NodeAgent._launched_on(agent, GPU, "B"))  # type: ignore[arg-type]
    c = asyncio.create_task(NodeAgent._launched_on(agent, GPU, "C"))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not b.done() and not c.done()  # A launches first
    NodeAgent._launch_ended(agent, "A")  # type: ignore[arg-type]
    await asyncio.wait_for(b, timeout=10)
    assert not c.done()  # C waits for B, which came before it
    NodeAgent._launch_ended(agent, "B")  # type: ignore[arg-type]
    await asyncio.wait_for(c, timeout=10)


async def test_a_launch_on_other_gpus_waits_for_none() -> None:
    agent = SimpleNamespace(
        _launches={
            "A": _Launch(1, GPU, AttemptDeadline(3600)),
            "B": _Launch(1, frozenset({1}), AttemptDeadline(3600)),
        }
    )
    await asyncio.wait_for(NodeAgent._launched_on(agent, frozenset({1}), "B"), timeout=10)  # type: ignore[arg-type]


async def test_a_grant_that_comes_while_the_runner_stops_goes_back_for_its_next_start() -> None:
    """Refused as an error of the grant's, it was nak'ed as a failure: a grant that came
    during a few stops (rolling restarts, the chaos suite's) was dead-lettered, and its job
    stayed allocated to a node that never ran it. A runner that stops may not launch now,
    whatever the grant: the bus hands it back (``NotNow``), never counted against it."""
    stop = asyncio.Event()
    stop.set()
    agent = SimpleNamespace(settings=SimpleNamespace(node_id=GRANT.node_id), _stop=stop)
    agent.node_id = GRANT.node_id
    with pytest.raises(NotNow, match="shutting down"):
        await NodeAgent.on_granted(agent, GRANT)  # type: ignore[arg-type]


async def test_a_stopped_launch_stops_waiting_at_once_and_keeps_its_thread_in_view() -> None:
    """A launch waited for its download or install to return before a cancel could end
    it; now the stop ends the wait, and the thread it left is awaited before its slot
    is freed (its result handed back, e.g. an environment lease to release)."""
    launching = _Launch(1, GPU, AttemptDeadline(3600))
    release = threading.Event()
    download = asyncio.ensure_future(asyncio.to_thread(lambda: release.wait(30) and "fetched"))
    waiting = asyncio.create_task(launching.unless_stopped(download, runs_on=True))
    await asyncio.sleep(0.05)
    launching.stop(StopRequest("revoked", "cancelled"), 0.5)
    launching.stop(StopRequest("shutdown", "runner shutting down"), 5)  # the first is kept
    with pytest.raises(_LaunchStopped):
        await asyncio.wait_for(waiting, timeout=10)
    assert launching.revoked == (StopRequest("revoked", "cancelled"), 0.5)
    assert not download.done()
    release.set()
    assert await asyncio.wait_for(launching.left_running(), timeout=10) == ["fetched"]
    sleeping = asyncio.ensure_future(asyncio.sleep(30))
    with pytest.raises(_LaunchStopped):  # a wait of its own is cancelled instead
        await launching.unless_stopped(sleeping)
    await asyncio.sleep(0)
    assert sleeping.cancelled()


async def test_a_launch_stopped_already_goes_no_further_even_when_its_work_is_done() -> None:
    """A stop that came while the launch was between two waits must not let it go on to
    fence other jobs or download: the next wait raises at once, and what a thread returned
    (an environment lease, say) is still handed back to be released."""
    launching = _Launch(1, GPU, AttemptDeadline(3600))
    launching.stop(StopRequest("revoked", "cancelled"), 0.5)
    with pytest.raises(_LaunchStopped):
        await launching.unless_stopped(asyncio.sleep(0, result="free"))
    done = asyncio.ensure_future(asyncio.to_thread(lambda: "prepared"))
    await done
    with pytest.raises(_LaunchStopped):
        await launching.unless_stopped(done, runs_on=True)
    assert await launching.left_running() == ["prepared"]
