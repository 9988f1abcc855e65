"""``logs.Throttle``: one log line per reason and interval for a failure every request or
retry meets while it lasts, counting the ones held back."""

from __future__ import annotations

import math

from trainyard_platform.shared.logs import Throttle, held_back


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_reason_is_logged_first_then_once_an_interval_with_the_count_held_back() -> None:
    clock = Clock()
    throttle = Throttle(60.0, clock)

    assert throttle.due("refused") == 0
    clock.now += 10
    assert throttle.due("refused") is None
    assert throttle.due("refused") is None
    clock.now += 50
    assert throttle.due("refused") == 2
    assert throttle.due("refused") is None


def test_each_reason_has_its_own_interval() -> None:
    clock = Clock()
    throttle = Throttle(60.0, clock)

    assert throttle.due("refused") == 0
    assert throttle.due("timed out") == 0
    assert throttle.due("refused") is None


def test_the_reasons_kept_are_bounded_and_the_oldest_is_forgotten() -> None:
    clock = Clock()
    throttle = Throttle(60.0, clock)

    for n in range(Throttle.MAX_REASONS + 1):
        assert throttle.due(f"reason {n}") == 0

    assert len(throttle._seen) == Throttle.MAX_REASONS
    assert throttle.due("reason 0") == 0  # forgotten, so logged again
    assert throttle.due(f"reason {Throttle.MAX_REASONS}") is None


def test_the_count_reads_as_a_suffix_only_when_some_were_held_back() -> None:
    assert held_back(0) == ""
    assert held_back(3) == " (3 more times since it was last logged)"


def test_an_infinite_interval_is_once_per_reason_within_a_bounded_memory() -> None:
    """The registry warns once per job past its metric-key limit (``metric_ingest``): an
    infinite interval says each reason once, and past ``max_reasons`` the oldest is
    forgotten (said once more), so the reasons kept never grow without bound."""
    once = Throttle(math.inf, max_reasons=2)
    assert [once.due(r) for r in ("a", "a", "b", "b")] == [0, None, 0, None]
    assert once.due("c") == 0  # "a", the oldest, is forgotten
    assert [once.due(r) for r in ("b", "c", "a")] == [None, None, 0]
