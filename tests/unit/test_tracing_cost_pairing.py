"""``bench.tracing_cost._paired_ratios``: each mode over *off* within a round, the median
over the rounds."""

from __future__ import annotations

from bench.tracing_cost import _paired_ratios


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
