"""Front door: accepted job submissions per second of the submission API, against a bare
Litestar + asyncpg app measured in the same run, and ``GET /v1/jobs`` over 100,000 jobs.

Run: ``.venv/bin/python -m bench.submission`` (about 4 minutes; ``--quick`` about 2). Prints
a table per measurement and writes ``bench/results/submission.json``.

Everything is real and on loopback: an embedded PostgreSQL (``deploy.local.postgres``, the
one the tests and ``dev.py up`` use; fsync and synchronous commit on, as initdb leaves them)
and a NATS server with JetStream (the service's outbox relay publishes every accepted job's
``job.submitted`` while it runs). Three kinds of process share the machine:

* **baseline**: ``python -m bench._submission_baseline``, a bare Litestar app under uvicorn
  that inserts the posted JSON into a table of the same PostgreSQL with asyncpg (one
  autocommitted ``INSERT``) and answers 201 with a ``Location``.
* **service**: ``python -m trainyard_platform.services.submission``, the real service as it is deployed
  (``ServiceRuntime``: uvicorn, tracing middleware, outbox relay, event consumer), with its
  default pool (10 connections). The clients submit as four members of one team (made
  through ``POST /v1/admin/users``; an admin's submission would also write an audit row)
  and list as a viewer. Every ``POST /v1/jobs`` is authenticated (a bearer token looked up
  in the database), its role checked, its body screened (``check_json``) and validated,
  rate limited, and stored with its history row and its outbox event in one transaction. The
  rate limits are set out of reach for the bench
  (``TRAINYARD_SUBMISSION_{WRITE,READ}_{RATE_PER_S,BURST}`` = 1,000,000): the token
  buckets are still consulted on every request, they just never say no.
* **load**: ``python -m bench._submission_load``, the generator: raw asyncio HTTP/1.1
  keep-alive connections sending prebuilt requests, in its own process. Its CPU time is
  reported next to that of the server, PostgreSQL and NATS for every run, and so is how
  busy the whole machine was (``machine_busy_cores``: other users' work shows there).

Both servers run uvicorn's ``Server`` inside ``asyncio.run`` as ``ServiceRuntime`` does, so
both use asyncio's own event loop (uvicorn's ``auto`` loop choice is not applied there, so
uvloop would not be used even if installed) and uvicorn's ``auto`` HTTP parser: httptools
when importable, else h11 (the one in use is in the results).

Measurements:

1. **Saturating throughput** (closed loop): 16 and 64 clients, each sending its next
   ``POST /v1/jobs`` as soon as the last answered; accepted (2xx) submissions per second over
   the measured window, p50/p99 latency. Baseline and service alternate.
2. **Latency at half the saturating rate** (open loop): requests arrive at a fixed rate,
   half of the best closed-loop rate of the same server, on up to 64 connections; latency
   runs from each request's due time, so queueing counts. Run as often as the closed loop;
   the target is judged on the median p99.
3. **Every accepted job is durable**: after the runs, each id the service answered 201 for
   is looked up: the job row and its ``job.submitted`` outbox row must both be there.
4. **``GET /v1/jobs``** for a team with ``--list-jobs`` (100,000) jobs, bulk-inserted with
   ``COPY`` (statuses mixed as an old team's are; a cost row per finished job): p50/p99 of
   the first page (``limit=50``), of the first page filtered by a common status
   (``SUCCEEDED``, 60%), a rare one (``RUNNING``, 1.5%) and one no job has (``PREEMPTED``),
   and of 200 pages in a row reached by following ``Link: rel="next"`` (keyset cursors),
   one client; and PostgreSQL's ``EXPLAIN ANALYZE`` of the list's query.

``--before CHECKOUT`` (a copy of the code to compare, e.g. ``git worktree add DIR REF``)
starts a third server, ``before``: that checkout's ``python -m trainyard_platform.services.submission`` on the
same database, measured in the closed-loop runs alternating with the other two, so a
change is measured before and after in one run (``ratio_before_to_baseline`` and its CPU
figures in the summary; its accepted jobs are checked for durability too).

Targets (issue 10): service >= 0.5 x baseline accepted/s; p99 < 50 ms at half the
saturating rate; ``GET /v1/jobs`` p99 < 20 ms with 100,000 jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench._host import describe
from trainyard_platform.deploy.local.nats import NatsServer
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.deploy.local.processes import ManagedProcess
from trainyard_platform.services.submission import repository

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "submission.json"
SCHEMA = "submission"
TARGET_RATIO = 0.5
SUBMITTERS = 4
"""Members of team ``BENCH_TEAM`` the clients submit as (connection i as user i mod 4)."""
TARGET_HALF_RATE_P99_MS = 50.0
TARGET_LIST_P99_MS = 20.0
UNLIMITED = "1000000"
BENCH_TEAM = "bench"
LIST_TEAM = "bench-list"
OTHER_TEAM = "bench-other"
TEAMS = (BENCH_TEAM, LIST_TEAM, OTHER_TEAM)
SPEC: dict[str, Any] = {
    "name": "digits-cnn",
    "entrypoint": "examples.digits_cnn",
    "args": ["--epochs", "2"],
    "gpus": 1,
    "gpu_flavor": "cpu",
    "hyperparameters": {"lr": 0.01, "batch_size": 64, "optimizer": "adam", "amsgrad": False},
    "seed": 7,
}
"""The job every ``POST`` sends (the integration tests' spec: 198 bytes of JSON)."""


@dataclass(frozen=True)
class Config:
    warmup_s: float
    duration_s: float
    open_duration_s: float
    repeats: int
    clients: tuple[int, ...]
    list_requests: int
    walk_pages: int
    walk_rounds: int


FULL = Config(
    warmup_s=3.0,
    duration_s=15.0,
    open_duration_s=20.0,
    repeats=2,
    clients=(16, 64),
    list_requests=1000,
    walk_pages=200,
    walk_rounds=2,
)
QUICK = Config(
    warmup_s=2.0,
    duration_s=8.0,
    open_duration_s=10.0,
    repeats=1,
    clients=(16, 64),
    list_requests=300,
    walk_pages=100,
    walk_rounds=1,
)


# --- CPU accounting -------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int, children: bool = False) -> float:
    """CPU seconds of a process (with ``children``: plus those of its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def _postgres_cpu(pgdata: Path) -> float:
    """CPU seconds of the postmaster, its live children and its reaped ones."""
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    total = _cpu_of(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores, from ``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / _TICK


@dataclass
class Meters:
    """The processes whose CPU time each run reports."""

    pgdata: Path
    nats_pid: int
    servers: dict[str, int]

    def sample(self) -> dict[str, float]:
        sample = {name: _cpu_of(pid) for name, pid in self.servers.items()}
        sample["postgres"] = _postgres_cpu(self.pgdata)
        sample["nats"] = _cpu_of(self.nats_pid)
        sample["machine"] = _machine_busy()
        sample["wall"] = time.monotonic()
        return sample


def _cpu_use(before: dict[str, float], after: dict[str, float], accepted: int) -> dict[str, Any]:
    wall = after["wall"] - before["wall"]
    use: dict[str, Any] = {"wall_s": round(wall, 2)}
    ours = sum(after[k] - before[k] for k in before if k not in ("wall", "machine"))
    # What the rest of the machine used meanwhile (other users' work; the generator too).
    use["machine_busy_cores"] = round((after["machine"] - before["machine"]) / wall, 2)
    use["servers_cores"] = round(ours / wall, 2)
    for name in before:
        if name in ("wall", "machine"):
            continue
        seconds = after[name] - before[name]
        use[name] = {
            "cpu_s": round(seconds, 2),
            "cores": round(seconds / wall, 2),
            "cpu_ms_per_accepted": round(seconds * 1000 / accepted, 3) if accepted else None,
        }
    return use


# --- the servers ----------------------------------------------------------------------------


def _wait_http(url: str, process: ManagedProcess, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.is_running():
            raise RuntimeError(f"{process.name} exited:\n{process.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{process.name} not ready within {timeout_s:g} s:\n{process.log_tail()}")


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    return {**env, **extra}


def start_baseline(base: Path, dsn: str) -> tuple[ManagedProcess, int]:
    port = free_port()
    process = ManagedProcess(
        "baseline",
        [sys.executable, "-m", "bench._submission_baseline", "--dsn", dsn, "--port", str(port)],
        env=_child_env({}),
        log_path=base / "logs" / "baseline.log",
        cwd=REPO,
    )
    process.start()
    _wait_http(f"http://127.0.0.1:{port}/healthz", process)
    return process, port


def start_service(
    base: Path, dsn: str, nats_url: str, code: Path = REPO, name: str = "service"
) -> tuple[ManagedProcess, int]:
    """``python -m trainyard_platform.services.submission`` from the checkout ``code`` (``python -m`` imports
    the service from its working directory first)."""
    port = free_port()
    env = _child_env(
        {
            "TRAINYARD_NATS_URL": nats_url,
            "TRAINYARD_DATABASE_URL": dsn,
            "TRAINYARD_STORAGE_URI": (base / "objects").as_uri(),
            "TRAINYARD_SUBMISSION_PORT": str(port),
            # Out of reach: the buckets are consulted on every request but never refuse.
            "TRAINYARD_SUBMISSION_WRITE_RATE_PER_S": UNLIMITED,
            "TRAINYARD_SUBMISSION_WRITE_BURST": UNLIMITED,
            "TRAINYARD_SUBMISSION_READ_RATE_PER_S": UNLIMITED,
            "TRAINYARD_SUBMISSION_READ_BURST": UNLIMITED,
        }
    )
    process = ManagedProcess(
        name,
        [sys.executable, "-m", "trainyard_platform.services.submission"],
        env=env,
        log_path=base / "logs" / f"{name}.log",
        cwd=code,
    )
    process.start()
    _wait_http(f"http://127.0.0.1:{port}/readyz", process)
    return process, port


# --- the database ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    submitters: list[str]
    lister: str


def create_user(port: int, admin_token: str, name: str, role: str) -> str:
    """A token of a new user of the admin's team, made through ``POST /v1/admin/users``."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/admin/users",
        data=json.dumps({"name": name, "role": role}).encode(),
        headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        token: str = json.loads(response.read())["token"]
    return token


def bootstrap(dsn: str, team: str, user: str, base: Path) -> str:
    """A token of a new admin ``user`` of ``team`` (made as an operator would:
    ``python -m trainyard_platform.services.submission bootstrap-admin``, which also migrates the schema)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainyard_platform.services.submission",
            "bootstrap-admin",
            "--team",
            team,
            "--user",
            user,
        ],
        env=_child_env(
            {"TRAINYARD_DATABASE_URL": dsn, "TRAINYARD_STORAGE_URI": (base / "objects").as_uri()}
        ),
        capture_output=True,
        cwd=REPO,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bootstrap-admin failed:\n{done.stderr.decode(errors='replace')}")
    return done.stdout.decode().strip()


async def store_jobs(dsn: str, list_jobs: int) -> None:
    """Store ``list_jobs`` jobs of ``LIST_TEAM`` (and a fifth as many of ``OTHER_TEAM``)
    with COPY, then ANALYZE."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA})
    try:
        # COPY is binary: jsonb's binary form is a version byte (1) and the text.
        await conn.set_type_codec(
            "jsonb",
            encoder=lambda value: b"\x01" + json.dumps(value).encode(),
            decoder=lambda data: json.loads(data[1:]),
            schema="pg_catalog",
            format="binary",
        )
        for team, count in ((LIST_TEAM, list_jobs), (OTHER_TEAM, list_jobs // 5)):
            await _copy_jobs(conn, team, count)
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


_STATUSES = (
    ("SUCCEEDED", 0.60),
    ("FAILED", 0.15),
    ("CANCELLED", 0.10),
    ("QUEUED", 0.07),
    ("PENDING", 0.06),
    ("RUNNING", 0.015),
    ("SCHEDULED", 0.005),
)
_JOB_COLUMNS = (
    "id",
    "team_id",
    "user_id",
    "name",
    "spec",
    "status",
    "submitted_at",
    "updated_at",
    "allocation_id",
    "node_id",
    "gpu_indices",
    "attempt",
    "started_at",
    "finished_at",
    "metrics",
    "metrics_step",
)


async def _copy_jobs(conn: asyncpg.Connection, team: str, count: int) -> None:
    """``count`` jobs of ``team`` over the last 90 days, oldest first (as they were
    submitted), with a cost row for every finished one."""
    row = await conn.fetchrow(
        "SELECT t.id AS team_id, min(u.id) AS user_id FROM teams t "
        "JOIN users u ON u.team_id = t.id WHERE t.name = $1 GROUP BY t.id",
        team,
    )
    rng = random.Random(f"{team}:{count}")
    statuses = [s for s, _ in _STATUSES]
    weights = [w for _, w in _STATUSES]
    now = dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(days=90)
    step = (now - start) / max(count, 1)
    jobs, costs = [], []
    for i in range(count):
        job_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        status = rng.choices(statuses, weights)[0]
        submitted = start + step * i
        placed = status not in ("QUEUED", "PENDING")
        started = submitted + dt.timedelta(seconds=30) if placed else None
        finished = (
            submitted + dt.timedelta(minutes=20)
            if status in ("SUCCEEDED", "FAILED", "CANCELLED")
            else None
        )
        spec = {**SPEC, "name": f"job-{i}", "team": team, "user": "reader"}
        jobs.append(
            (
                job_id,
                row["team_id"],
                row["user_id"],
                f"job-{i}",
                spec,
                status,
                submitted,
                finished or started or submitted,
                f"alloc-{job_id}" if placed else None,
                "node-1" if placed else None,
                [0] if placed else None,
                1 if placed else None,
                started,
                finished,
                {"loss": 0.1} if placed else {},
                100 if placed else None,
            )
        )
        if finished is not None and started is not None:
            costs.append(
                (f"alloc-{job_id}", job_id, "cpu", 1, started, finished, 1170.0, 2.0, 0.65, "USD")
            )
    await conn.copy_records_to_table("jobs", records=jobs, columns=_JOB_COLUMNS)
    await conn.copy_records_to_table(
        "job_costs",
        records=costs,
        columns=(
            "allocation_id",
            "job_id",
            "gpu_flavor",
            "gpus",
            "started_at",
            "ended_at",
            "gpu_seconds",
            "price_per_gpu_hour",
            "cost",
            "currency",
        ),
    )


async def durable(dsn: str, ids: list[str]) -> dict[str, int]:
    """How many of ``ids`` have their job row and their ``job.submitted`` outbox row."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA})
    try:
        row = await conn.fetchrow(
            """SELECT count(*) AS accepted,
                      count(j.id) AS with_job,
                      count(o.event_id) AS with_event,
                      count(*) FILTER (WHERE o.published_at IS NOT NULL) AS published
               FROM unnest($1::text[]) AS a(id)
               LEFT JOIN jobs j ON j.id = a.id
               LEFT JOIN outbox o ON o.subject = 'trainyard.job.submitted.v1.' || a.id""",
            ids,
        )
    finally:
        await conn.close()
    return dict(row)


async def explain_list(dsn: str, team: str) -> dict[str, list[str]]:
    """How PostgreSQL runs the list's query for ``team`` (first page, by status, and a page
    half-way down the list): ``EXPLAIN ANALYZE``, line by line."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA})
    try:
        team_id = await conn.fetchval("SELECT id FROM teams WHERE name = $1", team)
        middle = await conn.fetchrow(
            "SELECT submitted_at, id FROM jobs WHERE team_id = $1 "
            "ORDER BY submitted_at DESC, id DESC OFFSET (SELECT count(*) / 2 FROM jobs "
            "WHERE team_id = $1) LIMIT 1",
            team_id,
        )
        plans = {}
        for label, status, after in (
            ("first page", None, None),
            ("status=RUNNING", "RUNNING", None),
            ("status=PREEMPTED", "PREEMPTED", None),
            ("half-way down", None, (middle["submitted_at"], middle["id"])),
        ):
            sql, params = repository.jobs_for_team_query(team_id, status, after, 51)
            lines = [r[0].strip() for r in await conn.fetch(f"EXPLAIN ANALYZE {sql}", *params)]
            plans[label] = lines
    finally:
        await conn.close()
    return plans


# --- load -----------------------------------------------------------------------------------


def _post(port: int, token: str) -> str:
    body = json.dumps(SPEC, separators=(",", ":"))
    return (
        f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )


def _get(port: int, token: str, query: str) -> str:
    return (
        f"GET /v1/jobs?{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: application/json\r\n\r\n"
    )


def load(job: dict[str, Any]) -> dict[str, Any]:
    """Run the generator in its own process with ``job``; its JSON answer."""
    done = subprocess.run(
        [sys.executable, "-m", "bench._submission_load"],
        input=json.dumps(job).encode(),
        capture_output=True,
        cwd=REPO,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{done.stderr.decode(errors='replace')}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def measured(
    meters: Meters, job: dict[str, Any], created: list[str] | None = None
) -> dict[str, Any]:
    """``load(job)`` with the CPU time every process used meanwhile."""
    before = meters.sample()
    result = load(job)
    after = meters.sample()
    ids = result.pop("created", [])
    if created is not None:
        created.extend(ids)
    result["accepted_total"] = len(ids)
    result["cpu"] = _cpu_use(before, after, len(ids))
    result["cpu"]["generator"] = {
        "cpu_s": result["generator_cpu_s"],
        "cores": round(result["generator_cpu_s"] / max(result["generator_wall_s"], 1e-9), 3),
    }
    return result


def _line(label: str, rate: float, r: dict[str, Any]) -> str:
    lat = r["latency"]
    cores = ", ".join(
        f"{k} {v['cores']:.2f}" for k, v in r["cpu"].items() if isinstance(v, dict) and v["cpu_s"]
    )
    line = (
        f"{label:<30} {rate:>8.1f}/s  p50 {lat['p50_ms']:>7.1f} ms  p99 {lat['p99_ms']:>7.1f} ms"
        f"  cores: {cores}; machine {r['cpu']['machine_busy_cores']:.2f}"
    )
    bad = {k: v for k, v in r["statuses"].items() if not str(k).startswith("2")}
    if bad or r["error_count"]:
        line += f"  non-2xx {bad}, errors {r['error_count']}"
    return line


def run(
    cfg: Config,
    base: Path,
    list_jobs: int,
    say: Callable[[str], None],
    before: Path | None = None,
) -> dict[str, Any]:
    """The measurements; with ``before`` (a checkout of other code), its service is
    measured too, as ``before``, in the closed-loop runs, alternating with the others."""
    results: dict[str, Any] = {}
    with (
        NatsServer(base / "nats", log_path=base / "logs" / "nats.log") as nats_server,
        PostgresServer(base / "pg") as pg,
    ):
        dsn = pg.dsn
        results["postgres_version"] = pg.psql("SHOW server_version").strip()
        t = time.monotonic()
        admins = {team: bootstrap(dsn, team, "admin", base) for team in TEAMS}
        asyncio.run(store_jobs(dsn, list_jobs))
        results["setup_s"] = round(time.monotonic() - t, 1)
        say(f"stored {list_jobs:,} jobs of team {LIST_TEAM} in {results['setup_s']} s")

        baseline, baseline_port = start_baseline(base, dsn)
        service, service_port = start_service(base, dsn, nats_server.url)
        assert baseline.pid is not None and service.pid is not None
        assert nats_server.pid is not None
        servers = {"baseline": baseline.pid, "service": service.pid}
        ports = {"baseline": baseline_port, "service": service_port}
        old = None
        if before is not None:
            old, ports["before"] = start_service(base, dsn, nats_server.url, before, "before")
            assert old.pid is not None
            servers["before"] = old.pid
        meters = Meters(base / "pg", nats_server.pid, servers)
        submitting = ("baseline", "before", "service") if old else ("baseline", "service")
        # Members submit (an admin's writes would also go to the audit log), a viewer lists.
        tokens = Tokens(
            submitters=[
                create_user(service_port, admins[BENCH_TEAM], f"u{i}", "member")
                for i in range(SUBMITTERS)
            ],
            lister=create_user(service_port, admins[LIST_TEAM], "reader", "viewer"),
        )
        created: list[str] = []
        try:
            closed: list[dict[str, Any]] = []
            say("\n1. saturating throughput, closed loop (POST /v1/jobs)")
            for repeat in range(cfg.repeats):
                for clients in cfg.clients:
                    for server in submitting:
                        job = {
                            "mode": "closed",
                            "host": "127.0.0.1",
                            "port": ports[server],
                            "connections": clients,
                            "warmup_s": cfg.warmup_s,
                            "duration_s": cfg.duration_s,
                            "requests": [_post(ports[server], tok) for tok in tokens.submitters],
                        }
                        r = measured(meters, job, created if server != "baseline" else None)
                        r.update(server=server, clients=clients, repeat=repeat)
                        closed.append(r)
                        say(_line(f"{server}, {clients} clients", r["ok_per_s"], r))
            results["closed_loop"] = closed

            best = {
                server: max(r["ok_per_s"] for r in closed if r["server"] == server)
                for server in ("baseline", "service")
            }
            say("\n2. half the saturating rate, open loop")
            opened = []
            for repeat, server in itertools.product(range(cfg.repeats), ("baseline", "service")):
                rate = round(best[server] / 2, 1)
                job = {
                    "mode": "open",
                    "host": "127.0.0.1",
                    "port": ports[server],
                    "connections": 64,
                    "rate": rate,
                    "warmup_s": cfg.warmup_s,
                    "duration_s": cfg.open_duration_s,
                    "requests": [_post(ports[server], tok) for tok in tokens.submitters],
                }
                r = measured(meters, job, created if server == "service" else None)
                r.update(server=server, repeat=repeat, window_s=cfg.open_duration_s)
                opened.append(r)
                say(
                    _line(f"{server}, {rate:g}/s offered", r["counted_ok"] / cfg.open_duration_s, r)
                )
            results["open_loop"] = opened

            say("\n3. durability of every accepted job")
            time.sleep(2)  # the relay's last batch
            check = asyncio.run(durable(dsn, created))
            results["durable"] = check
            say(
                f"accepted {check['accepted']:,}: job row {check['with_job']:,}, "
                f"job.submitted outbox row {check['with_event']:,} "
                f"(published to NATS {check['published']:,})"
            )

            say(f"\n4. GET /v1/jobs, team with {list_jobs:,} jobs, one client")
            listing: dict[str, Any] = {}
            for label, query, pages, rounds in (
                ("first page", "limit=50", 1, cfg.list_requests),
                ("status=SUCCEEDED (60%)", "limit=50&status=SUCCEEDED", 1, cfg.list_requests),
                ("status=RUNNING (1.5%)", "limit=50&status=RUNNING", 1, cfg.list_requests),
                ("status=PREEMPTED (none)", "limit=50&status=PREEMPTED", 1, cfg.list_requests),
                ("pages by cursor", "limit=50", cfg.walk_pages, cfg.walk_rounds),
            ):
                job = {
                    "mode": "walk",
                    "host": "127.0.0.1",
                    "port": service_port,
                    "pages": pages,
                    "rounds": rounds,
                    "requests": [_get(service_port, tokens.lister, query)],
                }
                r = measured(meters, job)
                r["query"] = query
                listing[label] = r
                say(_line(f"{label} ({r['pages']} pages)", r["pages"] / r["generator_wall_s"], r))
            results["list"] = listing
            results["list_plans"] = asyncio.run(explain_list(dsn, LIST_TEAM))
        finally:
            service.stop()
            baseline.stop()
            if old is not None:
                old.stop()
        results["service_exit"] = service.returncode
    return results


def machine() -> dict[str, Any]:
    return describe(
        event_loop="asyncio (uvicorn.Server inside asyncio.run, as ServiceRuntime runs it)",
        uvicorn_http="httptools" if importlib.util.find_spec("httptools") else "h11",
    )


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    closed = results["closed_loop"]

    def best(server: str, clients: int | None = None) -> float:
        return max(
            float(r["ok_per_s"])
            for r in closed
            if r["server"] == server and (clients is None or r["clients"] == clients)
        )

    ratio = {
        str(c): round(best("service", c) / best("baseline", c), 3)
        for c in sorted({r["clients"] for r in closed})
    }
    ratio["saturating"] = round(best("service") / best("baseline"), 3)
    compared = [s for s in ("before",) if any(r["server"] == s for r in closed)]
    half_rate = {
        server: [r["latency"]["p99_ms"] for r in results["open_loop"] if r["server"] == server]
        for server in ("baseline", "service")
    }
    service_p99 = statistics.median(half_rate["service"])
    list_p99 = max(r["latency"]["p99_ms"] for r in results["list"].values())
    check = results["durable"]

    def cpu_ms(server: str, process: str) -> float:
        """Median CPU ms per accepted submission of ``process`` in ``server``'s runs."""
        return float(
            statistics.median(
                r["cpu"][process]["cpu_ms_per_accepted"] for r in closed if r["server"] == server
            )
        )

    return {
        "saturating_per_s": {s: best(s) for s in ("baseline", *compared, "service")},
        "ratio_service_to_baseline": ratio,
        **{
            f"ratio_{s}_to_baseline": {
                str(c): round(best(s, c) / best("baseline", c), 3)
                for c in sorted({r["clients"] for r in closed})
            }
            | {"saturating": round(best(s) / best("baseline"), 3)}
            for s in compared
        },
        "cpu_ms_per_accepted": {
            server: {"server": cpu_ms(server, server), "postgres": cpu_ms(server, "postgres")}
            for server in ("baseline", *compared, "service")
        },
        "half_rate_p99_ms": half_rate,
        "half_rate_p99_ms_median": {
            server: statistics.median(values) for server, values in half_rate.items()
        },
        "list_p99_ms_worst": list_p99,
        "targets_met": {
            "throughput_ratio": ratio["saturating"] >= TARGET_RATIO,
            "half_rate_p99": service_p99 < TARGET_HALF_RATE_P99_MS,
            "list_p99": list_p99 < TARGET_LIST_P99_MS,
            "every_accepted_durable": check["accepted"] == check["with_job"] == check["with_event"],
        },
    }


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "not a git checkout"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submission", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs, one repetition")
    parser.add_argument("--list-jobs", type=int, default=100_000, help="jobs of the listed team")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, help="keep the servers' logs in this folder")
    parser.add_argument(
        "--before",
        type=Path,
        help="a checkout of the code to compare (e.g. `git worktree add DIR HEAD`): its "
        "service is measured too, as `before`, in the closed-loop runs",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    started = time.monotonic()
    load_before = os.getloadavg()
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)  # PostgreSQL runs as its own user when we are root
        try:
            results = run(cfg, base, args.list_jobs, lambda s: print(s, flush=True), args.before)
        finally:
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for log in (base / "logs").glob("*.log"):
                    (args.keep / log.name).write_bytes(log.read_bytes())
    summary = summarize(results)
    document = {
        "date": date,
        "mode": "quick" if args.quick else "full",
        "command": "python -m bench.submission"
        + (" --quick" if args.quick else "")
        + (" --before CHECKOUT" if args.before else ""),
        # The compared checkout's commit, not its path (no machine paths in results).
        "before_commit": _commit(args.before) if args.before else None,
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine()
        | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "config": {**cfg.__dict__, "list_jobs": args.list_jobs, "rate_limits": UNLIMITED},
        "summary": summary,
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"\nsummary: {json.dumps(summary)}")
    try:
        shown = args.out.resolve().relative_to(REPO)
    except ValueError:
        shown = args.out
    print(f"written to {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
