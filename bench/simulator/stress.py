"""Stress traces for the scheduler, generated from a seed: the cases the shared trace lacks.

Run: ``python -m bench.simulator.stress --seed 7`` writes one trace folder per scenario under
``bench/simulator/stress_traces/seed-7/`` (the Gavel/Philly format ``trace.load_trace``
reads); then ``python -m bench.simulator.baselines --trace-dir <folder> ...`` replays them.
The same seed always writes the same files.

Scenarios (every job runs at 1 step per second, so its steps are its true seconds; declared
runtimes are drawn by the replay as for the shared trace):

- ``gangs-over-quota``: 16 GPUs shared by 6 teams (nominal quotas of 2-3 GPUs) and a quarter
  of the jobs 8-GPU gangs, bigger than any team's quota: they run only by borrowing, which
  is what thrashed.
- ``bursts``: 64 GPUs, 8 teams; each team submits in bursts of 10-40 jobs at once.
- ``heavy-tail``: 64 GPUs, 8 teams; durations Pareto-distributed (shape 1.3, from 10 minutes,
  capped at 2 days): a few jobs hold GPUs for days among many short ones.
- ``many-tenants``: 128 GPUs, 40 teams whose activity follows a Zipf law.

Each scenario offers about 1.1 times what its cluster can run over the arrival period.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

from bench.simulator import options
from bench.simulator.synthetic import SyntheticJob, write_trace

JOB_TYPE = "Stress"
SIZES = (1, 2, 4, 8)
TARGET_LOAD = 1.1
DEFAULT_ROOT = Path(__file__).resolve().parent / "stress_traces"
PROG = "python -m bench.simulator.stress"

Draw = Callable[[random.Random], tuple[str, int, int]]
"""One job's (team, GPUs, seconds of work)."""


def _sized(rng: random.Random, weights: tuple[float, ...]) -> int:
    return rng.choices(SIZES, weights)[0]


def _lognormal_s(rng: random.Random, median_s: float, sigma: float = 1.0) -> int:
    return max(60, round(rng.lognormvariate(0.0, sigma) * median_s))


def _poisson(jobs: list[tuple[str, int, int]], gpus: int, rng: random.Random) -> list[float]:
    """Arrival times for ``jobs`` (in order) at a rate that offers ``TARGET_LOAD``."""
    work = sum(g * s for _, g, s in jobs)
    mean_gap = work / (gpus * TARGET_LOAD) / len(jobs)
    now, times = 0.0, []
    for _ in jobs:
        now += rng.expovariate(1 / mean_gap)
        times.append(round(now))
    return times


def gangs_over_quota(rng: random.Random) -> tuple[list[SyntheticJob], int]:
    gpus, teams = 16, [f"team-{i}" for i in range(6)]
    jobs = [
        (rng.choice(teams), _sized(rng, (40, 20, 15, 25)), _lognormal_s(rng, 2 * 3600))
        for _ in range(300)
    ]
    return _synthetic(jobs, _poisson(jobs, gpus, rng)), gpus


def bursts(rng: random.Random) -> tuple[list[SyntheticJob], int]:
    gpus, teams = 64, [f"team-{i}" for i in range(8)]
    jobs: list[tuple[str, int, int]] = []
    while len(jobs) < 600:
        team, size = rng.choice(teams), rng.randint(10, 40)
        jobs += [
            (team, _sized(rng, (50, 25, 15, 10)), _lognormal_s(rng, 3600)) for _ in range(size)
        ]
    jobs = jobs[:600]
    work = sum(g * s for _, g, s in jobs)
    span = work / (gpus * TARGET_LOAD)
    times: list[float] = []
    burst_at = 0.0
    for i, (team, _, _) in enumerate(jobs):
        if i == 0 or team != jobs[i - 1][0]:
            burst_at = rng.uniform(0.0, span)
        times.append(round(burst_at))
    order = sorted(range(len(jobs)), key=lambda i: (times[i], i))
    return _synthetic([jobs[i] for i in order], [times[i] for i in order]), gpus


def heavy_tail(rng: random.Random) -> tuple[list[SyntheticJob], int]:
    gpus, teams = 64, [f"team-{i}" for i in range(8)]
    jobs = [
        (
            rng.choice(teams),
            _sized(rng, (50, 25, 15, 10)),
            min(2 * 86400, round(600 * rng.paretovariate(1.3))),
        )
        for _ in range(1500)
    ]
    return _synthetic(jobs, _poisson(jobs, gpus, rng)), gpus


def many_tenants(rng: random.Random) -> tuple[list[SyntheticJob], int]:
    gpus, teams = 128, [f"team-{i:02d}" for i in range(40)]
    zipf = [1 / (rank + 1) for rank in range(len(teams))]
    jobs = [
        (rng.choices(teams, zipf)[0], _sized(rng, (45, 25, 18, 12)), _lognormal_s(rng, 3600))
        for _ in range(1200)
    ]
    return _synthetic(jobs, _poisson(jobs, gpus, rng)), gpus


SCENARIOS: dict[str, Callable[[random.Random], tuple[list[SyntheticJob], int]]] = {
    "gangs-over-quota": gangs_over_quota,
    "bursts": bursts,
    "heavy-tail": heavy_tail,
    "many-tenants": many_tenants,
}


def _synthetic(jobs: list[tuple[str, int, int]], times: list[float]) -> list[SyntheticJob]:
    return [
        SyntheticJob(team=team, job_type=JOB_TYPE, steps=seconds, arrival=at, gpus=g)
        for (team, g, seconds), at in zip(jobs, times, strict=True)
    ]


def write_scenarios(root: Path, seed: int) -> list[Path]:
    """Write every scenario for ``seed`` under ``root/seed-<seed>/``; returns the folders."""
    folders = []
    for index, (name, make) in enumerate(SCENARIOS.items()):
        jobs, gpus = make(random.Random(seed * 1000 + index))
        rates = {(JOB_TYPE, size): 1.0 for size in SIZES}
        folders.append(write_trace(root / f"seed-{seed}" / name, jobs, rates, gpus))
    return folders


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--seed", type=options.whole, default=7)
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    args = p.parse_args(argv)
    try:
        folders = write_scenarios(args.root, args.seed)
    except OSError as exc:
        return options.fail(PROG, f"--root: {exc.filename} cannot be written ({exc.strerror})")
    for folder in folders:
        print(os.path.relpath(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
