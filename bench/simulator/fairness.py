"""The fairness measure the scheduler is tuned for: each team's slowdown relative to its share.

Definition (after Themis's finish-time fairness, Mahajan et al., NSDI 2020):

- A team's **reference** is what it would get on a cluster of its own the size of its nominal
  quota: its jobs alone (same arrivals, GPUs and declared runtimes) on exactly its quota's
  GPUs, under FIFO + EASY backfill (what a team running its own Slurm cluster gets). A gang
  that could never start there (larger than the quota, or of a shape, ``cluster.gang_shape``,
  that the quota's nodes cannot hold) runs on the largest smaller gang they can hold, with
  its work and declared runtime scaled linearly, the ideal data-parallel scaling the trace
  loader already assumes: 64 GPUs on a quota of 34 (four nodes of 8 and one of 2) as 32;
  16 on a quota of 14 (8 + 6) as 12 (2 x 6); 20 (4 nodes of 5) on a quota of 24 (three
  nodes of 8) as 18 (3 x 6). A team with a nominal quota of 0 is given one GPU. Real
  scaling is worse than linear, so this flatters the reference and makes the ratio below
  harder, not easier, for such teams.
- A team's **share-relative slowdown** is its mean JCT on the shared cluster over its mean JCT
  on that reference cluster: below 1 the team gains from sharing, above 1 it would have been
  better off alone with its quota.
- The measure is the **worst** such ratio over every team (lower is better), with the number
  of teams above 1.

Why this measure and not Jain's index of per-team slowdown (also reported): a quota is the
promise the platform makes a team, so the question a team asks is "am I at least as well off
as with my share to myself?" (the sharing-incentive property). The worst team is who leaves
the platform, so the measure is a maximum, not an average. Jain's index of slowdown (JCT over
run time) is dominated by the teams with the shortest jobs (a 1-second job that waits an hour
has a slowdown of 3,600) and rewards slowing every team down alike, which no tenant asks for.
The measure uses JCT, so it needs no knowledge a scheduler lacks: only the trace and the
quotas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bench.simulator.cluster import FLAVOR, build_cluster, gang_shape
from bench.simulator.easy import easy_backfill
from bench.simulator.engine import JobOutcome, SimConfig, simulate
from bench.simulator.metrics import mean
from bench.simulator.trace import TraceJob
from trainyard_platform.services.scheduler.policy.model import PriorityClass, Queue


@dataclass(frozen=True)
class Worst:
    """The worst team's share-relative slowdown, and how many teams are above 1."""

    team: str
    ratio: float
    worse_than_alone: int


def largest_gang(gpus: int) -> int:
    """The largest gang a cluster of ``gpus`` GPUs (``build_cluster``) can hold whole, in its
    shape (``fits``): all of it up to one node; else at least its full nodes (32 of 33 or 34;
    12 of 14, as 2 x 6)."""
    if gpus < 1:
        raise ValueError("a reference cluster needs at least one GPU")
    return next(g for g in range(gpus, 0, -1) if fits(g, gpus))


def fits(gpus: int, share: int) -> bool:
    """Whether a gang of ``gpus`` GPUs, in its shape (``gang_shape``), fits an empty cluster of
    ``share`` GPUs (``build_cluster``)."""
    nodes, per_node = gang_shape(gpus)
    return sum(node.gpus >= per_node for node in build_cluster(share)) >= nodes


def on_own_share(job: TraceJob, share: int) -> TraceJob:
    """``job`` as it runs alone on ``share`` GPUs: unchanged if its gang fits, else on the
    largest smaller gang the share holds, with work and declared runtime scaled linearly."""
    if fits(job.gpus, share):
        return job
    fit = next(g for g in range(min(job.gpus, share), 0, -1) if fits(g, share))
    scale = job.gpus / fit
    return replace(
        job, gpus=fit, duration=job.duration * scale, declared_runtime=job.declared_runtime * scale
    )


def alone_mean_jct(
    jobs: Sequence[TraceJob],
    queues: Sequence[Queue],
    priority: PriorityClass,
    config: SimConfig,
) -> dict[str, float]:
    """Each team's mean JCT alone on its reference cluster under FIFO + EASY backfill.

    Raises ``ValueError`` if a team's jobs do not all finish there (they always do: EASY
    starts every job that fits an empty cluster, and ``on_own_share`` makes every gang fit).
    """
    by_team: dict[str, list[TraceJob]] = {}
    for job in jobs:
        by_team.setdefault(job.team, []).append(job)
    means: dict[str, float] = {}
    for queue in sorted(queues, key=lambda q: q.team):
        team_jobs = by_team.get(queue.team)
        if not team_jobs:
            continue
        share = max(queue.nominal.get(FLAVOR, 0), 1)
        own = Queue(name=queue.name, team=queue.team, cohort=None, nominal={FLAVOR: share})
        alone = [on_own_share(job, share) for job in team_jobs]
        result = simulate(alone, build_cluster(share), (own,), (priority,), easy_backfill, config)
        if result.unfinished:
            raise ValueError(f"team {queue.team}: {len(result.unfinished)} jobs never ran alone")
        means[queue.team] = _mean_jct(result.outcomes)
    return means


def share_slowdowns(
    shared_mean_jct: Mapping[str, float], alone: Mapping[str, float]
) -> dict[str, float]:
    """Per team: mean JCT shared over mean JCT alone (teams present in both, by name)."""
    return {
        team: shared_mean_jct[team] / alone[team]
        for team in sorted(shared_mean_jct.keys() & alone.keys())
        if alone[team] > 0
    }


def worst(ratios: Mapping[str, float]) -> Worst:
    """The highest ratio (ties: first team by name) and the count above 1; NaN for none."""
    if not ratios:
        return Worst("", math.nan, 0)
    team = max(sorted(ratios), key=lambda t: ratios[t])
    return Worst(team, ratios[team], sum(r > 1.0 for r in ratios.values()))


def _mean_jct(outcomes: Sequence[JobOutcome]) -> float:
    return mean([o.completion - o.arrival for o in outcomes])
