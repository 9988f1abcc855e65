"""The baseline policies on tiny hand-made streams whose right answer is known."""

from __future__ import annotations

import math
import random

import pytest

from bench.simulator.easy import easy_backfill
from bench.simulator.engine import Policy, SimConfig
from bench.simulator.las import LasConfig, TiresiasLas
from bench.simulator.maxmin import max_min_fair, water_fill
from bench.simulator.srtf import SrtfOracle
from bench.simulator.trace import TraceJob
from tests.unit.simulator.helpers import job, run
from trainyard_platform.services.scheduler.policy.model import Decisions, Snapshot

NEVER = SimConfig(checkpoint_s=math.inf, grace_s=0.0)


def _starts(jobs: list[TraceJob], policy: Policy, gpus: int = 16) -> dict[str, float]:
    return {o.job_id: o.first_start for o in run(jobs, policy, gpus=gpus, config=NEVER).outcomes}


def test_easy_backfills_a_job_that_ends_before_the_heads_reservation() -> None:
    # a holds node 0 until its declared end, 100; b needs both nodes: reservation at 100.
    # c (declared 20) ends by then: it runs now. d (declared 200) would still hold a GPU of
    # the reservation at 100: refused, it starts after b.
    jobs = [
        job("a", 0, 8, 100, declared=100),
        job("b", 1, 16, 10),
        job("c", 2, 1, 10, declared=20),
        job("d", 3, 1, 100, declared=200),
    ]
    starts = _starts(jobs, easy_backfill)
    assert starts == {"a": 0, "b": 100, "c": 2, "d": 110}


def test_easy_lets_a_long_job_run_beside_the_reservation() -> None:
    # 3 nodes: a holds nodes 0-1 until 100; b (16 GPUs) is reserved nodes 0-1 at 100, so c
    # (8 GPUs, declared far past 100) may take node 2 now without delaying b.
    jobs = [job("a", 0, 16, 100, declared=100), job("b", 1, 16, 10), job("c", 2, 8, 500)]
    starts = _starts(jobs, easy_backfill, gpus=24)
    assert starts == {"a": 0, "b": 100, "c": 2}


def test_las_demotes_a_long_job_below_a_new_short_one() -> None:
    # a (8 GPUs) passes 1 GPU-hour at t=450 and drops to Q1; b arrives at 1000 in Q0 and
    # preempts it; a resumes when b is done.
    jobs = [job("a", 0, 8, 5000), job("b", 1000, 8, 100)]
    result = run(jobs, TiresiasLas(LasConfig(grace_s=0.0)), gpus=8, config=NEVER)
    out = {o.job_id: o for o in result.outcomes}
    assert out["b"].first_start == 1000
    assert out["b"].completion == 1100
    assert out["a"].preemptions == 1
    assert out["a"].completion == pytest.approx(1100 + 5000)  # no checkpoint: starts over


def test_las_never_preempts_within_a_queue() -> None:
    # At t=200 a has 1,600 GPU-seconds: still Q0 like b, so b waits for a.
    jobs = [job("a", 0, 8, 300), job("b", 200, 8, 100)]
    result = run(jobs, TiresiasLas(LasConfig(grace_s=0.0)), gpus=8, config=NEVER)
    out = {o.job_id: o for o in result.outcomes}
    assert out["b"].first_start == 300
    assert out["a"].preemptions == 0


def test_las_promotes_a_starved_job_back_to_the_top_queue() -> None:
    # Q0 below 100 GPU-seconds. b preempts a (Q1) at 100, after a ran 100 s; at 300 a has
    # waited 2 x 100 s, is promoted to Q0 with its service reset, and preempts b (Q1 by then).
    las = TiresiasLas(LasConfig(thresholds_gpu_s=(100.0,), promote_knob=2.0, grace_s=0.0))
    assert las.level(99) == 0 and las.level(100) == 1
    jobs = [job("a", 0, 8, 1000), job("b", 100, 8, 1000), job("c", 300, 8, 10)]
    notices: list[tuple[float, str, str]] = []

    def recorded(snapshot: Snapshot) -> Decisions:
        decisions = las(snapshot)
        notices.extend((snapshot.now, p.job_id, p.for_job_id) for p in decisions.preemptions)
        return decisions

    result = run(jobs, recorded, gpus=8, config=NEVER)
    assert notices[:2] == [(100, "a", "b"), (300, "b", "a")]
    assert result.unfinished == []


