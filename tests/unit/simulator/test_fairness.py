"""The fairness measure: each team's mean JCT over its mean JCT alone on its share."""

from __future__ import annotations

import math

import pytest

from bench.simulator.engine import JobOutcome, SimConfig
from bench.simulator.fairness import (
    alone_mean_jct,
    fits,
    largest_gang,
    on_own_share,
    share_slowdowns,
    worst,
)
from bench.simulator.metrics import summarize
from bench.simulator.policies import PRIORITY, team_queues
from bench.simulator.scorecard import scorecard, share_table, table
from tests.unit.simulator.helpers import job


def test_largest_gang_is_the_largest_the_shares_nodes_hold_in_its_shape() -> None:
    assert [largest_gang(g) for g in (1, 3, 8, 9, 33, 34, 64)] == [1, 3, 8, 8, 32, 32, 64]
    # 8 + 6 GPUs hold a gang of 12 as 2 x 6; 8 + 8 + 7 one of 21 as 3 x 7.
    assert [largest_gang(g) for g in (12, 13, 14, 22, 23)] == [8, 10, 12, 18, 21]
    assert on_own_share(job("d", 0, 16, 30.0), 14).gpus == 12
    with pytest.raises(ValueError):
        largest_gang(0)


def test_a_gang_over_the_share_runs_smaller_and_longer_alone() -> None:
    small = job("a", 0, 2, 100.0, declared=300.0)
    assert on_own_share(small, 3) is small
    big = on_own_share(job("b", 0, 8, 100.0, declared=300.0), 2)
    assert (big.gpus, big.duration, big.declared_runtime) == (2, 400.0, 1200.0)
    # 64 GPUs on a share of 33: whole nodes, 32 GPUs, twice as long.
    assert on_own_share(job("c", 0, 64, 10.0), 33).duration == pytest.approx(20.0)


def test_a_gang_within_the_share_whose_shape_its_nodes_cannot_hold_runs_smaller_alone() -> None:
    # A share of 24 GPUs is three nodes of 8; a 20-GPU gang must be 4 nodes of 5, so it could
    # never start there: it runs as 18 GPUs (3 x 6), the largest smaller gang they hold.
    assert not fits(20, 24) and fits(18, 24) and fits(16, 20) and not fits(20, 20)
    small = on_own_share(job("s", 0, 20, 90.0, declared=180.0), 24)
    assert small.gpus == 18
    assert (small.duration, small.declared_runtime) == (pytest.approx(100.0), pytest.approx(200.0))
    jobs = [job("x1", 0, 20, 90.0, team="x")]
    alone = alone_mean_jct(
        jobs, team_queues({"x"}, 24), PRIORITY, SimConfig(min_pass_interval_s=0.0)
    )
    assert alone == {"x": pytest.approx(100.0)}


def test_each_team_alone_queues_only_behind_its_own_jobs() -> None:
    # Two teams, a share of 2 GPUs each. Team x: two 2-GPU jobs of 100 s at once, so the second
    # waits 100 s alone (mean JCT 150). Team y: one 8-GPU job of 100 s, alone on 2 GPUs it runs
    # 400 s. No pass interval: the engine decides at every event.
    jobs = [
        job("x1", 0, 2, 100.0, team="x"),
        job("x2", 0, 2, 100.0, team="x"),
        job("y1", 0, 8, 100.0, team="y"),
    ]
    queues = team_queues({"x", "y"}, 4)
    alone = alone_mean_jct(jobs, queues, PRIORITY, SimConfig(min_pass_interval_s=0.0))
    assert alone == {"x": pytest.approx(150.0), "y": pytest.approx(400.0)}


def test_share_slowdowns_and_the_worst_team() -> None:
    ratios = share_slowdowns({"x": 300.0, "y": 200.0, "z": 50.0}, {"x": 150.0, "y": 400.0})
    assert ratios == {"x": pytest.approx(2.0), "y": pytest.approx(0.5)}  # z has no reference
    top = worst(ratios)
    assert (top.team, top.ratio, top.worse_than_alone) == ("x", pytest.approx(2.0), 1)
    assert worst({"a": 1.0, "b": 1.0}).team == "a"  # a tie goes to the first name
    empty = worst({})
    assert (empty.team, math.isnan(empty.ratio), empty.worse_than_alone) == ("", True, 0)


def test_the_scorecard_carries_the_measure_into_both_tables() -> None:
    def outcome(job_id: str, team: str, jct: float) -> JobOutcome:
        return JobOutcome(job_id, team, 1, 0.0, 0.0, jct, 10.0, preemptions=0, lost_gpu_s=0.0)

    runs = [outcome("a", "x", 30.0), outcome("b", "y", 10.0)]
    summary = summarize(runs, 2, 1.0)
    card = scorecard("ours", summary, runs, summary, alone={"x": 20.0, "y": 20.0})
    assert card.share_slowdowns == {"x": pytest.approx(1.5), "y": pytest.approx(0.5)}
    assert (card.worst_share_team, card.worst_share_slowdown) == ("x", pytest.approx(1.5))
    assert card.teams_worse_than_alone == 1
    assert "| 1.500 (x) | 1 of 2 |" in table([card])
    assert share_table([card], {"x": 1, "y": 1}).splitlines()[2] == "| x | 1 | 1.500 |"
    without = scorecard("ours", summary, runs, summary)
    assert math.isnan(without.worst_share_slowdown) and without.share_slowdowns == {}
