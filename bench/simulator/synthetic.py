"""Write small traces in the Gavel/Philly format, for tests and for trying the simulator.

``write_trace(folder, jobs, throughputs, gpus)`` writes one ``<team>.trace`` per team, a
``physical_cluster_throughputs.json`` and a ``cluster_specs.json``, so that
``trace.load_trace(folder)`` reads it like the real trace. ``random_jobs`` draws a job stream.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.simulator.trace import CLUSTER_SPECS_FILE, THROUGHPUTS_FILE


@dataclass(frozen=True)
class SyntheticJob:
    team: str
    job_type: str
    steps: int
    arrival: float
    gpus: int


def write_trace(
    folder: Path,
    jobs: Iterable[SyntheticJob],
    throughputs: Mapping[tuple[str, int], float],
    gpus: int,
) -> Path:
    """Write ``jobs`` as a trace folder (see the module docstring); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = {}
    for job in jobs:
        cols = [job.job_type, "python3 train.py", "-n", "0", str(job.steps), f"{job.arrival:f}"]
        lines.setdefault(job.team, []).append("\t".join([*cols, str(job.gpus)]))
    for team, rows in lines.items():
        (folder / f"{team}.trace").write_text("\n".join(rows) + "\n")
    table = {"v100": {repr(key): {"null": rate} for key, rate in throughputs.items()}}
    (folder / THROUGHPUTS_FILE).write_text(json.dumps(table))
    (folder / CLUSTER_SPECS_FILE).write_text(json.dumps({"synthetic": [f"{gpus}:0:0"]}))
    return folder


def random_jobs(
    rng: random.Random,
    count: int,
    teams: int = 3,
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
    job_type: str = "Model",
    mean_gap_s: float = 60.0,
    max_steps: int = 5000,
) -> list[SyntheticJob]:
    """``count`` jobs with exponential inter-arrival gaps, sizes and steps drawn by ``rng``."""
    jobs, now = [], 0.0
    for _ in range(count):
        now += round(rng.expovariate(1 / mean_gap_s))
        jobs.append(
            SyntheticJob(
                team=f"team-{rng.randrange(teams)}",
                job_type=job_type,
                steps=rng.randint(1, max_steps),
                arrival=now,
                gpus=rng.choice(sizes),
            )
        )
    return jobs
