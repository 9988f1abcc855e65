"""``python -m bench.simulator``: replay the Philly trace under FIFO and under our policy.

Prints the comparison and per-team tables (Markdown) and writes ``bench/results/simulator.json``.
By default a pass runs at most every 300 simulated seconds (events in between are batched), so
the whole trace takes about 5 minutes on 2 cores; ``--min-pass-interval-s 0`` passes after every
event batch like the service does (about 15-20 minutes). See BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from bench.simulator import options, report
from bench.simulator.cluster import GPUS_PER_NODE, NODES_PER_RACK, build_cluster
from bench.simulator.engine import SimConfig, SimResult, simulate
from bench.simulator.metrics import Summary, summarize, verdict
from bench.simulator.policies import PRIORITY, fifo, ours, team_queues
from bench.simulator.trace import TraceError, cluster_gpus, load_trace
from trainyard_platform.services.scheduler.policy.model import PolicyConfig

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "gavel-msr-seed0"
DEFAULT_OUT = REPO / "bench" / "results" / "simulator.json"
PROG = "python -m bench.simulator"


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository (no machine path in the output)."""
    return os.path.relpath(path.resolve(), REPO)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--limit", type=options.positive, default=None, help="first N jobs by arrival")
    p.add_argument("--seed", type=int, default=0, help="seed of the declared-runtime factors")
    p.add_argument(
        "--checkpoint-min", type=options.non_negative, default=30.0, help="0: never checkpoint"
    )
    p.add_argument("--grace-s", type=options.finite_non_negative, default=PolicyConfig().grace_s)
    p.add_argument(
        "--min-pass-interval-s",
        type=options.finite_non_negative,
        default=300.0,
        help="at most one pass per this many simulated seconds, for both policies (0: a pass "
        "after every batch of simultaneous events, as the service does; ~4x slower)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        jobs = load_trace(args.trace_dir, seed=args.seed, limit=args.limit)
    except TraceError as exc:
        return options.fail(PROG, f"--trace-dir: {exc}")
    total = cluster_gpus(args.trace_dir)
    nodes = build_cluster(total)
    queues = team_queues({j.team for j in jobs}, total)
    policy_config = replace(PolicyConfig(), grace_s=args.grace_s)
    sim_config = SimConfig(
        checkpoint_s=args.checkpoint_min * 60 if args.checkpoint_min > 0 else math.inf,
        grace_s=args.grace_s,
        half_life_s=policy_config.half_life_s,
        min_pass_interval_s=args.min_pass_interval_s,
        priority=PRIORITY.name,
    )
    print(
        f"{len(jobs):,} jobs from {len(queues)} teams on {total} GPUs "
        f"({len(nodes)} nodes); {sum(j.extrapolated for j in jobs):,} with extrapolated throughput",
        flush=True,
    )
    results: dict[str, SimResult] = {}
    summaries: dict[str, Summary] = {}
    for name, policy in (("fifo", fifo), ("ours", ours(policy_config))):
        result = simulate(jobs, nodes, queues, (PRIORITY,), policy, sim_config, _Progress(name))
        results[name] = result
        summaries[name] = summarize(result.outcomes, total, result.busy_gpu_s)
        print(report.run_stats(name, result, explains=name != "fifo"), flush=True)
    v = verdict(summaries["fifo"], summaries["ours"])
    print()
    print(report.comparison_table(summaries["fifo"], summaries["ours"], v))
    print()
    print(report.team_table(summaries["fifo"], summaries["ours"], v))
    print()
    print(report.targets(v))
    parameters = {
        "trace_dir": repo_relative(args.trace_dir),
        "jobs": len(jobs),
        "limit": args.limit,
        "seed": args.seed,
        "gpus": total,
        "nodes": f"{total // GPUS_PER_NODE} x {GPUS_PER_NODE}"
        + (f" + 1 x {total % GPUS_PER_NODE}" if total % GPUS_PER_NODE else ""),
        "nodes_per_rack": NODES_PER_RACK,
        "extrapolated_throughput_jobs": sum(j.extrapolated for j in jobs),
        "declared_runtime_factor": "uniform [1, 5]",
        "sim": _finite(asdict(sim_config)),
        "policy": asdict(policy_config),
        "queues": {q.name: dict(q.nominal) for q in queues},
    }
    doc = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "arch": platform.machine(),
            "cpus": _cpus(),
            "python": platform.python_version(),
        },
        **report.record(parameters, summaries, results, v),
    }
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    except OSError as exc:
        return options.fail(PROG, f"--out: {args.out} cannot be written ({exc.strerror})")
    print(f"\nwrote {args.out}")
    return 0 if all(not r.unfinished for r in results.values()) else 1


class _Progress:
    """Prints where a run is, at most every 20 s of wall time, to stderr."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = self.last = time.perf_counter()

    def __call__(self, now: float, pending: int, running: int) -> None:
        wall = time.perf_counter()
        if wall - self.last >= 20:
            self.last = wall
            print(
                f"  {self.name}: day {now / 86400:,.1f}, {pending:,} pending, {running:,} running "
                f"({wall - self.started:,.0f} s)",
                file=sys.stderr,
                flush=True,
            )


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _finite(values: dict[str, object]) -> dict[str, object]:
    """JSON has no infinity: an infinite interval (never) is written as null."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
