"""What a heartbeat says the node runs (``NodeAgent.running_allocations``): every allocation
it holds from the moment it takes the grant until its end is reported. The scheduler frees
the GPUs it holds for an ended allocation once a heartbeat does not list it, so a launch
left out (still preparing: fetching its code, building its environment) had its GPUs given
to another job while it could still start there."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from trainyard_platform.services.runner.agent import NodeAgent, _Launch
from trainyard_platform.services.runner.deadline import AttemptDeadline
from trainyard_platform.shared.events.payloads import AllocationGranted

from .test_launch import GRANT as OLD_GRANT

GPU = frozenset({0})


def fresh_grant() -> AllocationGranted:
    """The grant, made as the test runs (not when the module is imported, which may be
    minutes before under a loaded run): a grant delivered later than its
    max_runtime_seconds never gets as far as its launch
    (``deadline.AttemptDeadline.delivered_too_late``)."""
    return OLD_GRANT.model_copy(update={"granted_at": datetime.now(UTC)})


def listed(agent: Any) -> list[str]:
    return NodeAgent.running_allocations(agent)


def test_a_launch_still_preparing_is_listed_beside_the_jobs_that_run() -> None:
    agent = SimpleNamespace(
        _runs={"b-running": object()},
        _launches={
            "a-preparing": _Launch(1, GPU, AttemptDeadline(3600)),
            "b-running": _Launch(1, GPU, AttemptDeadline(3600)),
        },
    )
    assert listed(agent) == ["a-preparing", "b-running"]


async def test_a_grant_is_listed_from_its_acceptance_until_its_launch_ends() -> None:
    grant = fresh_grant()
    # Recording the grant (the ledger, in a thread) is a wait of its own: a heartbeat sent
    # meanwhile must already name the allocation.
    recording = asyncio.Event()
    recorded = asyncio.Event()
    launched: list[str] = []

    async def accept(grant: Any) -> Any:
        recording.set()
        await recorded.wait()
        return SimpleNamespace(grant=grant)

    agent: Any = SimpleNamespace(
        node_id=grant.node_id,
        settings=SimpleNamespace(node_id=grant.node_id),
        clock=time.monotonic,
        _stop=asyncio.Event(),
        _runs={},
        _launches={},
        _launch_tasks=set(),
        _accept=accept,
    )

    async def launch_job(accepted: Any, launching: _Launch) -> None:
        launched.append(accepted.grant.allocation_id)
        NodeAgent._launch_ended(agent, accepted.grant.allocation_id)

    agent._launch_job = launch_job
    agent._launch_ended = lambda allocation_id: NodeAgent._launch_ended(agent, allocation_id)
    granted = asyncio.create_task(NodeAgent.on_granted(agent, grant))
    await asyncio.wait_for(recording.wait(), timeout=10)
    assert listed(agent) == [grant.allocation_id]
    recorded.set()
    await asyncio.wait_for(granted, timeout=10)
    await asyncio.wait_for(asyncio.gather(*agent._launch_tasks), timeout=10)
    assert launched == [grant.allocation_id]
    assert listed(agent) == []


async def test_a_grant_not_taken_is_not_listed() -> None:
    grant = fresh_grant()

    async def accept(grant: Any) -> None:
        return None  # a duplicate, or ended at once (its end said)

    agent: Any = SimpleNamespace(
        node_id=grant.node_id,
        settings=SimpleNamespace(node_id=grant.node_id),
        clock=time.monotonic,
        _stop=asyncio.Event(),
        _runs={},
        _launches={},
        _accept=accept,
    )
    agent._launch_ended = lambda allocation_id: NodeAgent._launch_ended(agent, allocation_id)
    await NodeAgent.on_granted(agent, grant)
    assert listed(agent) == []
