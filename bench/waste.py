"""Billing's waste report: the time to answer ``GET /v1/waste`` for a month of many jobs.

Run: ``.venv/bin/python -m bench.waste`` (``--quick``: 10,000 jobs). Prints what it measures
and writes ``bench/results/waste.json``.

An embedded PostgreSQL (``deploy.local.postgres``) with billing's migrations holds the facts
of ``--jobs`` jobs (100,000) of ``--teams`` teams (100) in November 2026, written straight
into billing's tables with ``COPY`` (what the consumer writes from events, without the
events): each job submitted, waiting 0 to 30 minutes, granted (one allocation; one in five
fails, is checkpointed half-way and runs a second attempt after a wait), 10 minutes to 6
hours on 1 to 8 GPUs of 3 flavors, a priority class (a fifth low, a tenth high), its end;
half the allocations with a utilisation and data-wait measurement; its bill in
``usage_ledger`` (the ledger's entries and rollups are left empty: figure 6 reads the
rollups like ``/v1/costs`` does, measured by ``bench.billing``). Then, in process through
billing's HTTP app (guard, parameter checks, JSON): ``GET /v1/waste`` for the month by team
(operator), by team and queue, and one team's by user; p50/max of ``--requests`` (10) each
after 2 of warm-up, ``VACUUM ANALYZE`` first.

After the ``COPY`` the waste rollups are rebuilt from those facts
(``waste_rollups.rebuild_all``, timed), as the consumer would have kept them. The report
reads the six allocation figures from them and still computes queueing and low-priority
holding in Python from every fact of the month (each job's waits need all its allocations;
holding needs every team's waits), so its time still grows with the month's jobs. When
``bench/results/waste.json`` holds an earlier full run, it is kept under ``before`` and
``totals_as_before`` says whether every figure's month total is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from pydantic import SecretStr

from bench.submission import machine as machine_info
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.services.billing import waste_rollups as rollups
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.service import MIGRATIONS, NAME, seed_prices
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.settings import DatabaseSettings

RESULTS = Path(__file__).parent / "results" / "waste.json"
TOKEN = "bench-operator-token"
NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
FLAVORS = ("a100", "h100", "cpu")
PRICES = {"a100": 2.50, "h100": 4.00, "cpu": 0.10}
COLUMNS = {
    "waste_jobs": [
        "job_id", "team", "project", "user_name", "gpu_flavor", "gpus", "priority",
        "submitted_at", "recorded_at",
    ],
    "announced_allocations": [
        "allocation_id", "job_id", "node_id", "team", "user_name", "gpu_flavor", "gpus",
        "granted_at", "event_id", "recorded_at", "project", "queue", "attempt", "epoch",
    ],
    "usage_ledger": [
        "allocation_id", "job_id", "team", "user_name", "node_id", "gpu_flavor", "gpus",
        "started_at", "ended_at", "outcome", "gpu_seconds", "price_per_gpu_hour", "currency",
        "cost", "event_id", "recorded_at",
    ],
    "waste_grants": ["allocation_id", "job_id", "priority", "recorded_at"],
    "waste_run_reports": [
        "allocation_id", "job_id", "node_id", "epoch", "gpu_utilization_mean",
        "data_wait_fraction_mean", "finished_at", "recorded_at",
    ],
    "waste_checkpoints": ["job_id", "allocation_id", "saved_at", "epoch"],
    "waste_job_ends": ["job_id", "outcome", "ended_at", "recorded_at"],
}  # fmt: skip


def facts(teams: int, jobs: int, seed: int = 14) -> dict[str, list[tuple[Any, ...]]]:
    rng = random.Random(seed)
    out: dict[str, list[tuple[Any, ...]]] = {
        "waste_jobs": [],
        "announced_allocations": [],
        "usage_ledger": [],
        "waste_grants": [],
        "waste_run_reports": [],
        "waste_checkpoints": [],
        "waste_job_ends": [],
    }
    now = datetime.now(UTC)
    for n in range(jobs):
        team = f"team-{n % teams:03d}"
        user = f"user-{rng.randrange(5)}"
        project = f"project-{rng.randrange(3)}"
        flavor = rng.choice(FLAVORS)
        gpus = rng.choice((1, 2, 4, 8))
        roll = rng.random()
        priority = "low" if roll < 0.2 else "high" if roll > 0.9 else "normal"
        job = f"job-{n:06d}"
        submitted = NOVEMBER + timedelta(seconds=rng.randrange(29 * 86400))
        out["waste_jobs"].append((job, team, project, user, flavor, gpus, priority, submitted, now))
        at = submitted
        attempts = 2 if rng.random() < 0.2 else 1
        for attempt in range(1, attempts + 1):
            granted = at + timedelta(seconds=rng.randrange(1800))
            ended = granted + timedelta(seconds=rng.randrange(600, 6 * 3600))
            outcome = "failed" if attempt < attempts else "succeeded"
            allocation = f"{job}-{attempt}"
            out["announced_allocations"].append(
                (allocation, job, "node-1", team, user, flavor, gpus, granted, "e", now,
                 project, f"{team}-q", attempt, attempt)
            )  # fmt: skip
            secs = gpus * (ended - granted).total_seconds()
            price = PRICES[flavor]
            out["usage_ledger"].append(
                (allocation, job, team, user, "node-1", flavor, gpus, granted, ended, outcome,
                 secs, price, "USD", round(secs * price / 3600, 6), "e", now)
            )  # fmt: skip
            out["waste_grants"].append((allocation, job, priority, now))
            if rng.random() < 0.5:
                out["waste_run_reports"].append(
                    (
                        allocation,
                        job,
                        "node-1",
                        attempt,
                        rng.uniform(0, 100),
                        rng.uniform(0, 0.5),
                        ended,
                        now,
                    )
                )
            if outcome == "failed":
                out["waste_checkpoints"].append(
                    (job, allocation, granted + (ended - granted) / 2, attempt)
                )
            at = ended
        out["waste_job_ends"].append((job, "succeeded", at, now))
    return out


async def fill(dsn: str, teams: int, jobs: int) -> dict[str, Any]:
    tables = facts(teams, jobs)
    async with open_pool(DatabaseSettings(url=dsn), NAME) as pool:
        await migrate(pool, NAME, MIGRATIONS)
        await seed_prices(
            pool, Settings(prices=PRICES, currency="USD", admin_token=SecretStr(TOKEN))
        )
        began = time.perf_counter()
        async with pool.acquire() as conn:
            conn_: asyncpg.Connection = conn
            for table, rows in tables.items():
                await conn_.copy_records_to_table(table, records=rows, columns=COLUMNS[table])
        took = time.perf_counter() - began
        began = time.perf_counter()
        async with pool.acquire() as conn, conn.transaction():
            released = await rollups.rebuild_all(conn)
        rebuilt = time.perf_counter() - began
        await pool.execute("VACUUM ANALYZE")
        parts = await pool.fetchval("SELECT count(*) FROM waste_allocation_parts")
        hourly = await pool.fetchval("SELECT count(*) FROM waste_rollups_hourly")
    return {
        "rows": {t: len(r) for t, r in tables.items()},
        "written_s": round(took, 1),
        "rollups": {
            "released_allocations": released,
            "parts": parts,
            "hourly_rows": hourly,
            "rebuilt_s": round(rebuilt, 1),
        },
    }


def _ms(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
    }


async def reports(dsn: str, requests: int) -> dict[str, Any]:
    month = {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    cases: dict[str, dict[str, str]] = {
        "month_by_team": {**month, "group_by": "team"},
        "month_by_team_queue": {**month, "group_by": "team,queue"},
        "one_team_by_user": {**month, "team": "team-042", "group_by": "user"},
    }
    out: dict[str, Any] = {}
    async with open_pool(DatabaseSettings(url=dsn), NAME) as pool:
        app = create_app(pool, service_guard(SecretStr(TOKEN)), [])
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://billing", timeout=600
        ) as client:
            for name, params in cases.items():
                samples = []
                for n in range(requests + 2):
                    began = time.perf_counter()
                    response = await client.get("/v1/waste", params=params, headers=headers)
                    took = time.perf_counter() - began
                    if response.status_code != 200:
                        raise RuntimeError(f"{name}: {response.status_code} {response.text}")
                    if n >= 2:
                        samples.append(took)
                body = response.json()
                out[name] = {
                    **_ms(samples),
                    "rows": len(body["rows"]),
                    "totals": {t["figure"]: t["cost"] for t in body["totals"]},
                    "success_rows": len(body["success"]),
                }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, 5 requests")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.requests = 10_000, 5
    with (
        tempfile.TemporaryDirectory(prefix="bench-waste-") as tmp,
        PostgresServer(Path(tmp) / "pg") as pg,
    ):
        dsn = pg.create_database("waste")
        print(f"facts of {args.jobs:,} jobs of {args.teams} teams in November 2026")
        filled = asyncio.run(fill(dsn, args.teams, args.jobs))
        print(f"   {filled}")
        measured = asyncio.run(reports(dsn, args.requests))
        for name, r in measured.items():
            print(f"   {name:<24} p50 {r['p50_ms']:>9.1f} ms  max {r['max_ms']:>9.1f} ms")
        version = pg.psql("SHOW server_version").strip()
    record: dict[str, Any] = {
        "benchmark": "waste",
        "command": "python -m bench.waste" + (" --quick" if args.quick else ""),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            **{k: v for k, v in machine_info().items() if k not in ("event_loop", "uvicorn_http")},
            "http": "billing's app in process (httpx ASGI transport): no socket, no server",
        },
        "postgres_version": version,
        "settings": vars(args),
        "facts": filled,
        "reports": measured,
    }
    if RESULTS.exists() and not args.quick:
        earlier = json.loads(RESULTS.read_text())
        before = earlier.get("before", earlier)
        record["before"] = {
            "date": before["date"],
            "reports": before["reports"],
        }
        record["totals_as_before"] = all(
            measured[n]["totals"] == before["reports"][n]["totals"] for n in measured
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(RESULTS.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