def test_max_min_gives_two_teams_equal_gpus_when_both_have_demand() -> None:
    # x fills both nodes with four 4-GPU jobs; y asks for 8 GPUs at t=10: shares are 8 and 8,
    # so two of x's jobs are preempted and y's two jobs start at once.
    jobs = [job(f"x{i}", 0, 4, 1000, team="x") for i in range(4)]
    jobs += [job("y0", 10, 4, 1000, team="y"), job("y1", 10, 4, 1000, team="y")]
    result = run(jobs, max_min_fair, gpus=16, config=NEVER)
    out = {o.job_id: o for o in result.outcomes}
    assert out["y0"].first_start == 10 and out["y1"].first_start == 10
    assert sum(out[f"x{i}"].preemptions for i in range(4)) == 2
    assert result.unfinished == []


def test_water_filling() -> None:
    assert water_fill({"a": 10, "b": 100, "c": 100}, 90) == {"a": 10, "b": 40, "c": 40}
    assert water_fill({"a": 3, "b": 4}, 16) == {"a": 3, "b": 4}
    assert water_fill({}, 16) == {}


def test_srtf_runs_the_shortest_remaining_first() -> None:
    # b (100 s) preempts a (1,000 s left); c (2,000 s) waits behind a's 1,000 s.
    jobs = [job("a", 0, 8, 1000), job("b", 10, 8, 100), job("c", 20, 8, 2000)]
    result = run(jobs, SrtfOracle(jobs), gpus=8, config=NEVER)
    out = {o.job_id: o for o in result.outcomes}
    assert out["b"].first_start == 10 and out["b"].completion == 110
    assert out["a"].preemptions == 1 and out["a"].completion == 1110
    assert out["c"].first_start == 1110


def test_srtf_knows_the_remaining_time_of_a_job_resubmitted_after_its_limit() -> None:
    # One GPU, checkpoints every 30 s. "a" needs 100 s but declares 50 s: stopped at 50 s with
    # 30 s kept, resubmitted declaring 100 s (70 s of it left), it restarts at once with 70 s
    # of true work left. "b" (80 s) arrives at 55 s: a has 65 s left, less than b's 80 s, so
    # a is not preempted (read against the trace's 50 s, a seemed to have 115 s left).
    jobs = [job("a", 0, 1, 100.0, declared=50.0), job("b", 55, 1, 80.0)]
    config = SimConfig(checkpoint_s=30.0, grace_s=0.0, min_pass_interval_s=0.0)
    out = {o.job_id: o for o in run(jobs, SrtfOracle(jobs), gpus=1, config=config).outcomes}
    assert (out["a"].limit_kills, out["a"].preemptions, out["a"].completion) == (1, 0, 120.0)
    assert (out["b"].first_start, out["b"].completion) == (120.0, 200.0)


@pytest.mark.parametrize("name", ["easy", "las", "maxmin", "srtf"])
def test_every_baseline_finishes_a_random_stream_of_gangs(name: str) -> None:
    rng = random.Random(11)
    jobs = [
        job(
            f"j{i:03d}",
            float(i * 5),
            rng.choice([1, 2, 4, 8, 16]),
            float(rng.randint(10, 600)),
            team=f"t{rng.randrange(4)}",
        )
        for i in range(80)
    ]
    policies: dict[str, Policy] = {
        "easy": easy_backfill,
        "las": TiresiasLas(LasConfig(thresholds_gpu_s=(600.0, 3000.0), grace_s=30.0)),
        "maxmin": max_min_fair,
        "srtf": SrtfOracle(jobs),
    }
    result = run(jobs, policies[name], config=SimConfig(checkpoint_s=120.0, grace_s=30.0))
    assert result.unfinished == []
    assert len(result.outcomes) == len(jobs)
