"""Scale benchmark of the pure scheduling policy (no I/O): one full pass, the arrival fast
path, and memory, for 10 / 100 / 1,000 nodes of 8 GPUs; with ``--ten-x`` also issue 16's
scale (10,000 nodes, 100,000 pending jobs in 500 queues): full pass, incremental decisions
for a seeded mix of events (``policy.incremental.Incremental``), and memory.

Run: ``.venv/bin/python -m bench.scheduler_scale`` (``--quick`` for a smoke run; ``--ten-x``
adds minutes; ``--compiled`` runs it all against the policy compiled with mypyc, as the
services' image runs it). Prints a table and writes ``bench/results/scheduler_scale.json``.

Scenario (seeded, the same on every run), scaled with the node count ``N``:
- ``N`` nodes x 8 GPUs, 60% a100 / 40% h100, topology domains (racks) of 16 nodes;
- 50 queues (one team each) in 5 cohorts; each cohort gets a fifth of every flavor as nominal
  quota, split evenly among its queues; some queues have borrowing or lending limits;
- three priority classes (low / normal preemptible, high not), 10-30 min minimum runtimes;
- running jobs filling about 70% of the GPUs (ages, checkpoints and declared runtimes mixed);
- ``10 * N`` pending jobs of 1-64 GPUs (mostly small: 1, 2, 4, 8; some 16, 32, 64), submitted
  over the last day, declared runtimes 10 min - 24 h, decayed usage per team.

Measures:
- full pass: ``schedule(snapshot)``, building the state included, best / median of repeats;
- arrival: ``decide_arrival`` on the state after a full pass of a variant in which the backlog
  is held back by quota (its queues are at their nominal quota and may not borrow) while a
  quarter of the GPUs is free; 1-64-GPU jobs arrive in the other queues; p50 / p99 / max;
- memory: peak traced allocation (tracemalloc) of building and running the 1,000-node pass,
  and the process's peak RSS.
- ten times the scale (``--ten-x``): the same scenario at 10,000 nodes with 500 queues
  (one team each, in 5 cohorts); the full pass (median of 3), its peak traced allocation,
  and ``--events`` events (arrivals of new jobs, running jobs ending, a node joining and
  leaving, in a fixed rotation), each timed from the event to decisions equal to a full
  pass, from a pass kept as the scheduler keeps it (``fast_path.Kept``); the service's
  arrival fast path (``fast_path.decide``) for arrivals in queues held back by quota
  (``arrival_scenario``'s backlog at that scale); the process's peak RSS.
Times are wall clock; CPU time (process / thread) is printed beside them because on a shared
machine the wall clock also counts time spent waiting for a core. The targets are judged on
the wall clock; the JSON records both and the load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from bench._host import describe
from bench.policy_compiled import REPO, compiled_copy, python_with
from trainyard_platform.services.scheduler.compiled import is_compiled
from trainyard_platform.services.scheduler.convert import Built
from trainyard_platform.services.scheduler.fast_path import Kept, decide
from trainyard_platform.services.scheduler.policy import PolicyState, decide_arrival, schedule
from trainyard_platform.services.scheduler.policy.incremental import Incremental
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Node,
    PendingJob,
    PolicyConfig,
    PriorityClass,
    Queue,
    RunningJob,
    Snapshot,
)
from trainyard_platform.services.scheduler.scheduling import PassResult

NOW = 1_750_000_000.0
HOUR = 3600.0
GPUS_PER_NODE = 8
QUEUES = 50
COHORTS = 5
SIZES = (1, 2, 4, 8, 16, 32, 64)
SIZE_WEIGHTS = (30, 20, 20, 18, 6, 4, 2)
CLASSES = (
    PriorityClass("low", 0, preemptible=True, min_runtime_s=600.0),
    PriorityClass("normal", 10, preemptible=True, min_runtime_s=1800.0),
    PriorityClass("high", 20, preemptible=False, min_runtime_s=0.0),
)
RESULTS = Path(__file__).parent / "results" / "scheduler_scale.json"


# --- scenario ------------------------------------------------------------------------------


def flavor_of(i: int, nodes: int) -> str:
    return "a100" if i < round(nodes * 0.6) else "h100"


def build_queues(
    nodes: int, backlog_blocked: bool = False, count: int = QUEUES
) -> tuple[Queue, ...]:
    capacity = {"a100": 0, "h100": 0}
    for i in range(nodes):
        capacity[flavor_of(i, nodes)] += GPUS_PER_NODE
    per_queue = {f: c // count for f, c in capacity.items()}
    spare = {f: c - per_queue[f] * count for f, c in capacity.items()}
    queues = []
    for q in range(count):
        nominal = {f: per_queue[f] + (1 if q < spare[f] else 0) for f in capacity}
        borrowing: dict[str, int] = {}
        lending: dict[str, int] = {}
        if q % 7 == 3:
            borrowing = {f: max(8, 2 * n) for f, n in nominal.items()}
        if q % 11 == 5:
            lending = {f: n // 2 for f, n in nominal.items()}
        if backlog_blocked and q % 2 == 0:
            borrowing = {f: 0 for f in nominal}
        queues.append(
            Queue(
                f"q{q:02d}", f"team-{q:02d}", f"cohort-{q % COHORTS}", nominal, borrowing, lending
            )
        )
    return tuple(queues)


def job_size(rng: random.Random) -> int:
    return rng.choices(SIZES, SIZE_WEIGHTS)[0]


RUNNING_SEQ_OFFSET = 10_000_000
"""Running jobs' arrival sequence numbers come before every pending job's (0, 1, ...)."""


def fill_running(
    rng: random.Random,
    nodes: int,
    queues: tuple[Queue, ...],
    fraction: float,
    submit_times: bool = False,
) -> tuple[list[Node], list[RunningJob]]:
    """Running jobs filling ``fraction`` of the GPUs: whole-node gangs and smaller jobs; with
    ``submit_times``, each knows its submit time and arrival sequence (so victim choice
    checks that the preemptor stands before it: rule 6 of docs/scheduling.md), else not (as
    the goldens were made)."""
    used: list[dict[int, str]] = [{} for _ in range(nodes)]
    jobs: list[RunningJob] = []
    target = int(nodes * GPUS_PER_NODE * fraction)
    filled = 0
    order = list(range(nodes))
    rng.shuffle(order)
    cursor = 0
    # Queue usage per flavor, so running jobs stay within quota as a real cluster would.
    room = {(q.name, f): n for q in queues for f, n in q.nominal.items()}
    while filled < target and cursor < len(order):
        i = order[cursor]
        flavor = flavor_of(i, nodes)
        free = [g for g in range(GPUS_PER_NODE) if g not in used[i]]
        size = min(rng.choice((1, 2, 4, 8)), len(free))
        candidates = [q for q in queues if room[(q.name, flavor)] >= size]
        if not free or not candidates:
            cursor += 1
            continue
        queue = rng.choice(candidates)
        room[(queue.name, flavor)] -= size
        job_id = f"run-{len(jobs):06d}"
        for g in free[:size]:
            used[i][g] = job_id
        started = NOW - rng.uniform(60, 12 * HOUR)
        checkpoint = rng.choice([None, started + rng.uniform(0, NOW - started)])
        jobs.append(
            RunningJob(
                job_id,
                queue.name,
                flavor,
                size,
                rng.choice(("low", "normal", "normal", "high")),
                started,
                rng.uniform(0.5, 24) * HOUR + (NOW - started),
                {f"node-{i:04d}": tuple(free[:size])},
                checkpoint,
                # Made without the generator: every other draw of the scenario stays the same.
                submitted_at=started - (len(jobs) % 48) * 900.0 if submit_times else None,
                seq=len(jobs) - RUNNING_SEQ_OFFSET,
            )
        )
        filled += size
        if len(used[i]) == GPUS_PER_NODE or rng.random() < 0.3:
            cursor += 1
    node_list = [
        Node(f"node-{i:04d}", flavor_of(i, nodes), GPUS_PER_NODE, f"rack-{i // 16:03d}", used[i])
        for i in range(nodes)
    ]
    return node_list, jobs


def pending_jobs(
    rng: random.Random, count: int, nodes: int, queues: tuple[Queue, ...], prefix: str = "job"
) -> list[PendingJob]:
    total = nodes * GPUS_PER_NODE
    jobs = []
    for n in range(count):
        size = min(job_size(rng), total // 2 or 1)
        queue = queues[rng.randrange(len(queues))]
        jobs.append(
            PendingJob(
                f"{prefix}-{n:06d}",
                queue.name,
                rng.choice(("a100", "a100", "h100")),
                size,
                rng.choice(("low", "normal", "normal", "high")),
                NOW - rng.uniform(0, 24 * HOUR),
                rng.choice((600.0, 1800.0, 3600.0, 4 * HOUR, 12 * HOUR, 24 * HOUR)),
                n,
            )
        )
    return jobs


def scenario(
    nodes: int,
    seed: int = 1,
    jobs: int | None = None,
    queues_count: int = QUEUES,
    submit_times: bool = False,
) -> Snapshot:
    """The scale scenario (``fill_running`` says what ``submit_times`` does)."""
    rng = random.Random(seed)
    queues = build_queues(nodes, count=queues_count)
    node_list, running = fill_running(rng, nodes, queues, 0.7, submit_times)
    pending = pending_jobs(rng, 10 * nodes if jobs is None else jobs, nodes, queues)
    usage = {q.team: rng.uniform(0, 50) * HOUR * GPUS_PER_NODE for q in queues}
    return Snapshot(NOW, tuple(node_list), queues, CLASSES, tuple(pending), tuple(running), usage)


def arrival_scenario(
    nodes: int, seed: int = 2, queues_count: int = QUEUES
) -> tuple[Snapshot, list[PendingJob]]:
    """Backlog held back by quota, a quarter of the GPUs free, and arrivals that fit."""
    rng = random.Random(seed)
    queues = build_queues(nodes, backlog_blocked=True, count=queues_count)
    blocked = tuple(q for i, q in enumerate(queues) if i % 2 == 0)
    open_ = tuple(q for i, q in enumerate(queues) if i % 2 == 1)
    node_list, running = fill_running(rng, nodes, blocked, 0.75)
    backlog = pending_jobs(rng, 10 * nodes, nodes, blocked)
    arrivals = pending_jobs(rng, 1000, nodes, open_, prefix="arrival")
    arrivals = [a for a in arrivals if a.gpus <= 8 or nodes >= 100]
    snapshot = Snapshot(NOW, tuple(node_list), queues, CLASSES, tuple(backlog), tuple(running))
    return snapshot, arrivals


# --- measurements ----------------------------------------------------------------------------


def time_pass(snapshot: Snapshot, repeats: int) -> tuple[list[float], list[float], Decisions]:
    """Wall and CPU seconds of ``repeats`` full passes (CPU time is what the pass itself
    used, unaffected by other processes competing for the cores)."""
    walls, cpus = [], []
    decisions = Decisions()
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        decisions = schedule(snapshot, PolicyConfig())
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return walls, cpus, decisions


def time_arrivals(nodes: int) -> dict[str, float]:
    snapshot, arrivals = arrival_scenario(nodes)
    state = PolicyState(snapshot, PolicyConfig())
    state.run()
    placed, placed_cpu, waited = [], [], []
    for job in arrivals:
        start, cpu = time.perf_counter(), time.thread_time()
        d = decide_arrival(state, job)
        took, took_cpu = time.perf_counter() - start, time.thread_time() - cpu
        if d.placements:
            placed.append(took)
            placed_cpu.append(took_cpu)
        else:
            waited.append(took)
    return {
        "arrivals": len(arrivals),
        "placed": len(placed),
        "p50_ms": 1000 * percentile(placed, 50),
        "p99_ms": 1000 * percentile(placed, 99),
        "max_ms": 1000 * max(placed, default=0.0),
        "cpu_p99_ms": 1000 * percentile(placed_cpu, 99),
        "waiting_p99_ms": 1000 * percentile(waited, 99),
    }


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def peak_memory(snapshot_nodes: int) -> float:
    """Peak traced MiB of building the scenario's snapshot and running one pass."""
    tracemalloc.start()
    snapshot = scenario(snapshot_nodes)
    schedule(snapshot, PolicyConfig())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def row(nodes: int, repeats: int) -> dict[str, float]:
    snapshot = scenario(nodes)
    times, cpus, decisions = time_pass(snapshot, repeats)
    arrivals = time_arrivals(nodes)
    return {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "pending": len(snapshot.pending),
        "running": len(snapshot.running),
        "pass_best_s": min(times),
        "pass_median_s": statistics.median(times),
        "pass_cpu_median_s": statistics.median(cpus),
        "placed": len(decisions.placements),
        "preempted": len(decisions.preemptions),
        "waiting": len(decisions.explanations),
        "arrival_p50_ms": arrivals["p50_ms"],
        "arrival_p99_ms": arrivals["p99_ms"],
        "arrival_max_ms": arrivals["max_ms"],
        "arrival_cpu_p99_ms": arrivals["cpu_p99_ms"],
        "arrivals_placed": arrivals["placed"],
        "arrival_waiting_p99_ms": arrivals["waiting_p99_ms"],
    }


