"""The adapters: queue set-up, and the real policy driven by the engine."""

from __future__ import annotations

import random

from bench.simulator.cluster import FLAVOR
from bench.simulator.engine import SimConfig
from bench.simulator.policies import fifo, ours, team_queues
from tests.unit.simulator.helpers import job, run
from trainyard_platform.services.scheduler.policy.model import PolicyConfig


def test_team_quotas_are_equal_to_a_gpu_and_sum_to_the_cluster() -> None:
    queues = team_queues([f"team-{i:02d}" for i in range(15)], 500)
    quotas = [q.nominal[FLAVOR] for q in queues]
    assert sum(quotas) == 500
    assert sorted(set(quotas)) == [33, 34]
    assert {q.cohort for q in queues} == {"philly"}
    assert all(not q.borrowing_limit and not q.lending_limit for q in queues)


def test_ours_backfills_a_small_job_that_cannot_delay_the_blocked_head() -> None:
    # Same stream as the FIFO head-of-line test: c (1 GPU, declared 20 s) fits before b's
    # reservation at t=100 (a's declared end is 2 x 100 = 200, so b waits until a ends at 100).
    jobs = [job("a", 0, 8, 100), job("b", 1, 16, 10), job("c", 2, 1, 10, declared=20)]
    config = SimConfig(checkpoint_s=1800.0, grace_s=0.0)
    fifo_starts = {o.job_id: o.first_start for o in run(jobs, fifo, config=config).outcomes}
    ours_starts = {
        o.job_id: o.first_start for o in run(jobs, ours(PolicyConfig()), config=config).outcomes
    }
    assert fifo_starts["c"] == 110
    assert ours_starts["c"] == 2
    assert ours_starts["b"] == 100


def test_ours_finishes_a_random_multi_team_stream() -> None:
    rng = random.Random(3)
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
    result = run(jobs, ours(PolicyConfig(grace_s=30.0)), config=SimConfig(grace_s=30.0))
    assert result.unfinished == []
    assert len(result.outcomes) == len(jobs)
    assert result.missing_explanations == 0
