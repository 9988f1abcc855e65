"""The baseline comparison's figures for one policy on one trace. Pure functions.

On top of ``metrics.summarize`` (JCT, queueing, makespan, utilisation, Jain's index of the
per-team mean slowdown, all teams):
- preemptions per job: the maximum and the nearest-rank p99 over finished jobs;
- GPU-hours lost to preemption, also as a share of the useful work (true duration x GPUs);
- per-team mean JCT over FIFO's, for teams with at least ``min_team_jobs`` (50) jobs, and the
  worst of them;
- the max/min ratio of the per-team mean slowdowns (JCT / true run time), all teams: 1 when
  every team is slowed down alike;
- jobs stopped at their declared limit (under-estimates, resubmitted) and the GPU-hours of
  work those stops lost, apart from preemption;
- the fairness measure of ``fairness``: each team's mean JCT over its mean JCT alone on a
  cluster of its share, the worst of them and how many teams are above 1 (given the teams'
  references; NaN and 0 without them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.simulator import fairness
from bench.simulator.engine import JobOutcome
from bench.simulator.metrics import Summary, percentile

MIN_TEAM_JOBS = 50


@dataclass(frozen=True)
class Scorecard:
    policy: str
    oracle: bool
    jobs: int
    mean_jct: float
    p95_jct: float
    mean_queueing: float
    makespan: float
    utilization: float
    lost_gpu_hours: float
    lost_share: float
    """GPU-hours lost over useful GPU-hours."""
    preemptions: int
    preemptions_max: int
    preemptions_p99: int
    jct_ratio: float
    """Mean JCT over FIFO's."""
    team_ratios: Mapping[str, float]
    """Per-team mean JCT over FIFO's (teams with at least ``MIN_TEAM_JOBS`` jobs)."""
    worst_team: str
    worst_team_ratio: float
    jain_slowdown: float
    slowdown_spread: float
    """Max over min of the per-team mean slowdowns."""
    team_slowdowns: Mapping[str, float]
    share_slowdowns: Mapping[str, float]
    """Per team: mean JCT over its mean JCT alone on a cluster of its share (``fairness``)."""
    worst_share_team: str
    worst_share_slowdown: float
    """The fairness measure: the highest of ``share_slowdowns`` (lower is better)."""
    teams_worse_than_alone: int
    limit_kills: int = 0
    limit_lost_gpu_hours: float = 0.0


def spread(values: Sequence[float]) -> float:
    """max / min of positive values (1.0 for none; inf if the minimum is 0)."""
    if not values:
        return 1.0
    low = min(values)
    return max(values) / low if low > 0 else math.inf


def team_ratios(ours: Summary, fifo: Summary, min_jobs: int = MIN_TEAM_JOBS) -> dict[str, float]:
    """Per-team mean JCT of ``ours`` over ``fifo``'s, teams with at least ``min_jobs`` jobs."""
    return {
        team: ours.teams[team].mean_jct / fifo.teams[team].mean_jct
        for team in sorted(fifo.teams.keys() & ours.teams.keys())
        if fifo.teams[team].jobs >= min_jobs and fifo.teams[team].mean_jct > 0
    }