def ten_x(nodes: int, queues: int, repeats: int, events: int) -> dict[str, object]:
    """Issue 16's scale: a full pass, incremental decisions for a seeded mix of events, and
    memory, at ``nodes`` nodes with ``10 * nodes`` pending jobs in ``queues`` queues; the
    running jobs know their submit times, as the service's do."""
    snapshot = scenario(nodes, queues_count=queues, submit_times=True)
    walls, cpus, decisions = time_pass(snapshot, repeats)
    gc.collect()
    tracemalloc.start()
    schedule(snapshot, PolicyConfig())
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    start = time.perf_counter()
    kept = keep(snapshot)
    kept_s = time.perf_counter() - start
    timings = time_events(kept.incremental, snapshot, nodes, events)
    blocked = time_blocked_arrivals(nodes, queues, events)
    return {
        "nodes": nodes,
        "queues": queues,
        "pending": len(snapshot.pending),
        "running": len(snapshot.running),
        "running_submit_times_known": True,
        "pass_median_s": statistics.median(walls),
        "pass_best_s": min(walls),
        "pass_cpu_median_s": statistics.median(cpus),
        "placed": len(decisions.placements),
        "preempted": len(decisions.preemptions),
        "waiting": len(decisions.explanations),
        "pass_peak_traced_mib": traced / 2**20,
        "incremental_first_pass_s": kept_s,
        **timings,
        "quota_blocked_arrivals": blocked,
    }


