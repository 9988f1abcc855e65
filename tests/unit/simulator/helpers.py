"""Helpers to build tiny simulations without any trace folder."""

from __future__ import annotations

from collections.abc import Iterable

from bench.simulator.cluster import SimNode, build_cluster
from bench.simulator.engine import Policy, SimConfig, SimResult, simulate
from bench.simulator.policies import PRIORITY, team_queues
from bench.simulator.trace import TraceJob


def job(
    job_id: str,
    arrival: float,
    gpus: int,
    duration: float,
    team: str = "t",
    declared: float | None = None,
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        team=team,
        job_type="Model",
        arrival=arrival,
        gpus=gpus,
        duration=duration,
        declared_runtime=declared if declared is not None else 2 * duration,
    )


def run(
    jobs: Iterable[TraceJob],
    policy: Policy,
    gpus: int = 16,
    config: SimConfig | None = None,
    nodes: tuple[SimNode, ...] | None = None,
) -> SimResult:
    jobs = list(jobs)
    queues = team_queues({j.team for j in jobs}, gpus)
    return simulate(jobs, nodes or build_cluster(gpus), queues, (PRIORITY,), policy, config)
