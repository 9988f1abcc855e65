"""Billing: allocation events metered per second, and a month's cost report for 100 teams and
100,000 jobs.

Run: ``.venv/bin/python -m bench.billing`` (a few minutes; ``--quick``: fewer of each).
Prints what it measures and writes ``bench/results/billing.json``.

Everything is real and on loopback: an embedded PostgreSQL (``deploy.local.postgres``; fsync
and synchronous commit on) and a NATS server with JetStream.

1. **Metering**: ``--allocations`` allocations (5,000), each an ``allocation.granted`` and an
   ``allocation.released`` (10,000 events), published with up to 32 JetStream publishes in
   flight, consumed by billing's real consumer (``Bus.consume_batches``: batches of up to 64,
   the inbox, the handlers: the bill, the ledger charge, its hour/day/month rollups and the
   ``cost.recorded`` in the outbox, one transaction per batch), its outbox relay running.
   Measured: from the first publish until every release is billed (polled every 50 ms).
2. **Report**: a ledger of ``--jobs`` jobs (100,000) of ``--teams`` teams (100) in November
   2026 (5 users, 3 projects, one queue per team, 3 flavors; 10 minutes to 12 hours each,
   some straddling the month's end), written with billing's own ``ledger_repository.append``
   (the entries and their rollups, 1,000 entries per transaction). Then, in process through
   billing's HTTP app (guard, parameter checks, JSON): ``GET /v1/costs`` for the month, by
   team; by team and flavor; by team per day; one team's (as that team's user would ask) by
   user and project; and, from the ledger instead of the rollups, one team by job. p50/p99
   of ``--requests`` (200) of each after 20 of warm-up, ``VACUUM ANALYZE`` first (what
   autovacuum soon does). For the choice of rollups: the same month-by-team figure summed
   from the ledger on read (one SQL query, an index on time), timed alike.

Target (issue 14): a month's cost report for 100 teams x 100,000 jobs in < 200 ms (p99).
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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from bench.submission import machine as machine_info
from trainyard_platform.deploy.local.nats import NatsServer
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.services.billing import ledger_repository
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.domain import PriceBook, Usage
from trainyard_platform.services.billing.handlers import SUBJECTS, BillingHandlers
from trainyard_platform.services.billing.ledger import Attribution, LedgerEntry
from trainyard_platform.services.billing.service import MIGRATIONS, NAME, seed_prices
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import AllocationGranted, AllocationReleased, JobSpec
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.inbox import idempotent
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

RESULTS = Path(__file__).parent / "results" / "billing.json"
TARGET_REPORT_P99_MS = 200.0
IN_FLIGHT = 32
TOKEN = "bench-operator-token"
NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
FLAVORS = ("a100", "h100", "cpu")
PRICES = {"a100": 2.50, "h100": 4.00, "cpu": 0.10}


def events(count: int) -> list[Envelope[Payload]]:
    """``count`` grants and their releases, in the order the scheduler's outbox sends them."""
    rng = random.Random(1)
    out: list[Envelope[Payload]] = []
    for i in range(count):
        team, flavor = f"team-{i % 100:03d}", FLAVORS[i % 3]
        start = NOVEMBER + timedelta(seconds=rng.randrange(29 * 86_400))
        spec = JobSpec(
            name="bench", team=team, user=f"u{i % 5}", gpus=4, gpu_flavor=flavor, seed=1,
            max_runtime_seconds=86_400, project=f"p{i % 3}",
        )  # fmt: skip
        grant: Payload = AllocationGranted(
            allocation_id=f"a{i}", job_id=f"j{i}", node_id=f"n{i % 50}", gpu_indices=[0, 1, 2, 3],
            epoch=i + 1, attempt=1, granted_at=start, spec=spec, queue=f"q-{team}",
        )  # fmt: skip
        released: Payload = AllocationReleased(
            allocation_id=f"a{i}", job_id=f"j{i}", node_id=f"n{i % 50}", team=team,
            user=spec.user, gpu_flavor=flavor, gpus=4, granted_at=start,
            released_at=start + timedelta(seconds=rng.randrange(600, 43_200)), outcome="succeeded",
        )  # fmt: skip
        out.append(Envelope.wrap(grant, source=owner(grant), subject=f"n{i % 50}"))
        out.append(Envelope.wrap(released, source=owner(released), subject=f"j{i}"))
    return out


