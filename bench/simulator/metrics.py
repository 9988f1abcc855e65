"""Figures of merit of one simulated run, and the comparison of two runs. Pure functions.

Definitions (per finished job: arrival ``a``, first start ``s``, completion ``c``, true
duration ``d``):
- JCT ``c - a``; queueing delay ``s - a`` (time to the first start; later waits after a
  preemption count in JCT only); slowdown ``(c - a) / d``.
- p95 is the nearest-rank percentile: the ``ceil(0.95 n)``-th smallest value.
- makespan ``max(c) - min(a)``.
- utilization: GPU-seconds allocated to jobs (work later lost to preemption included) over
  ``gpus * makespan``; useful utilization counts only ``d * gpus`` of each job.
- Jain's fairness index of the per-team mean slowdowns ``x``: ``(sum x)^2 / (n * sum x^2)``,
  1 when all teams are slowed down equally, ``1/n`` when one team takes all the slowdown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.simulator.engine import JobOutcome


@dataclass(frozen=True)
class TeamSummary:
    jobs: int
    mean_jct: float
    mean_slowdown: float


@dataclass(frozen=True)
class Summary:
    jobs: int
    mean_jct: float
    p95_jct: float
    mean_queueing: float
    p95_queueing: float
    makespan: float
    utilization: float
    useful_utilization: float
    jain_slowdown: float
    preemptions: int
    lost_gpu_hours: float
    teams: Mapping[str, TeamSummary]
    limit_kills: int = 0
    """Times jobs were stopped at their declared limit (under-estimates)."""
    limit_lost_gpu_hours: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0 < q <= 100) of a non-empty sequence."""
    if not values or not 0 < q <= 100:
        raise ValueError("percentile needs values and 0 < q <= 100")
    ordered = sorted(values)
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of nothing")
    return math.fsum(values) / len(values)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index; 1.0 for an empty or all-zero sequence (nobody is favoured)."""
    squares = math.fsum(v * v for v in values)
    if squares == 0:
        return 1.0
    return math.fsum(values) ** 2 / (len(values) * squares)


def summarize(outcomes: Sequence[JobOutcome], total_gpus: int, busy_gpu_s: float) -> Summary:
    """The figures of one run over its finished jobs (see the module docstring)."""
    if not outcomes:
        raise ValueError("no finished jobs to summarize")
    jct = [o.completion - o.arrival for o in outcomes]
    queueing = [o.first_start - o.arrival for o in outcomes]
    makespan = max(o.completion for o in outcomes) - min(o.arrival for o in outcomes)
    capacity = total_gpus * makespan
    useful = math.fsum(o.duration * o.gpus for o in outcomes)
    by_team: dict[str, list[JobOutcome]] = {}
    for o in outcomes:
        by_team.setdefault(o.team, []).append(o)
    teams = {
        team: TeamSummary(
            jobs=len(group),
            mean_jct=mean([o.completion - o.arrival for o in group]),
            mean_slowdown=mean([(o.completion - o.arrival) / o.duration for o in group]),
        )
        for team, group in sorted(by_team.items())
    }
    return Summary(
        jobs=len(outcomes),
        mean_jct=mean(jct),
        p95_jct=percentile(jct, 95),
        mean_queueing=mean(queueing),
        p95_queueing=percentile(queueing, 95),
        makespan=makespan,
        utilization=busy_gpu_s / capacity if capacity > 0 else 0.0,
        useful_utilization=useful / capacity if capacity > 0 else 0.0,
        jain_slowdown=jain([t.mean_slowdown for t in teams.values()]),
        preemptions=sum(o.preemptions for o in outcomes),
        lost_gpu_hours=math.fsum(o.lost_gpu_s for o in outcomes) / 3600,
        teams=teams,
        limit_kills=sum(o.limit_kills for o in outcomes),
        limit_lost_gpu_hours=math.fsum(o.limit_lost_gpu_s for o in outcomes) / 3600,
    )


@dataclass(frozen=True)
class Verdict:
    """The issue's targets for ``ours`` against ``fifo`` on the same jobs."""

    jct_ratio: float
    """mean JCT ours / FIFO; target <= 0.5."""
    utilization_ratio: float
    """utilization ours / FIFO; target >= 1."""
    team_ratios: Mapping[str, float]
    """per-team mean JCT ours / FIFO; target <= 1.10 for every team."""
    jct_met: bool
    utilization_met: bool
    teams_met: bool


def verdict(fifo: Summary, ours: Summary, team_slack: float = 1.10) -> Verdict:
    """Compare two summaries of the same jobs against the targets."""
    ratios = {
        team: ours.teams[team].mean_jct / fifo.teams[team].mean_jct
        for team in sorted(fifo.teams.keys() & ours.teams.keys())
    }
    jct_ratio = ours.mean_jct / fifo.mean_jct
    util_ratio = ours.utilization / fifo.utilization if fifo.utilization > 0 else math.inf
    return Verdict(
        jct_ratio=jct_ratio,
        utilization_ratio=util_ratio,
        team_ratios=ratios,
        jct_met=jct_ratio <= 0.5,
        utilization_met=ours.utilization >= fifo.utilization,
        teams_met=all(r <= team_slack for r in ratios.values()),
    )
