"""A pass runs with Python's cyclic garbage collector paused and leaves it as it found it
(``engine.collector_paused``): on, it is on again after the pass, which ends with one
collection of the young and middle generations when it left more than ``COLLECT_AFTER`` new
objects (so they are not all left for the first collection after it, and what survives is
in the oldest generation, not walked again by the next young collections; a full collection
would walk every object of the process) and with none when it left fewer; off, it stays off
and nothing is collected."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import pytest

from trainyard_platform.services.scheduler.policy import PolicyState, engine, schedule
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
    monkeypatch.setattr(engine, "COLLECT_AFTER", 0)  # this small pass counts as large
    gc.enable()
    snapshot, config = world(), PolicyConfig()
    with collections() as made:
        decisions = schedule(snapshot, config)
    assert made[-1:] == [1], "one collection of the young and middle generations, as it ends"
    oldest = gc.get_objects(generation=2)
    assert any(o is decisions.explanations for o in oldest), "what it returns is old now"
    state = PolicyState(snapshot, config)
    with collections() as made:
        state.run()
    assert made == [1]
    assert seen == [False, False]
    assert gc.isenabled()


def test_small_pass_makes_no_collection(collector: None) -> None:
    gc.enable()
    snapshot, config = world(), PolicyConfig()
    gc.collect()
    with collections() as made:
        schedule(snapshot, config)
    assert made == []
    assert gc.isenabled()


def test_collector_left_off_when_it_was_off(collector: None) -> None:
    gc.disable()
    with collections() as made:
        schedule(world(), PolicyConfig())
    assert made == []
    assert not gc.isenabled()


@contextlib.contextmanager
def collections() -> Iterator[list[int]]:
    """The generations of the collections made in the block."""
    made: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            made.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield made
    finally:
        gc.callbacks.remove(note)


def test_collector_on_again_when_interrupted_as_the_pause_begins(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An interrupt (Ctrl-C, a signal handler's exception) can land right after the
    # collector was turned off, before the pass itself started.
    disable = gc.disable

    def interrupted() -> None:
        disable()
        raise KeyboardInterrupt

    gc.enable()
    monkeypatch.setattr(gc, "disable", interrupted)
    with pytest.raises(KeyboardInterrupt):
        schedule(world(), PolicyConfig())
    assert gc.isenabled()
