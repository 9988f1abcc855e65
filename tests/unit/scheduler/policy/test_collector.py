"""A pass runs with Python's cyclic garbage collector paused and leaves it as it found it
(``engine.collector_paused``): on, it is on again after the pass; off, it stays off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from trainyard_platform.services.scheduler.policy import PolicyState, schedule
from trainyard_platform.services.scheduler.policy.model import Decisions, PolicyConfig, Snapshot

from .builders import node, pending, queue, snap


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def world() -> Snapshot:
    return snap((node("n1", 8),), (queue("qa", 8),), (pending("a", "qa", 4), pending("b", "qa", 8)))


def test_collector_paused_during_a_pass_and_on_again_after(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    explain = PolicyState.decisions

    def decisions(self: PolicyState) -> Decisions:
        seen.append(gc.isenabled())
        return explain(self)

    monkeypatch.setattr(PolicyState, "decisions", decisions)
    gc.enable()
    schedule(world(), PolicyConfig())
    PolicyState(world(), PolicyConfig()).run()
    assert seen == [False, False]
    assert gc.isenabled()


def test_collector_left_off_when_it_was_off(collector: None) -> None:
    gc.disable()
    schedule(world(), PolicyConfig())
    assert not gc.isenabled()