def keep(snapshot: Snapshot) -> Kept:
    """A pass kept as the scheduler keeps its settled pass for the fast path (``run_pass``
    runs ``PolicyState``; ``loops.PassLoop`` keeps it with ``fast_path.Kept.of``)."""
    state = PolicyState(snapshot, PolicyConfig())
    result = PassResult(Built(snapshot=snapshot), state, state.run(), {})
    return Kept.of(result, PolicyConfig(), interval_s=5.0)


def time_blocked_arrivals(nodes: int, queues: int, count: int) -> dict[str, object]:
    """The fast path (``fast_path.decide``, the service's code) for arrivals in queues held
    back by quota, at ``nodes`` nodes with ``10 * nodes`` pending jobs in ``queues`` queues
    (``arrival_scenario``'s backlog), each timed from the job to its notes; an arrival the
    fast path declines costs a whole pass (timed as one, in memory)."""
    rng = random.Random(4)
    snapshot, _ = arrival_scenario(nodes, queues_count=queues)
    start = time.perf_counter()
    kept = keep(snapshot)
    kept_s = time.perf_counter() - start
    blocked = tuple(q for i, q in enumerate(snapshot.queues) if i % 2 == 0)
    arrivals = pending_jobs(rng, count, nodes, blocked, prefix="blocked")
    fast, passed, notes = [], [], []
    for n, job in enumerate(arrivals):
        job = replace(job, submitted_at=NOW, seq=20 * nodes + n)
        start = time.perf_counter()
        told = decide(kept, job)
        if told is None:
            kept.incremental.arrive(job)  # a whole pass, as the service would run
            passed.append(time.perf_counter() - start)
        else:
            fast.append(time.perf_counter() - start)
            notes.append(len(told))
    every = fast + passed
    return {
        "arrivals": len(arrivals),
        "fast_path": len(fast),
        "passes": len(passed),
        "kept_pass_s": kept_s,
        "fast_p50_ms": 1000 * percentile(fast, 50),
        "fast_p99_ms": 1000 * percentile(fast, 99),
        "fast_max_ms": 1000 * max(fast, default=0.0),
        "notes_per_arrival_median": statistics.median(notes) if notes else 0,
        "p99_ms": 1000 * percentile(every, 99),
    }


