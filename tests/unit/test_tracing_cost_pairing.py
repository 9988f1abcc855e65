"""``bench.tracing_cost._paired_ratios``: each mode over *off* within a round, the median
over the rounds."""

from __future__ import annotations

from bench.tracing_cost import MEETS, MISSES, UNSETTLED, _paired_interval, _paired_ratios, _verdict


def _run(mode: str, round_: int, per_second: float) -> dict[str, object]:
    return {"mode": mode, "round": round_, "decisions_per_second": per_second}


def test_a_round_is_compared_with_itself_not_with_the_others() -> None:
    # The machine is fast in rounds 0 and 1 and slow in 2 and 3; *on* is 0.9 of *off* in
    # every round, which the paired ratio sees whatever the speed, and whatever the order
    # of the runs within a round.
    runs = [
        _run("off", 0, 1500.0),
        _run("on", 0, 1350.0),
        _run("on", 1, 1440.0),
        _run("off", 1, 1600.0),
        _run("off", 2, 900.0),
        _run("on", 2, 810.0),
        _run("on", 3, 880.0),
        _run("off", 3, 1000.0),
    ]
    assert _paired_ratios(runs, ["on", "off"]) == {"on": 0.9, "off": 1.0}


def test_a_target_is_claimed_only_when_the_rounds_settle_it() -> None:
    # Nine rounds of *on* at 0.97-0.99 of *off*: the whole interval is above 0.95.
    steady = [r for n in range(9) for r in (_run("off", n, 1000.0), _run("on", n, 970.0 + 2 * n))]
    low, high = _paired_interval(steady, "on")
    assert 0.95 <= low <= high <= 0.99
    assert _verdict((low, high), 0.95) == MEETS
    # The same median of 0.98 from rounds spread 0.80-1.16 does not settle it either way.
    spread = [0.80, 0.85, 0.90, 0.98, 0.98, 0.98, 1.06, 1.11, 1.16]
    noisy = [
        r for n, x in enumerate(spread) for r in (_run("off", n, 1000.0), _run("on", n, 1000.0 * x))
    ]
    interval = _paired_interval(noisy, "on")
    assert interval[0] < 0.95 < interval[1]
    assert _verdict(interval, 0.95) == UNSETTLED
    # Every round well under the target: missed.
    slow = [r for n in range(5) for r in (_run("off", n, 1000.0), _run("on", n, 880.0 + n))]
    assert _verdict(_paired_interval(slow, "on"), 0.95) == MISSES


def test_the_interval_is_the_same_every_time_it_is_computed() -> None:
    runs = [r for n in range(6) for r in (_run("off", n, 1000.0), _run("on", n, 900.0 + 20 * n))]
    assert _paired_interval(runs, "on") == _paired_interval(runs, "on")
