"""``python -m bench.simulator.baselines``: every policy side by side on the same trace(s).

Runs FIFO, FIFO + EASY backfill, Tiresias-style 2D-LAS, max-min fair share, the platform's
policy ("ours") and the SRTF oracle (true durations: a bound, not a contender) on the same
jobs, cluster, queues and engine settings as ``python -m bench.simulator``; prints one table
per trace (rows: policies) and the per-team JCT ratios against FIFO, and writes
``bench/results/simulator_baselines.json`` with repository-relative paths only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.simulator import fairness, options, scorecard
from bench.simulator.__main__ import _Progress, repo_relative
from bench.simulator.cluster import build_cluster
from bench.simulator.easy import easy_backfill
from bench.simulator.engine import Policy, SimConfig, simulate
from bench.simulator.las import LasConfig, TiresiasLas
from bench.simulator.maxmin import max_min_fair
from bench.simulator.metrics import summarize
from bench.simulator.policies import PRIORITY, fifo, ours, team_queues
from bench.simulator.srtf import SrtfOracle
from bench.simulator.trace import TraceError, TraceJob, cluster_gpus, load_trace
from trainyard_platform.services.scheduler.policy.model import PolicyConfig

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "gavel-msr-seed0"
DEFAULT_OUT = REPO / "bench" / "results" / "simulator_baselines.json"
PROG = "python -m bench.simulator.baselines"
POLICIES = ("fifo", "easy", "las", "maxmin", "ours", "srtf")
ORACLES = frozenset({"srtf"})
OURS_KNOBS = {
    "min_runtime_s": "anti-thrash protection before the first preemption (doubles per preemption)",
    "max_preemptions": "a job preempted this often runs its next allocation to its end",
    "oversize_protection_s": "reclaim spares a job larger than what its queue borrows this long",
    "ageing_s": "waiting that counts as one priority level",
    "size_weight": "priority levels per factor of ten in declared GPU-hours",
    "reservations": "blocked jobs per flavor that get a reservation",
}
"""``PolicyConfig`` fields the command line sets for ours (``--min-runtime-s`` ...), each with
its default from ``PolicyConfig`` and written to the results' settings as ``ours_<field>``."""
LABELS = {
    "fifo": "FIFO",
    "easy": "FIFO + EASY backfill",
    "las": "Tiresias 2D-LAS",
    "maxmin": "max-min fair share",
    "ours": "Trainyard (ours)",
    "srtf": "SRTF, true durations",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--trace-dir", type=Path, action="append", help="repeatable")
    p.add_argument("--limit", type=options.positive, default=None, help="first N jobs by arrival")
    p.add_argument("--seed", type=int, default=0, help="seed of the declared-runtime factors")
    p.add_argument(
        "--underestimate-share",
        type=options.share,
        default=0.0,
        help="share of jobs declaring less than they need (stopped at the limit, resubmitted)",
    )
    p.add_argument(
        "--checkpoint-min", type=options.non_negative, default=30.0, help="0: never checkpoint"
    )
    p.add_argument("--grace-s", type=options.finite_non_negative, default=PolicyConfig().grace_s)
    defaults = PolicyConfig()
    for field, meaning in OURS_KNOBS.items():
        default = getattr(defaults, field)
        p.add_argument(
            f"--{field.replace('_', '-')}",
            type=options.whole if isinstance(default, int) else options.non_negative,
            default=default,
            help=f"ours: {meaning}",
        )
    p.add_argument("--min-pass-interval-s", type=options.finite_non_negative, default=300.0)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, fifo first")
    p.add_argument(
        "--las-thresholds-gpu-h",
        type=options.ascending_positive,
        default=",".join(f"{t / 3600:g}" for t in LasConfig().thresholds_gpu_s),
        help="2D-LAS queue bounds in GPU-hours, comma-separated, ascending",
    )
    p.add_argument("--las-promote-knob", type=options.number, default=LasConfig().promote_knob)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def las_config(args: argparse.Namespace) -> LasConfig:
    bounds = tuple(t * 3600 for t in args.las_thresholds_gpu_h)
    return LasConfig(bounds, args.las_promote_knob, args.grace_s)


def ours_config(args: argparse.Namespace) -> PolicyConfig:
    knobs = {field: getattr(args, field) for field in OURS_KNOBS}
    return replace(PolicyConfig(), grace_s=args.grace_s, **knobs)


def make_policy(
    name: str, jobs: Sequence[TraceJob], config: PolicyConfig, las: LasConfig
) -> Policy:
    """A fresh policy (stateful ones keep per-run state)."""
    factories: dict[str, Callable[[], Policy]] = {
        "fifo": lambda: fifo,
        "easy": lambda: easy_backfill,
        "las": lambda: TiresiasLas(las),
        "maxmin": lambda: max_min_fair,
        "ours": lambda: ours(config),
        "srtf": lambda: SrtfOracle(jobs),
    }
    return factories[name]()


def run_trace(args: argparse.Namespace, trace_dir: Path, names: list[str]) -> dict[str, Any]:
    jobs = load_trace(trace_dir, args.seed, args.limit, args.underestimate_share)
    total = cluster_gpus(trace_dir)
    nodes = build_cluster(total)
    queues = team_queues({j.team for j in jobs}, total)
    config = SimConfig(
        checkpoint_s=args.checkpoint_min * 60 if args.checkpoint_min > 0 else math.inf,
        grace_s=args.grace_s,
        half_life_s=PolicyConfig().half_life_s,
        min_pass_interval_s=args.min_pass_interval_s,
        priority=PRIORITY.name,
    )
    print(
        f"\n{repo_relative(trace_dir)}: {len(jobs):,} jobs, {len(queues)} teams, {total} GPUs",
        flush=True,
    )
    alone = fairness.alone_mean_jct(jobs, queues, PRIORITY, config)
    print(f"  each team alone on its share (FIFO + EASY backfill): {len(alone)} teams", flush=True)
    cards: list[scorecard.Scorecard] = []
    runs: dict[str, dict[str, Any]] = {}
    fifo_summary = None
    for name in names:
        policy = make_policy(name, jobs, ours_config(args), las_config(args))
        result = simulate(jobs, nodes, queues, (PRIORITY,), policy, config, _Progress(name))
        summary = summarize(result.outcomes, total, result.busy_gpu_s)
        fifo_summary = fifo_summary or summary
        card = scorecard.scorecard(
            LABELS[name], summary, result.outcomes, fifo_summary, name in ORACLES, alone
        )
        cards.append(card)
        runs[name] = {
            "scorecard": _finite(asdict(card)),
            "passes": result.passes,
            "policy_s": round(result.policy_s, 3),
            "wall_s": round(result.wall_s, 3),
            "unfinished": len(result.unfinished),
        }
        print(
            f"  {name}: {result.passes:,} passes, {result.policy_s:.1f} s in the policy, "
            f"{result.wall_s:.1f} s wall, {len(result.unfinished)} unfinished",
            flush=True,
        )
    team_jobs = {t: s.jobs for t, s in (fifo_summary.teams.items() if fifo_summary else ())}
    print()
    print(scorecard.table(cards))
    print()
    print(scorecard.team_table(cards, team_jobs))
    print()
    print(scorecard.share_table(cards, team_jobs))
    return {
        "trace": repo_relative(trace_dir),
        "jobs": len(jobs),
        "limit": args.limit,
        "gpus": total,
        "teams": len(queues),
        "team_jobs": team_jobs,
        "team_alone_mean_jct_s": {t: round(v, 1) for t, v in alone.items()},
        "policies": runs,
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if not names or names[0] != "fifo" or not set(names) <= set(POLICIES):
        raise SystemExit(f"--policies: fifo first, then any of {', '.join(POLICIES)}")
    try:
        traces = [run_trace(args, t, names) for t in args.trace_dir or [DEFAULT_TRACE]]
    except TraceError as exc:
        return options.fail(PROG, f"--trace-dir: {exc}")
    doc = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "arch": platform.machine(),
            "cpus": _cpus(),
            "python": platform.python_version(),
        },
        "command": " ".join([PROG, *map(_rel_arg, argv)]),
        "seed": args.seed,
        "underestimate_share": args.underestimate_share,
        "settings": {
            "checkpoint_min": args.checkpoint_min,
            "grace_s": args.grace_s,
            "min_pass_interval_s": args.min_pass_interval_s,
            **{f"ours_{field}": _finite(getattr(args, field)) for field in OURS_KNOBS},
            "las": asdict(las_config(args)),
            "oracles": sorted(ORACLES),
        },
        "traces": traces,
    }
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        return options.fail(PROG, f"--out: {args.out} cannot be written ({exc.strerror})")
    print(f"\nwrote {repo_relative(args.out)}")
    return 0 if all(r["unfinished"] == 0 for t in traces for r in t["policies"].values()) else 1


def _rel_arg(arg: str) -> str:
    """A command-line argument with any absolute path made repository-relative."""
    flag, eq, value = arg.rpartition("=") if arg.startswith("--") else ("", "", arg)
    return f"{flag}{eq}{repo_relative(Path(value))}" if os.path.isabs(value) else arg


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN: such numbers are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
