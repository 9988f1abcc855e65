"""The chaos suite: load with faults, then every invariant checked from the stores.

Run: ``.venv/bin/python -m bench.chaos --seed 7 --minutes 30`` (the soak; ``--short`` is the
CI version: one round of every fault with 1-3 s outages, about 3 minutes). Prints the
results table and, with ``--record``, stores the run in ``bench/results/chaos.json`` (one
entry per scenario, replacing the same scenario's last run).

What a run does (modelled on NATS's own chaos tests, Determined's end-to-end fault tests and
Jepsen's NATS analysis):

1. The whole platform as local processes (``bench._chaos_platform``): NATS, PostgreSQL, the
   four database services and ``--runners`` runner nodes with virtual GPUs, every NATS
   connection through a proxy of its own.
2. Load (``bench._chaos_load``): small jobs from three teams over the HTTP API at
   ``--jobs-per-minute`` (most a ``sleep`` of a second or less; some save a checkpoint, some
   fail, some are cancelled), each POST retried with its Idempotency-Key while the platform
   cannot answer.
3. Faults (``bench._chaos_faults``), one at a time, in rounds that each hold every kind once
   in a seeded order: SIGKILL and restart of each service, a runner, NATS and PostgreSQL
   (outages ``--outage-min``..``--outage-max`` s), PostgreSQL SIGSTOPped for such an
   outage, a runner SIGSTOPped past the node timeout, a service or runner cut off NATS for a few seconds, and the JetStream store deleted. After
   each, the time until every process is ready and until a probe job submitted at the
   fault's end has ended with its cost is the recovery time.
4. Poison: three messages the suite makes poisonous (unparseable, refused, forged) are
   published at the start and after each loss of the JetStream store.
5. The load stops with the faults; the platform gets ``--settle`` s to finish every job,
   then ``bench._chaos_check`` checks every invariant from PostgreSQL, the streams and the
   object store.

What it does not cover: a kill -9 keeps the operating system's page cache, so it is no power
loss; NATS runs with its default fsync (every 2 minutes, as Jepsen found, acknowledged writes
may be lost by a power failure), and a single NATS server, no cluster (no leader elections,
no partitions between servers); PostgreSQL is one server (no fail-over); the object store is
a local folder (not faulted); partitions are resets (closed connections), not black holes;
clocks are one machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._chaos_check import Finding, Report, check
from bench._chaos_faults import KINDS, Fault, inject, poison, schedule
from bench._chaos_load import PROBE_TEAM, TEAMS, Load
from bench._chaos_platform import ChaosPlatform, NotReadyError, PlatformConfig
from bench._host import describe

RESULTS = Path(__file__).parent / "results" / "chaos.json"
SETTLING = frozenset(
    {
        "lost",  # a job the scheduler has not consumed yet, until the deadline
        "not_terminal",
        "outbox_stuck",
        "views_disagreeing",
        "billing_difference",
        "checkpoints",
        "stream_missing",
        "poison_not_dead_lettered",
    }
)
"""Findings that may still be on their way to 0 while the platform catches up."""


@dataclass
class ChaosOptions:
    seed: int = 1
    minutes: float | None = 10.0
    """How long load and faults go on; None: exactly ``rounds`` rounds of faults."""
    rounds: int | None = None
    jobs_per_minute: float = 60.0
    runners: int = 3
    outage_s: tuple[float, float] = (1.0, 60.0)
    cut_s: tuple[float, float] = (2.0, 8.0)
    gap_s: tuple[float, float] = (2.0, 20.0)
    settle_s: float = 300.0
    scenario: str = "soak"
    data_dir: Path | None = None
    keep: bool = False
    platform: PlatformConfig = field(default_factory=PlatformConfig)


@dataclass
class ChaosResult:
    options: ChaosOptions
    report: Report
    faults: list[Fault]
    load: Load
    baseline_probe_s: list[float]
    started: str
    wall_s: float
    settle_s: float

    @property
    def ok(self) -> bool:
        return not self.report.failed and all(f.recovered_s is not None for f in self.faults)

    def summary(self) -> dict[str, Any]:
        f = self.report.findings
        return {
            "scenario": self.options.scenario,
            "faults_injected": len(self.faults),
            "jobs_submitted": len(self.load.accepted.jobs),
            "terminal": self.report.facts.get("terminal", 0),
            "lost": f["lost"].count,
            "duplicated": f["duplicated"].count,
            "double_allocations": f["double_allocations"].count,
            "billing_difference": f["billing_difference"].count,
            "billing_difference_gpu_seconds": self.report.facts.get(
                "billing_difference_gpu_seconds"
            ),
            "views_disagreeing": f["views_disagreeing"].count,
            "not_terminal": f["not_terminal"].count,
            "outbox_stuck": f["outbox_stuck"].count,
            "checkpoints": f["checkpoints"].count,
            "stream_missing": f["stream_missing"].count,
            "dead_letters_unexpected": f["dead_letters_unexpected"].count,
            "poison_not_dead_lettered": f["poison_not_dead_lettered"].count,
            "unexpected_exits": f["unexpected_exits"].count,
        }

    def recovery(self) -> dict[str, dict[str, Any]]:
        by_kind: dict[str, list[Fault]] = defaultdict(list)
        for fault in self.faults:
            by_kind[fault.kind].append(fault)
        table = {}
        for kind in sorted(by_kind, key=lambda k: KINDS.index(k) if k in KINDS else 99):
            done = [f.recovered_s for f in by_kind[kind] if f.recovered_s is not None]
            ready = [f.ready_s for f in by_kind[kind] if f.ready_s is not None]
            outages = [f.outage_s for f in by_kind[kind]]
            table[kind] = {
                "count": len(by_kind[kind]),
                "not_recovered": len(by_kind[kind]) - len(done),
                "outage_s": [round(min(outages), 1), round(max(outages), 1)],
                "recovered_p50_s": _round(statistics.median(done)) if done else None,
                "recovered_max_s": _round(max(done)) if done else None,
                "ready_p50_s": _round(statistics.median(ready)) if ready else None,
                "ready_max_s": _round(max(ready)) if ready else None,
            }
        return table

    def to_json(self) -> dict[str, Any]:
        outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        statuses = self.report.facts.get("final_by_kind", {})
        for kind, counts in statuses.items():
            outcomes[kind].update(counts)
        return {
            "scenario": self.options.scenario,
            "date": self.started,
            "seed": self.options.seed,
            "minutes": self.options.minutes,
            "rounds": self.options.rounds,
            "wall_s": round(self.wall_s, 1),
            "settle_s": round(self.settle_s, 1),
            "machine": describe(),
            "settings": {
                "jobs_per_minute": self.options.jobs_per_minute,
                "outage_s": list(self.options.outage_s),
                "cut_s": list(self.options.cut_s),
                "gap_s": list(self.options.gap_s),
                **self.options.platform.summary(),
            },
            "summary": self.summary(),
            "recovery": self.recovery(),
            "baseline_probe_s": [round(s, 2) for s in self.baseline_probe_s],
            "invariants": {
                name: {"count": f.count, "examples": f.examples}
                for name, f in self.report.findings.items()
            },
            "facts": self.report.facts,
            "load": {
                "submitted": self.load.counters.submitted,
                "accepted": self.load.counters.accepted,
                "retried_requests": self.load.counters.retries,
                "not_accepted": self.load.counters.refused,
                "cancels": self.load.counters.cancels,
                "errors": self.load.counters.errors,
            },
            "faults": [f.row() for f in self.faults],
        }


def _round(value: float) -> float:
    return round(value, 1)


def run_chaos(options: ChaosOptions, say: Callable[[str], None] = print) -> ChaosResult:
    """Run one scenario (module docstring) and return what it found."""
    rng = random.Random(options.seed)
    started_wall = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()

    def note(message: str) -> None:
        say(f"[{time.monotonic() - t0:7.1f}s] {message}")

    data_dir = options.data_dir or Path(tempfile.mkdtemp(prefix="trainyard-chaos-"))
    config = PlatformConfig(**{**options.platform.__dict__, "runners": options.runners})
    platform = ChaosPlatform(data_dir, config)
    stop_load = threading.Event()
    never = threading.Event()
    faults: list[Fault] = []
    poison_ids: list[str] = []
    poison_kept: list[str] = []  # published after the last loss of the JetStream store
    try:
        platform.start()
        note(f"platform up: {', '.join(platform.processes)} (data in {data_dir})")
        tokens = {team: platform.stack.bootstrap_admin(team, "chaos") for team in TEAMS}
        tokens[PROBE_TEAM] = platform.stack.bootstrap_admin(PROBE_TEAM, "chaos")
        load = Load(platform.stack.submission_url, tokens, options.seed, say=note)
        baseline = [p for p in (load.probe(never, 120) for _ in range(3)) if p is not None]
        note(f"baseline probe: {', '.join(f'{p:.1f}s' for p in baseline)}")
        poison_kept = asyncio.run(poison(platform.admin_nats_url, "start"))
        poison_ids += poison_kept
        loader = threading.Thread(
            target=load.run, args=(stop_load, options.jobs_per_minute), daemon=True
        )
        loader.start()
        rounds = options.rounds if options.rounds is not None else 1000
        planned = schedule(rng, platform, rounds, outage_s=options.outage_s, cut_s=options.cut_s)
        for fault in planned:
            elapsed = time.monotonic() - t0
            if options.minutes is not None and elapsed > options.minutes * 60:
                break
            never.wait(rng.uniform(*options.gap_s))
            fault.injected_at = time.monotonic() - t0
            note(f"fault {len(faults) + 1}: {fault.kind} ({fault.target}, {fault.outage_s:.1f}s)")
            inject(platform, fault)
            fault.ended_at = time.monotonic() - t0
            faults.append(fault)
            _time_recovery(platform, load, fault)
            note(
                f"  recovered: ready after {_s(fault.ready_s)}, probe done after "
                f"{_s(fault.recovered_s)}; {load.counters.accepted} jobs accepted"
            )
            if fault.not_ready:
                for name, answer in fault.not_ready.items():
                    note(f"  {name} not ready: {answer}; its log ends:\n{platform.log_tail(name)}")
                note("no more faults: the platform did not recover from this one")
                break
            if fault.kind == "lose JetStream":
                poison_kept = asyncio.run(poison(platform.admin_nats_url, f"f{len(faults)}"))
                poison_ids += poison_kept
        stop_load.set()
        loader.join(timeout=300)
        note(f"load stopped: {load.counters.accepted} jobs accepted; settling")
        settle_started = time.monotonic()
        report = settle(platform, load, poison_ids, poison_kept, options.settle_s, note)
        settle_s = time.monotonic() - settle_started
        report.facts["final_by_kind"] = _final_by_kind(platform, load)

        # Results are committed: the run's temporary folder is no path of the repository.
        def local(text: str) -> str:
            text = text.replace(str(platform.data_dir), "<run folder>")
            text = text.replace(str(Path(__file__).resolve().parents[1]), "<repository>")
            return text.replace(sys.base_prefix, "<python>")

        deaths = [local(d) for d in platform.deaths()]
        report.findings["unexpected_exits"] = Finding("unexpected_exits", len(deaths), deaths[:5])
        report.facts["watchdog_reports"] = [local(r) for r in platform.reports[-50:]]
        result = ChaosResult(
            options,
            report,
            faults,
            load,
            baseline,
            started_wall.isoformat(timespec="seconds"),
            time.monotonic() - t0,
            settle_s,
        )
        note("checked:\n" + report.summary())
        return result
    finally:
        stop_load.set()
        platform.stop()
        if options.keep or options.data_dir is not None:
            say(f"data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}s"


def _time_recovery(platform: ChaosPlatform, load: Load, fault: Fault) -> None:
    """From the fault's end: until every process is ready, and until a probe job submitted
    now has ended with its cost (both: recovered)."""
    probe: list[float | None] = []
    prober = threading.Thread(target=lambda: probe.append(load.probe(threading.Event(), 300)))
    prober.start()
    try:
        fault.ready_s = platform.wait_ready(timeout_s=300)
    except NotReadyError as exc:
        fault.ready_s, fault.not_ready = None, exc.answers
    prober.join()
    done = probe[0] if probe else None
    if done is not None and fault.ready_s is not None:
        fault.recovered_s = max(done, fault.ready_s)


def settle(
    platform: ChaosPlatform,
    load: Load,
    poison_ids: list[str],
    poison_kept: list[str],
    settle_s: float,
    note: Callable[[str], None],
) -> Report:
    """Check until nothing is left settling (or ``settle_s`` is over); the last report."""
    deadline = time.monotonic() + settle_s
    while True:
        report = asyncio.run(
            check(
                platform.stack.database_url,
                platform.admin_nats_url,
                platform.objects_dir,
                load.accepted,
                poison_ids,
                poison_kept=poison_kept,
            )
        )
        settling = {n: f.count for n, f in report.failed.items() if n in SETTLING}
        if not settling or time.monotonic() > deadline:
            return report
        note(f"settling: {settling}")
        time.sleep(5)


def _final_by_kind(platform: ChaosPlatform, load: Load) -> dict[str, dict[str, int]]:
    async def read() -> dict[str, str]:
        import asyncpg

        conn = await asyncpg.connect(platform.stack.database_url)
        try:
            rows = await conn.fetch(
                "SELECT id, status FROM submission.jobs WHERE id = ANY($1::text[])",
                list(load.accepted.jobs),
            )
        finally:
            await conn.close()
        return {r["id"]: r["status"] for r in rows}

    statuses = asyncio.run(read())
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for job_id, (_, kind) in load.accepted.jobs.items():
        by_kind[kind][statuses.get(job_id, "MISSING")] += 1
    return {kind: dict(counts) for kind, counts in sorted(by_kind.items())}


# --- output ---------------------------------------------------------------------------------


def table(results: list[dict[str, Any]]) -> str:
    """The results table (markdown): one row per scenario, then recovery per fault kind."""
    head = (
        "| scenario | seed | faults injected | jobs submitted | terminal | lost | duplicated "
        "| double allocations | billing difference | views disagreeing |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s = r["summary"]
        lines.append(
            f"| {s['scenario']} | {r['seed']} | {s['faults_injected']} | "
            f"{s['jobs_submitted']:,} | {s['terminal']:,} | {s['lost']} | {s['duplicated']} | "
            f"{s['double_allocations']} | {s['billing_difference']} "
            f"({s['billing_difference_gpu_seconds']} GPU-s) | {s['views_disagreeing']} |"
        )
    for r in results:
        lines += [
            "",
            f"Recovery, {r['summary']['scenario']} (seconds from the fault's end; ready: every "
            "process answers /readyz; recovered: ready, and a probe job submitted at the "
            "fault's end has ended with its cost):",
            "",
            "| fault | count | outage (s) | ready p50 | ready max | recovered p50 | recovered max |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for kind, row in r["recovery"].items():
            low, high = row["outage_s"]
            lines.append(
                f"| {kind} | {row['count']} | {low:g}-{high:g} | {row['ready_p50_s']} | "
                f"{row['ready_max_s']} | {row['recovered_p50_s']} | {row['recovered_max_s']} |"
            )
    return "\n".join(lines)


def record(result: dict[str, Any], path: Path = RESULTS) -> None:
    """Store ``result`` in ``path``, replacing the last run of the same scenario."""
    runs: list[dict[str, Any]] = []
    if path.exists():
        runs = json.loads(path.read_text()).get("runs", [])
    runs = [r for r in runs if r.get("scenario") != result["scenario"]] + [result]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs}, indent=2, default=str) + "\n")


def short_options(seed: int = 1, data_dir: Path | None = None) -> ChaosOptions:
    """The CI version: one round of every fault, 1-3 s outages, a few dozen jobs."""
    return ChaosOptions(
        seed=seed,
        minutes=None,
        rounds=1,
        jobs_per_minute=20.0,
        runners=3,
        outage_s=(1.0, 3.0),
        cut_s=(2.0, 4.0),
        gap_s=(0.5, 1.5),
        settle_s=120.0,
        scenario="short (CI)",
        data_dir=data_dir,
        platform=PlatformConfig(node_timeout_s=5.0),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--short", action="store_true", help="the CI version (about 3 min)")
    parser.add_argument("--jobs-per-minute", type=float, default=60.0)
    parser.add_argument("--runners", type=int, default=3)
    parser.add_argument("--outage-min", type=float, default=1.0)
    parser.add_argument("--outage-max", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the data folder and logs")
    parser.add_argument("--record", action="store_true", help=f"store the run in {RESULTS}")
    args = parser.parse_args(argv)
    if args.short:
        options = short_options(args.seed)
    else:
        options = ChaosOptions(
            seed=args.seed,
            minutes=args.minutes,
            jobs_per_minute=args.jobs_per_minute,
            runners=args.runners,
            outage_s=(args.outage_min, args.outage_max),
            settle_s=args.settle,
            scenario=f"soak {args.minutes:g} min",
        )
    options.keep = args.keep
    result = run_chaos(options)
    data = result.to_json()
    print()
    print(table([data]))
    if args.record:
        record(data)
        print(f"\nrecorded in {RESULTS}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