def scorecard(
    policy: str,
    summary: Summary,
    outcomes: Sequence[JobOutcome],
    fifo: Summary,
    oracle: bool = False,
    alone: Mapping[str, float] | None = None,
) -> Scorecard:
    """The figures of one run against FIFO's on the same jobs; ``alone`` is each team's mean
    JCT on its own share (``fairness.alone_mean_jct``), for the fairness measure."""
    per_job = [o.preemptions for o in outcomes] or [0]
    useful_h = math.fsum(o.duration * o.gpus for o in outcomes) / 3600
    ratios = team_ratios(summary, fifo)
    worst = max(ratios.items(), key=lambda kv: kv[1], default=("", math.nan))
    slowdowns = {team: t.mean_slowdown for team, t in summary.teams.items()}
    shared = {team: t.mean_jct for team, t in summary.teams.items()}
    relative = fairness.share_slowdowns(shared, alone or {})
    worst_share = fairness.worst(relative)
    return Scorecard(
        policy=policy,
        oracle=oracle,
        jobs=summary.jobs,
        mean_jct=summary.mean_jct,
        p95_jct=summary.p95_jct,
        mean_queueing=summary.mean_queueing,
        makespan=summary.makespan,
        utilization=summary.utilization,
        lost_gpu_hours=summary.lost_gpu_hours,
        lost_share=summary.lost_gpu_hours / useful_h if useful_h > 0 else 0.0,
        preemptions=summary.preemptions,
        preemptions_max=max(per_job),
        preemptions_p99=int(percentile(per_job, 99)),
        jct_ratio=summary.mean_jct / fifo.mean_jct if fifo.mean_jct > 0 else math.nan,
        team_ratios=ratios,
        worst_team=worst[0],
        worst_team_ratio=worst[1],
        jain_slowdown=summary.jain_slowdown,
        slowdown_spread=spread(list(slowdowns.values())),
        team_slowdowns=slowdowns,
        share_slowdowns=relative,
        worst_share_team=worst_share.team,
        worst_share_slowdown=worst_share.ratio,
        teams_worse_than_alone=worst_share.worse_than_alone,
        limit_kills=summary.limit_kills,
        limit_lost_gpu_hours=summary.limit_lost_gpu_hours,
    )


def table(cards: Sequence[Scorecard], slack: float = 1.10) -> str:
    """One Markdown row per policy."""
    lines = [
        "| policy | mean JCT | p95 JCT | mean queueing | makespan | util. | GPU-h lost "
        "(% of work) | preempt./job max | p99 | mean JCT / FIFO | worst team / FIFO "
        f"(>= {MIN_TEAM_JOBS} jobs) | teams > {slack:.2f}x FIFO | Jain, team slowdown "
        "| max/min team slowdown | worst team / alone on its share | teams worse than alone "
        "| stopped at limit (GPU-h lost) |",
        "|---|" + "---:|" * 16,
    ]
    for c in cards:
        over = sum(r > slack for r in c.team_ratios.values())
        name = f"{c.policy} **(oracle)**" if c.oracle else c.policy
        lines.append(
            f"| {name} | {_h(c.mean_jct)} | {_h(c.p95_jct)} | {_h(c.mean_queueing)} "
            f"| {_h(c.makespan)} | {c.utilization:.1%} | {c.lost_gpu_hours:,.1f} "
            f"({c.lost_share:.2%}) | {c.preemptions_max} | {c.preemptions_p99} "
            f"| {c.jct_ratio:.3f} | {c.worst_team_ratio:.3f} ({c.worst_team}) "
            f"| {over} of {len(c.team_ratios)} | {c.jain_slowdown:.3f} "
            f"| {c.slowdown_spread:,.0f} | {c.worst_share_slowdown:.3f} ({c.worst_share_team}) "
            f"| {c.teams_worse_than_alone} of {len(c.share_slowdowns)} "
            f"| {c.limit_kills:,} ({c.limit_lost_gpu_hours:,.1f}) |"
        )
    return "\n".join(lines)


def team_table(cards: Sequence[Scorecard], jobs: Mapping[str, int]) -> str:
    """Per-team mean JCT over FIFO's (rows: teams with enough jobs; columns: the policies after
    the first, FIFO)."""
    shown = list(cards[1:])  # the first is FIFO itself
    head = "| team | jobs | " + " | ".join(c.policy for c in shown) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(shown)]
    teams = sorted(shown[0].team_ratios, key=lambda t: (-jobs[t], t)) if shown else []
    for team in teams:
        cells = " | ".join(f"{c.team_ratios[team]:.3f}" for c in shown)
        lines.append(f"| {team} | {jobs[team]:,} | {cells} |")
    return "\n".join(lines)


def share_table(cards: Sequence[Scorecard], jobs: Mapping[str, int]) -> str:
    """Per-team mean JCT over the team's alone on its share (rows: every team, most jobs
    first; columns: every policy)."""
    head = "| team | jobs | " + " | ".join(c.policy for c in cards) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(cards)]
    for team in sorted(jobs, key=lambda t: (-jobs[t], t)):
        cells = " | ".join(_ratio(c.share_slowdowns.get(team)) for c in cards)
        lines.append(f"| {team} | {jobs[team]:,} | {cells} |")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _h(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"
