"""Experiment tracking: metric points per second end to end through NATS into the registry's
PostgreSQL, and a 100,000-point curve served downsampled.

Run: ``.venv/bin/python -m bench.tracking`` (about 2 minutes; ``--quick`` about 1). Prints
what it measures and writes ``bench/results/tracking.json``.

Everything is real and on loopback: an embedded PostgreSQL (``deploy.local.postgres``; fsync
and synchronous commit on) and a NATS server with JetStream, and the registry as deployed
(``python -m trainyard_platform.services.registry``: its consumer fetching batches of up to 64 events, the inbox,
one transaction per batch, ``COPY`` of the points).

1. **Ingest**: ``--jobs`` jobs (20) each report ``--keys`` metrics (5) for ``--steps`` steps
   (6,000), plus one job with a 100,000-point ``loss``: 700,000 points. Each job's
   ``job.started`` goes first, then its points in ``job.metrics`` events of 2,000 points
   (what a runner sends when a job reports fast: ``MetricBatcher``), the jobs' batches
   interleaved as several runners' would be, published by this process with up to 32
   JetStream publishes in flight. The events are built and serialized before the clock
   starts (that is the runners' work, measured apart in 3). Measured: from the first publish
   until the registry's summaries count every point (polled every 50 ms), and the CPU of the
   registry, PostgreSQL and NATS meanwhile. Every point is then counted in ``metric_points``.
2. **Curve**: ``GET /v1/jobs/{job}/metrics/loss`` of the 100,000-point job (default
   ``max_points`` 1,000, downsampled in SQL), one client, ``--requests`` times (300) after 20
   of warm-up; p50/p99 of the whole HTTP exchange; and the same for a range of 20,000 steps
   (``from_step``/``to_step``), and for ``max_points=10000``; then once more after ``VACUUM
   ANALYZE`` (what autovacuum soon does); and PostgreSQL's ``EXPLAIN ANALYZE`` of the query
   of the curve's blocks (``metric_blocks``: the extremes of every 64 steps, kept at ingest).
3. **Runner side**: points per second one core turns from control messages into serialized
   ``job.metrics`` events (``domain.metric_points``, ``MetricBatcher``, envelope JSON).

Targets (issue 12): ingest >= 50,000 points/s on this 2-core machine; the 100,000-point curve
downsampled in < 100 ms (p99).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.submission import REPO, _child_env, _cpu_of, _machine_busy, _postgres_cpu, _wait_http
from bench.submission import machine as machine_info
from trainyard_platform.deploy.local.nats import NatsServer
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.deploy.local.processes import ManagedProcess
from trainyard_platform.services.registry.metric_curves import BLOCKS_QUERY
from trainyard_platform.services.registry.metrics import BLOCK_STEPS
from trainyard_platform.services.runner import domain
from trainyard_platform.services.runner.domain import JobIdentity, MetricBatcher
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.control import MetricsMessage
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    Environment,
    JobMetrics,
    JobSpec,
    JobStarted,
    MetricPoint,
    Payload,
)
from trainyard_platform.shared.events.trust import routing_key_of
from trainyard_platform.shared.settings import NatsSettings

RESULTS = Path(__file__).parent / "results" / "tracking.json"
TARGET_POINTS_PER_S = 50_000
TARGET_CURVE_P99_MS = 100.0
CURVE_POINTS = 100_000
BATCH = 2000
IN_FLIGHT = 32
ADMIN_TOKEN = "bench-operator-token"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENV = Environment(
    python="CPython 3.11", torch="2.5.0", platform="Linux", hostname="bench", node_id="node-1",
    gpu_flavor="cpu",
)  # fmt: skip


def spec(i: int) -> JobSpec:
    return JobSpec(
        name="bench-sweep",
        team="bench",
        user="alice",
        entrypoint="train.py",
        gpus=1,
        gpu_flavor="cpu",
        hyperparameters={"lr": 0.001 * (i + 1), "batch_size": 64},
        seed=i,
        max_runtime_seconds=3600,
        project="bench",
        experiment="sweep",
    )


def started(job_id: str, i: int) -> JobStarted:
    return JobStarted(
        job_id=job_id, allocation_id=f"a-{job_id}", node_id="node-1", attempt=0, epoch=1,
        started_at=T0, code_version="sha256:" + "0" * 64, environment=ENV, spec=spec(i),
    )  # fmt: skip


def value(key: int, step: int) -> float:
    if step % 9973 == 0 and key == 0:
        return math.nan  # a few NaN, as a diverging run reports
    return math.exp(-step / 3000) * (1 + 0.1 * math.sin(step / 7 + key))


def job_batches(job_id: str, keys: int, steps: int) -> list[JobMetrics]:
    names = ["loss", "accuracy", "lr", "grad_norm", "throughput", "val_loss", "val_acc"][:keys]
    names += [f"metric_{k}" for k in range(len(names), keys)]
    points = [
        MetricPoint(key=names[k], step=s, time=T0 + timedelta(seconds=s), value=value(k, s))
        for s in range(steps)
        for k in range(keys)
    ]
    return [
        JobMetrics(
            job_id=job_id,
            allocation_id=f"a-{job_id}",
            node_id="node-1",
            seq=n,
            points=points[i : i + BATCH],
        )
        for n, i in enumerate(range(0, len(points), BATCH))
    ]


def workload(jobs: int, keys: int, steps: int) -> tuple[list[Payload], int, str]:
    """Every event in publishing order, the number of points, and the curve job's id."""
    curve_job = f"curve-{uuid.uuid4().hex[:8]}"
    ids = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(jobs)]
    per_job = [job_batches(j, keys, steps) for j in ids] + [job_batches(curve_job, 1, CURVE_POINTS)]
    events: list[Payload] = [started(j, i) for i, j in enumerate([*ids, curve_job])]
    for n in range(max(len(b) for b in per_job)):
        events += [b[n] for b in per_job if n < len(b)]
    total = sum(len(e.points) for e in events if isinstance(e, JobMetrics))
    return events, total, curve_job


