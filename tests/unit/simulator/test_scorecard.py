"""The comparison's figures on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from bench.simulator.engine import JobOutcome
from bench.simulator.metrics import jain, summarize
from bench.simulator.scorecard import scorecard, spread, table, team_ratios


def _job(job_id: str, team: str, a: float, c: float, d: float, preempted: int = 0) -> JobOutcome:
    return JobOutcome(job_id, team, 1, a, a, c, d, preemptions=preempted, lost_gpu_s=0.0)


def test_jain_and_spread_of_equal_values_are_one() -> None:
    assert jain([3.0, 3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert spread([3.0, 3.0]) == 1.0
    assert spread([2.0, 8.0, 4.0]) == 4.0
    assert spread([]) == 1.0
    assert spread([0.0, 1.0]) == math.inf


def test_team_ratios_keep_teams_with_enough_jobs() -> None:
    fifo = [_job(f"x{i}", "x", 0, 10, 5) for i in range(50)] + [_job("y", "y", 0, 10, 5)]
    ours = [_job(f"x{i}", "x", 0, 5, 5) for i in range(50)] + [_job("y", "y", 0, 40, 5)]
    f, o = summarize(fifo, 4, 1.0), summarize(ours, 4, 1.0)
    assert team_ratios(o, f) == {"x": pytest.approx(0.5)}  # y has 1 job: left out


def test_scorecard_of_preemptions_and_slowdown() -> None:
    fifo = [_job(f"j{i}", "x" if i % 2 else "y", 0, 10, 5) for i in range(100)]
    ours = [
        _job(f"j{i}", "x" if i % 2 else "y", 0, 5 if i % 2 else 20, 5, preempted=i // 10)
        for i in range(100)
    ]
    f = summarize(fifo, 4, 1.0)
    card = scorecard("ours", summarize(ours, 4, 1.0), ours, f)
    assert card.preemptions_max == 9
    assert card.preemptions_p99 == 9
    assert card.jct_ratio == pytest.approx(12.5 / 10)
    assert card.team_ratios == {"x": pytest.approx(0.5), "y": pytest.approx(2.0)}
    assert (card.worst_team, card.worst_team_ratio) == ("y", pytest.approx(2.0))
    assert card.team_slowdowns == {"x": pytest.approx(1.0), "y": pytest.approx(4.0)}
    assert card.slowdown_spread == pytest.approx(4.0)
    assert card.jain_slowdown == pytest.approx(25 / (2 * 17))
    rows = table([scorecard("FIFO", f, fifo, f), card]).splitlines()
    assert len(rows) == 4 and "1 of 2" in rows[-1]