async def metering(nats_url: str, dsn: str, count: int) -> dict[str, Any]:
    sent = events(count)
    nats = NatsSettings(url=nats_url)
    async with (
        open_pool(DatabaseSettings(url=dsn), NAME) as pool,
        Bus.connect(nats, "bench-billing") as bus,
        Bus.connect(nats, "bench-publisher") as publisher,
    ):
        await migrate(pool, NAME, MIGRATIONS)
        await seed_prices(pool, Settings(prices=PRICES, admin_token=SecretStr(TOKEN)))
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(OutboxRelay(pool, bus).run(stop)),
            asyncio.create_task(
                bus.consume_batches(NAME, SUBJECTS, idempotent(pool, NAME, BillingHandlers().dispatch), stop)
            ),
        ]  # fmt: skip
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def publish(envelope: Envelope[Payload]) -> None:
            async with gate:
                await publisher.publish(envelope)

        began = time.perf_counter()
        # Grants before releases, as the scheduler's outbox publishes them.
        for i in range(0, len(sent), 2 * IN_FLIGHT):
            await asyncio.gather(*(publish(e) for e in sent[i : i + 2 * IN_FLIGHT]))
        published = time.perf_counter() - began
        while True:
            if await pool.fetchval("SELECT count(*) FROM usage_ledger") >= count:
                break
            await asyncio.sleep(0.05)
        billed = time.perf_counter() - began
        stop.set()
        await asyncio.gather(*tasks)
        entries = await pool.fetchval("SELECT count(*) FROM ledger_entries")
        rollups = await pool.fetchval("SELECT count(*) FROM cost_rollups")
    return {
        "allocations": count,
        "events": len(sent),
        "published_s": round(published, 2),
        "billed_s": round(billed, 2),
        "events_per_s": round(len(sent) / billed),
        "allocations_per_s": round(count / billed),
        "ledger_entries": entries,
        "rollup_rows": rollups,
    }


def ledger_of(teams: int, jobs: int) -> list[LedgerEntry]:
    rng = random.Random(2)
    book = PriceBook.from_settings(PRICES, "USD")
    out = []
    for i in range(jobs):
        t = i % teams
        flavor = FLAVORS[rng.randrange(3)]
        start = NOVEMBER + timedelta(seconds=rng.randrange(30 * 86_400))
        end = start + timedelta(
            seconds=rng.randrange(600, 43_200), microseconds=rng.randrange(10**6)
        )
        released = AllocationReleased(
            allocation_id=f"a{i}", job_id=f"j{i}", node_id=f"n{i % 500}", team=f"team-{t:03d}",
            user=f"team-{t:03d}-u{rng.randrange(5)}", gpu_flavor=flavor, gpus=rng.choice([1, 2, 4, 8]),
            granted_at=start, released_at=end, outcome="succeeded",
        )  # fmt: skip
        usage = Usage.from_release(released, book.price(flavor))
        attribution = Attribution(
            project=f"p{rng.randrange(3)}", queue=f"q-{t:03d}", attempt=1, epoch=i + 1
        )
        out.append(LedgerEntry.charge(usage, attribution, revision=0))
    return out


