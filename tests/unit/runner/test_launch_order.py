"""Launches that want the same GPU go one after the other, in the order they came."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from trainyard_platform.services.runner.agent import NodeAgent, _Launch

GPU = frozenset({0})


async def test_three_launches_on_one_gpu_go_in_turn_and_none_waits_for_good() -> None:
    # Each waited for any other launch on its GPUs: with A launching, B and C waited for A;
    # once A ended, B waited for C and C for B, for good (and the drain with them).
    agent = SimpleNamespace(_launches={})
    for name in "ABC":
        agent._launches[name] = _Launch(1, GPU)
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
    agent = SimpleNamespace(_launches={"A": _Launch(1, GPU), "B": _Launch(1, frozenset({1}))})
    await asyncio.wait_for(NodeAgent._launched_on(agent, frozenset({1}), "B"), timeout=10)  # type: ignore[arg-type]
