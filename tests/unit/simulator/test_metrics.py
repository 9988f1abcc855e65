"""Metrics on hand-computed cases."""

from __future__ import annotations

import pytest

from bench.simulator.engine import JobOutcome
from bench.simulator.metrics import jain, mean, percentile, summarize, verdict


def _job(job_id: str, team: str, gpus: int, a: float, s: float, c: float, d: float) -> JobOutcome:
    return JobOutcome(job_id, team, gpus, a, s, c, d, preemptions=0, lost_gpu_s=0.0)


# JCTs 10, 30, 20; queueing 0, 10, 10; slowdowns 1, 1.5, 2; makespan 40 - 0.
JOBS = [
    _job("a", "x", 2, 0, 0, 10, 10),
    _job("b", "x", 1, 10, 20, 40, 20),
    _job("c", "y", 1, 5, 15, 25, 10),
]


def test_nearest_rank_percentile() -> None:
    assert percentile(list(range(1, 21)), 95) == 19
    assert percentile([7.0], 95) == 7.0
    assert percentile([3, 1, 2], 50) == 2
    with pytest.raises(ValueError):
        percentile([], 95)


def test_jain_index() -> None:
    assert jain([1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0]) == pytest.approx(1 / 3)
    assert jain([1, 2]) == pytest.approx(9 / 10)
    assert jain([]) == 1.0


def test_summary_of_three_jobs() -> None:
    s = summarize(JOBS, total_gpus=4, busy_gpu_s=70.0)
    assert s.jobs == 3
    assert s.mean_jct == pytest.approx(20.0)
    assert s.p95_jct == 30
    assert s.mean_queueing == pytest.approx(20 / 3)
    assert s.p95_queueing == 10
    assert s.makespan == 40
    assert s.utilization == pytest.approx(70 / (4 * 40))
    assert s.useful_utilization == pytest.approx((2 * 10 + 20 + 10) / (4 * 40))
    assert s.teams["x"].mean_jct == pytest.approx(20.0)
    assert s.teams["x"].mean_slowdown == pytest.approx(1.25)
    assert s.teams["y"].mean_slowdown == pytest.approx(2.0)
    assert s.jain_slowdown == pytest.approx(3.25**2 / (2 * (1.25**2 + 2.0**2)))


def test_verdict_against_the_targets() -> None:
    fifo = summarize(JOBS, 4, 70.0)
    faster = [_job("a", "x", 2, 0, 0, 10, 10), _job("b", "x", 1, 10, 10, 30, 20)]
    faster.append(_job("c", "y", 1, 5, 5, 15, 10))
    ours = summarize(faster, 4, 70.0)
    v = verdict(fifo, ours)
    assert v.jct_ratio == pytest.approx(mean([10, 20, 10]) / 20)
    assert v.team_ratios == {"x": pytest.approx(15 / 20), "y": pytest.approx(10 / 20)}
    assert not v.jct_met  # 0.667 > 0.5
    assert v.utilization_met  # same busy time over a shorter makespan
    assert v.teams_met
    worse = verdict(ours, fifo)
    assert not worse.teams_met and not worse.utilization_met