async def fill(dsn: str, entries: list[LedgerEntry]) -> dict[str, Any]:
    async with open_pool(DatabaseSettings(url=dsn), NAME) as pool:
        await migrate(pool, NAME, MIGRATIONS)
        began = time.perf_counter()
        now = datetime.now(UTC)
        for i in range(0, len(entries), 1000):
            async with pool.acquire() as conn, conn.transaction():
                await ledger_repository.append(conn, entries[i : i + 1000], f"bench-{i}", now)
        took = time.perf_counter() - began
        await pool.execute("VACUUM ANALYZE")
        rollups = await pool.fetchval("SELECT count(*) FROM cost_rollups")
        by_unit = {
            r["granularity"]: r["n"]
            for r in await pool.fetch(
                "SELECT granularity, count(*) AS n FROM cost_rollups GROUP BY 1"
            )
        }
    return {
        "entries": len(entries),
        "written_s": round(took, 1),
        "entries_per_s": round(len(entries) / took),
        "rollup_rows": rollups,
        "rollup_rows_by_granularity": by_unit,
    }


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def reports(dsn: str, requests: int) -> dict[str, Any]:
    month = {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    cases: dict[str, dict[str, str]] = {
        "month_by_team": {**month, "group_by": "team"},
        "month_by_team_flavor": {**month, "group_by": "team,flavor"},
        "month_by_team_per_day": {**month, "group_by": "team", "granularity": "day"},
        "one_team_by_user_project": {**month, "team": "team-042", "group_by": "user,project"},
        "one_team_by_job_from_ledger": {**month, "team": "team-042", "group_by": "job"},
    }
    out: dict[str, Any] = {}
    async with open_pool(DatabaseSettings(url=dsn), NAME) as pool:
        app = create_app(pool, service_guard(SecretStr(TOKEN)), [])
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://billing") as client:
            for name, params in cases.items():
                samples = []
                for n in range(requests + 20):
                    began = time.perf_counter()
                    response = await client.get("/v1/costs", params=params, headers=headers)
                    took = time.perf_counter() - began
                    if response.status_code != 200:
                        raise RuntimeError(f"{name}: {response.status_code} {response.text}")
                    if n >= 20:
                        samples.append(took)
                body = response.json()
                out[name] = {
                    **_ms(samples),
                    "rows": len(body["rows"]),
                    "total_cost": body["totals"][0]["cost"] if body["totals"] else "0",
                    "bytes": len(response.content),
                }
        # The alternative to rollups: the month by team summed from the ledger on read.
        on_read = []
        query = (
            "SELECT team, currency, sum(gpu_seconds), sum(cost) FROM ledger_entries "
            "WHERE started_at < $2 AND ended_at > $1 GROUP BY team, currency"
        )
        for n in range(min(requests, 50) + 5):
            began = time.perf_counter()
            await pool.fetch(query, NOVEMBER, datetime(2026, 12, 1, tzinfo=UTC))
            if n >= 5:
                on_read.append(time.perf_counter() - began)
        out["ledger_on_read_month_by_team_sql_only"] = {
            **_ms(on_read),
            "note": "whole entries, not split at the month's edges: a lower bound of that design",
        }
    return out


def run(args: argparse.Namespace, base: Path, say: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with (
        NatsServer(base / "nats", log_path=base / "nats.log") as nats_server,
        PostgresServer(base / "pg") as pg,
    ):
        results["postgres_version"] = pg.psql("SHOW server_version").strip()
        say(f"1. metering {args.allocations:,} allocations through NATS into PostgreSQL")
        results["metering"] = asyncio.run(metering(nats_server.url, pg.dsn, args.allocations))
        m = results["metering"]
        say(
            f"   {m['events']:,} events billed in {m['billed_s']} s: {m['events_per_s']:,} "
            f"events/s ({m['allocations_per_s']:,} allocations/s)"
        )
        say(f"2. a ledger of {args.jobs:,} jobs of {args.teams} teams in November 2026")
        entries = ledger_of(args.teams, args.jobs)
        dsn = pg.create_database("report")
        results["ledger"] = asyncio.run(fill(dsn, entries))
        say(f"   {results['ledger']}")
        results["reports"] = asyncio.run(reports(dsn, args.requests))
        for name, r in results["reports"].items():
            say(f"   {name:<40} p50 {r['p50_ms']:>7.2f} ms  p99 {r['p99_ms']:>7.2f} ms")
    p99 = results["reports"]["month_by_team"]["p99_ms"]
    results["target"] = {
        "month_report_p99_ms": TARGET_REPORT_P99_MS,
        "met": p99 < TARGET_REPORT_P99_MS,
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--allocations", type=int, default=5000)
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="1,000 allocations, 20,000 jobs")
    args = parser.parse_args(argv)
    if args.quick:
        args.allocations, args.jobs, args.requests = 1000, 20_000, 50
    with tempfile.TemporaryDirectory(prefix="bench-billing-") as tmp:
        results = run(args, Path(tmp), print)
    record = {
        "benchmark": "billing",
        "command": "python -m bench.billing" + (" --quick" if args.quick else ""),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            **{k: v for k, v in machine_info().items() if k not in ("event_loop", "uvicorn_http")},
            "http": "billing's app in process (httpx ASGI transport): no socket, no server",
        },
        "settings": vars(args),
        **results,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(RESULTS.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