def event_mix(
    incremental: Incremental, snapshot: Snapshot, nodes: int, count: int
) -> Iterator[tuple[str, Callable[[], Decisions]]]:
    """The seeded mix of ``count`` events that ``time_events`` times (arrivals of new jobs,
    running jobs ending, a node joining and leaving, in a fixed rotation): each event's kind
    and a call that applies it to ``incremental``, in order (apply one before the next)."""
    rng = random.Random(3)
    arrivals = pending_jobs(rng, count, nodes, snapshot.queues, prefix="event")
    running = sorted(r.job_id for r in snapshot.running)
    for n in range(count):
        kind = ("arrive", "arrive", "end", "arrive", "join", "arrive", "end", "leave")[n % 8]
        if kind == "arrive":
            job = replace(arrivals[n], submitted_at=NOW, seq=10 * nodes + n)
            yield kind, functools.partial(incremental.arrive, job)
        elif kind == "end":
            job_id = running.pop(rng.randrange(len(running)))
            yield kind, functools.partial(incremental.end, job_id)
        elif kind == "join":
            node = Node(f"new-{n:04d}", flavor_of(n, nodes), GPUS_PER_NODE, "rack-new")
            yield kind, functools.partial(incremental.node_joined, node)
        else:
            yield kind, functools.partial(incremental.node_left, f"new-{n - 3:04d}")