# --- servers --------------------------------------------------------------------------------


def start_registry(base: Path, dsn: str, nats_url: str) -> tuple[ManagedProcess, int]:
    port = free_port()
    env = _child_env(
        {
            "TRAINYARD_NATS_URL": nats_url,
            "TRAINYARD_DATABASE_URL": dsn,
            "TRAINYARD_STORAGE_URI": (base / "objects").as_uri(),
            "TRAINYARD_REGISTRY_PORT": str(port),
            "TRAINYARD_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        }
    )
    process = ManagedProcess(
        "registry",
        [sys.executable, "-m", "trainyard_platform.services.registry"],
        env=env,
        log_path=base / "logs" / "registry.log",
        cwd=REPO,
    )
    process.start()
    _wait_http(f"http://127.0.0.1:{port}/readyz", process)
    return process, port


def cpu_sample(pgdata: Path, pids: dict[str, int]) -> dict[str, float]:
    sample = {name: _cpu_of(pid) for name, pid in pids.items()}
    sample["postgres"] = _postgres_cpu(pgdata)
    sample["machine"] = _machine_busy()
    sample["wall"] = time.monotonic()
    return sample


def cpu_use(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    wall = after["wall"] - before["wall"]
    use = {k: round((after[k] - before[k]) / wall, 2) for k in before if k != "wall"}
    use["machine_busy_cores"] = use.pop("machine")
    return use


# --- 1. ingest ------------------------------------------------------------------------------


async def stored_points(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT coalesce(sum(count), 0) FROM registry.metric_series"))


async def ingest(
    nats_url: str, dsn: str, events: list[Payload], total: int, pgdata: Path, pids: dict[str, int]
) -> dict[str, Any]:
    bodies = [
        Envelope.wrap(e, source="trainyard/runner", subject=routing_key_of(e)) for e in events
    ]
    raw = [(b.nats_subject, b.to_json(), b.id) for b in bodies]
    size = sum(len(r[1]) for r in raw)
    conn = await asyncpg.connect(dsn)
    async with Bus.connect(NatsSettings(url=nats_url), "bench-publisher") as bus:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def send(subject: str, body: bytes, event_id: str) -> None:
            async with gate:
                await bus.publish_raw(subject, body, event_id, {})

        before = cpu_sample(pgdata, pids)
        t0 = time.monotonic()
        # job.started first, all acknowledged, so that each job's spec is there for its goals.
        starts = sum(1 for e in events if isinstance(e, JobStarted))
        await asyncio.gather(*(send(*r) for r in raw[:starts]))
        await asyncio.gather(*(send(*r) for r in raw[starts:]))
        published = time.monotonic() - t0
        stored = 0
        while stored < total:
            await asyncio.sleep(0.05)
            stored = await stored_points(conn)
        elapsed = time.monotonic() - t0
        after = cpu_sample(pgdata, pids)
        rows = int(await conn.fetchval("SELECT count(*) FROM registry.metric_points"))
    await conn.close()
    return {
        "points": total,
        "events": len(events),
        "bytes_published": size,
        "published_s": round(published, 2),
        "stored_s": round(elapsed, 2),
        "points_per_s": round(total / elapsed),
        # The registry's own rate per CPU second: what a core of its own would give, less
        # sensitive to how much of the shared machine the neighbours took.
        "points_per_registry_cpu_s": round(
            total / max(1e-9, (after["registry"] - before["registry"]))
        ),
        "rows_in_metric_points": rows,
        "cpu_cores": cpu_use(before, after),
    }


# --- 2. curve -------------------------------------------------------------------------------


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def latencies(client: httpx.AsyncClient, path: str, requests: int) -> dict[str, Any]:
    for _ in range(20):
        (await client.get(path)).raise_for_status()
    times: list[float] = []
    body: dict[str, Any] = {}
    for _ in range(requests):
        t = time.perf_counter()
        response = await client.get(path)
        times.append((time.perf_counter() - t) * 1000)
        response.raise_for_status()
        body = response.json()
    return {
        "path": path,
        "requests": requests,
        "p50_ms": round(statistics.median(times), 1),
        "p99_ms": round(_pct(times, 0.99), 1),
        "max_ms": round(max(times), 1),
        "total": body["total"],
        "points_returned": len(body["points"]),
        "downsampled": body["downsampled"],
        "response_bytes": len(json.dumps(body)),
    }


async def curve(port: int, dsn: str, job: str, requests: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30
    ) as client:
        out: dict[str, Any] = {
            "default": await latencies(client, f"/v1/jobs/{job}/metrics/loss", requests),
            "range_20k_steps": await latencies(
                client, f"/v1/jobs/{job}/metrics/loss?from_step=40000&to_step=59999", requests
            ),
            "max_points_10000": await latencies(
                client, f"/v1/jobs/{job}/metrics/loss?max_points=10000", max(requests // 3, 20)
            ),
        }
        # Right after the ingest the index's pages are not all-visible yet (the scan visits
        # the heap too); autovacuum sets them soon after. Measured again as it then is.
        conn = await asyncpg.connect(dsn)
        await conn.execute("VACUUM ANALYZE registry.metric_points")
        await conn.close()
        out["default_after_vacuum"] = await latencies(
            client, f"/v1/jobs/{job}/metrics/loss", requests
        )
    conn = await asyncpg.connect(dsn)
    try:
        series_id = await conn.fetchval(
            "SELECT id FROM registry.metric_series WHERE job_id = $1 AND key = 'loss'", job
        )
        await conn.execute("SET search_path = registry")
        last_block = (CURVE_POINTS - 1) // BLOCK_STEPS
        plan = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) "
            + BLOCKS_QUERY.replace("$1", str(series_id))
            .replace("$2", "0")
            .replace("$3", str(last_block))
        )
    finally:
        await conn.close()
    out["explain_blocks"] = [r[0] for r in plan]
    return out


# --- 3. runner side -------------------------------------------------------------------------


def runner_side(points: int = 200_000) -> dict[str, Any]:
    job = JobIdentity("job-1", "alloc-1", "node-1", epoch=1, attempt=0)
    batcher = MetricBatcher()
    keys = 5
    messages = [
        MetricsMessage(step=s, metrics={f"k{k}": value(k, s) for k in range(keys)})
        for s in range(points // keys)
    ]
    t = time.process_time()
    size = 0
    now = datetime.now(UTC)
    for m in messages:
        batch, _ = domain.metric_points(m, now)
        for seq, pts in batcher.add(batch, 0.0):
            event = domain.metrics_event(job, seq, pts)
            size += len(Envelope.wrap(event, source=domain.SOURCE, subject="job-1").to_json())
    cpu = time.process_time() - t
    return {"points": points, "cpu_s": round(cpu, 2), "points_per_cpu_s": round(points / cpu)}


# --- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace, base: Path, say: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    events, total, curve_job = workload(args.jobs, args.keys, args.steps)
    say(f"workload: {len(events):,} events, {total:,} points (built before the clock)")
    with (
        NatsServer(base / "nats", log_path=base / "logs" / "nats.log") as nats_server,
        PostgresServer(base / "pg") as pg,
    ):
        results["postgres_version"] = pg.psql("SHOW server_version").strip()
        registry, port = start_registry(base, pg.dsn, nats_server.url)
        assert registry.pid is not None and nats_server.pid is not None
        pids = {"registry": registry.pid, "nats": nats_server.pid}
        try:
            say("\n1. ingest through NATS into the registry's PostgreSQL")
            got = asyncio.run(ingest(nats_server.url, pg.dsn, events, total, base / "pg", pids))
            results["ingest"] = got
            say(
                f"{got['points']:,} points in {got['stored_s']} s: {got['points_per_s']:,}/s "
                f"(published in {got['published_s']} s); cores {got['cpu_cores']}; "
                f"{got['points_per_registry_cpu_s']:,} per CPU second of the registry"
            )
            say("\n2. a 100,000-point curve, downsampled (GET, one client)")
            results["curve"] = asyncio.run(curve(port, pg.dsn, curve_job, args.requests))
            for name, r in results["curve"].items():
                if name.startswith("explain"):
                    continue
                say(
                    f"{name:<18} p50 {r['p50_ms']:>6.1f} ms  p99 {r['p99_ms']:>6.1f} ms  "
                    f"{r['points_returned']} of {r['total']:,} points, {r['response_bytes']:,} B"
                )
        finally:
            registry.stop()
    say("\n3. runner side (one core)")
    results["runner_side"] = runner_side()
    say(f"{results['runner_side']['points_per_cpu_s']:,} points per CPU second")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracking", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 jobs, 100 requests")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.requests = 5, 100
    started_at = time.monotonic()
    load_before = os.getloadavg()
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)  # PostgreSQL runs as its own user when we are root
        results = run(args, base, lambda s: print(s, flush=True))
    curve_p99 = results["curve"]["default"]["p99_ms"]
    vacuumed = results["curve"]["default_after_vacuum"]
    rate = results["ingest"]["points_per_s"]
    summary = {
        "ingest_points_per_s": rate,
        "ingest_target_met": rate >= TARGET_POINTS_PER_S,
        "ingest_points_per_registry_cpu_s": results["ingest"]["points_per_registry_cpu_s"],
        "curve_100k_p50_ms": results["curve"]["default"]["p50_ms"],
        "curve_100k_p99_ms": curve_p99,
        "curve_100k_after_vacuum_p50_ms": vacuumed["p50_ms"],
        "curve_100k_after_vacuum_p99_ms": vacuumed["p99_ms"],
        "curve_target_met": curve_p99 < TARGET_CURVE_P99_MS,
    }
    machine = machine_info()
    machine.pop("uvicorn_http", None)
    document = {
        "date": date,
        "mode": "quick" if args.quick else "full",
        "command": "python -m bench.tracking" + (" --quick" if args.quick else ""),
        "duration_s": round(time.monotonic() - started_at, 1),
        "machine": machine
        | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "config": {
            "jobs": args.jobs,
            "keys": args.keys,
            "steps": args.steps,
            "curve_points": CURVE_POINTS,
            "batch_points": BATCH,
            "publishes_in_flight": IN_FLIGHT,
            "requests": args.requests,
        },
        "targets": {"points_per_s": TARGET_POINTS_PER_S, "curve_p99_ms": TARGET_CURVE_P99_MS},
        "summary": summary,
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"\nsummary: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
