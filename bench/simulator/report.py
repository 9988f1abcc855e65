"""Tables (Markdown, so they print and paste into BENCHMARKS.md alike) and the JSON record."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bench.simulator.engine import SimResult
from bench.simulator.metrics import Summary, Verdict


def _h(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


def comparison_table(fifo: Summary, ours: Summary, v: Verdict) -> str:
    rows = [
        ("jobs finished", f"{fifo.jobs:,}", f"{ours.jobs:,}", ""),
        ("mean JCT", _h(fifo.mean_jct), _h(ours.mean_jct), f"{v.jct_ratio:.3f}"),
        ("p95 JCT", _h(fifo.p95_jct), _h(ours.p95_jct), f"{ours.p95_jct / fifo.p95_jct:.3f}"),
        ("mean queueing delay", _h(fifo.mean_queueing), _h(ours.mean_queueing), _ratio(ours.mean_queueing, fifo.mean_queueing)),
        ("p95 queueing delay", _h(fifo.p95_queueing), _h(ours.p95_queueing), _ratio(ours.p95_queueing, fifo.p95_queueing)),
        ("makespan", _h(fifo.makespan), _h(ours.makespan), f"{ours.makespan / fifo.makespan:.3f}"),
        ("GPU utilization (allocated)", f"{fifo.utilization:.1%}", f"{ours.utilization:.1%}", f"{v.utilization_ratio:.3f}"),
        ("GPU utilization (useful work)", f"{fifo.useful_utilization:.1%}", f"{ours.useful_utilization:.1%}", ""),
        ("Jain index, per-team slowdown", f"{fifo.jain_slowdown:.3f}", f"{ours.jain_slowdown:.3f}", ""),
        ("preemptions", f"{fifo.preemptions:,}", f"{ours.preemptions:,}", ""),
        ("GPU-hours lost to preemption", f"{fifo.lost_gpu_hours:,.1f}", f"{ours.lost_gpu_hours:,.1f}", ""),
    ]  # fmt: skip
    lines = ["| metric | FIFO | ours | ours / FIFO |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def team_table(fifo: Summary, ours: Summary, v: Verdict) -> str:
    lines = [
        "| team | jobs | FIFO mean JCT | ours mean JCT | ratio | FIFO slowdown | ours slowdown |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for team, ratio in sorted(v.team_ratios.items(), key=lambda kv: -fifo.teams[kv[0]].jobs):
        f, o = fifo.teams[team], ours.teams[team]
        flag = " **(> 1.10)**" if ratio > 1.10 else ""
        lines.append(
            f"| {team} | {f.jobs:,} | {_h(f.mean_jct)} | {_h(o.mean_jct)} | {ratio:.3f}{flag} "
            f"| {f.mean_slowdown:,.1f} | {o.mean_slowdown:,.1f} |"
        )
    return "\n".join(lines)


def targets(v: Verdict) -> str:
    worst_team, worst = max(v.team_ratios.items(), key=lambda kv: kv[1])
    over = sorted(t for t, r in v.team_ratios.items() if r > 1.10)

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    return "\n".join(
        [
            f"- mean JCT <= 0.5 x FIFO: {mark(v.jct_met)} (ratio {v.jct_ratio:.3f})",
            f"- utilization >= FIFO: {mark(v.utilization_met)} (ratio {v.utilization_ratio:.3f})",
            f"- no team's mean JCT > 1.10 x FIFO: {mark(v.teams_met)} (worst {worst_team} at "
            f"{worst:.3f}{'; over: ' + ', '.join(over) if over else ''})",
        ]
    )


def run_stats(name: str, r: SimResult, explains: bool = True) -> str:
    mean_ms = r.policy_s / r.passes * 1000 if r.passes else 0.0
    return (
        f"{name}: {r.passes:,} passes, {r.policy_s:.1f} s in the policy (mean {mean_ms:.2f} ms, "
        f"max {r.max_pass_s * 1000:.1f} ms), {r.wall_s:.1f} s wall, {len(r.unfinished)} unfinished"
        + (f", {r.missing_explanations:,} pending-job passes without an explanation" if explains and r.missing_explanations else "")
    )  # fmt: skip


def record(
    parameters: Mapping[str, Any],
    summaries: Mapping[str, Summary],
    results: Mapping[str, SimResult],
    v: Verdict,
) -> dict[str, Any]:
    """The JSON document written to ``bench/results/simulator.json`` (less date and machine)."""
    return {
        "parameters": dict(parameters),
        "policies": {
            name: {
                "summary": dataclasses.asdict(summaries[name]),
                "run": {
                    "passes": results[name].passes,
                    "policy_s": results[name].policy_s,
                    "max_pass_s": results[name].max_pass_s,
                    "wall_s": results[name].wall_s,
                    "unfinished": len(results[name].unfinished),
                    "missing_explanations": results[name].missing_explanations,
                },
            }
            for name in summaries
        },
        "verdict": dataclasses.asdict(v),
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b > 0 else "n/a"