def time_events(
    incremental: Incremental, snapshot: Snapshot, nodes: int, count: int
) -> dict[str, object]:
    """Wall and CPU time of ``count`` events (arrivals, ends, nodes joining and leaving, in
    a seeded mix) decided by ``incremental``, each equal to a full pass on its state."""
    walls: dict[str, list[float]] = {"arrive": [], "end": [], "join": [], "leave": []}
    cpus: list[float] = []
    for kind, apply in event_mix(incremental, snapshot, nodes, count):
        start, cpu = time.perf_counter(), time.process_time()
        apply()
        walls[kind].append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    every = [t for ts in walls.values() for t in ts]
    return {
        "events": count,
        "events_by_kind": {k: len(v) for k, v in walls.items()},
        "isolated_arrivals": incremental.isolated,
        "event_full_passes": incremental.full_passes - 1,
        "event_p50_ms": 1000 * percentile(every, 50),
        "event_p99_ms": 1000 * percentile(every, 99),
        "event_max_ms": 1000 * max(every, default=0.0),
        "event_cpu_p50_ms": 1000 * percentile(cpus, 50),
        "event_cpu_p99_ms": 1000 * percentile(cpus, 99),
        "event_p50_ms_by_kind": {k: 1000 * percentile(v, 50) for k, v in walls.items()},
    }


def jobs_sweep(nodes: int, counts: tuple[int, ...]) -> list[dict[str, float]]:
    """Pass time at a fixed node count as the backlog grows (best of two)."""
    out = []
    for count in counts:
        walls, cpus, decisions = time_pass(scenario(nodes, jobs=count), 2)
        out.append(
            {
                "nodes": nodes,
                "pending": count,
                "pass_best_s": min(walls),
                "pass_cpu_best_s": min(cpus),
                "placed": len(decisions.placements),
            }
        )
    return out


def sweep_table(rows: list[dict[str, float]]) -> str:
    lines = ["| nodes | pending | pass best (CPU) | placed |", "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['pending']:,} | {r['pass_best_s'] * 1000:.0f} ms "
            f"({r['pass_cpu_best_s'] * 1000:.0f} ms) | {r['placed']:,} |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| nodes | GPUs | pending | running | pass median (CPU) | pass best | placed "
        "| preempted | arrival p50 | arrival p99 (CPU) | arrival max |"
    )
    lines = [head, "|" + "---:|" * 11]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['gpus']:,} | {r['pending']:,} | {r['running']:,} "
            f"| {r['pass_median_s'] * 1000:.0f} ms ({r['pass_cpu_median_s'] * 1000:.0f} ms) "
            f"| {r['pass_best_s'] * 1000:.0f} ms | {r['placed']:,} | {r['preempted']:,} "
            f"| {r['arrival_p50_ms']:.2f} ms "
            f"| {r['arrival_p99_ms']:.2f} ms ({r['arrival_cpu_p99_ms']:.2f} ms) "
            f"| {r['arrival_max_ms']:.2f} ms |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 and 100 nodes, one repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--ten-x",
        action="store_true",
        help="also issue 16's scale: 10,000 nodes, 100,000 pending, 500 queues (minutes)",
    )
    parser.add_argument("--events", type=int, default=24, help="events timed at --ten-x")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run against the policy compiled with mypyc, as the services' image runs it "
        "(a copy compiled in a temporary folder first)",
    )
    args = parser.parse_args(argv)
    if args.compiled and not is_compiled():
        with compiled_copy() as root:
            given = sys.argv[1:] if argv is None else argv
            python_with([root, REPO], ["-m", "bench.scheduler_scale", *given], capture=False)
        return 0
    sizes = (10, 100) if args.quick else (10, 100, 1000)
    repeats = 1 if args.quick else args.repeats
    rows = [row(n, repeats) for n in sizes]
    sweep = jobs_sweep(
        sizes[-1], (1_000, 5_000, 10_000, 20_000) if not args.quick else (100, 1_000)
    )
    peak = peak_memory(sizes[-1])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    big = rows[-1]
    targets = {
        "pass_under_1s": big["pass_median_s"] < 1.0,
        "pass_cpu_under_1s": big["pass_cpu_median_s"] < 1.0,
        "arrival_p99_under_5ms": big["arrival_p99_ms"] < 5.0,
        "arrival_cpu_p99_under_5ms": big["arrival_cpu_p99_ms"] < 5.0,
        "memory_under_500MB": peak < 500 and rss < 500,
    }
    print(table(rows))
    print(f"\nbacklog sweep at {sizes[-1]:,} nodes:")
    print(sweep_table(sweep))
    print(
        f"\npeak traced memory ({sizes[-1]} nodes, build + pass): {peak:.0f} MiB; "
        f"process peak RSS: {rss:.0f} MiB"
    )
    scale = ten_x(10_000, 500, 3, args.events) if args.ten_x else None
    if scale is not None:
        scale["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        scale["targets"] = {
            "pass_under_2s": scale["pass_median_s"] <= 2.0,
            "pass_cpu_under_2s": scale["pass_cpu_median_s"] <= 2.0,
            "event_p99_under_50ms": scale["event_p99_ms"] <= 50.0,
            "memory_under_2GB": scale["peak_rss_mib"] <= 2048,
        }
        print("\nten times the scale:")
        print(json.dumps(scale, indent=2))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.quick:
        print("targets: not judged in --quick mode (they are for 1,000 nodes)")
    else:
        print("targets:", ", ".join(f"{k}={'met' if v else 'MISSED'}" for k, v in targets.items()))
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": describe(),
        "policy": "compiled" if is_compiled() else "interpreted",
        "rows": rows,
        "jobs_sweep": sweep,
        "peak_traced_mib": peak,
        "peak_rss_mib": rss,
        "targets": {} if args.quick else targets,
        "ten_x": scale,
        "quick": args.quick,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
