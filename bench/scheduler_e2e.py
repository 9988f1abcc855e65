"""End-to-end allocation throughput: the real scheduler process over NATS and PostgreSQL.

Run: ``.venv/bin/python -m bench.scheduler_e2e [--nodes 25 100] [--repeat 3]``. Prints a line
per run and the median per cluster size, and writes ``bench/results/scheduler_e2e.json``.

What is measured: a real ``python -m trainyard_platform.services.scheduler`` (one process, its own Postgres schema,
JetStream consumer, outbox relay) on a local NATS server and PostgreSQL. ``--nodes`` runners are
simulated by publishing their heartbeats (8 GPUs each); then ``--jobs`` one-GPU jobs are
published as ``job.submitted`` events as fast as the client can, and the clock runs from the
first submit until the last ``allocation.granted`` is seen on NATS. Each submission and each
success carries a W3C trace context as the real producers' do (the submission service's span
in a new trace; the runner's in the grant's trace). Every decision therefore
includes: consume, inbox record, a scheduling pass, leases written under the unique-lease
constraint, outbox row, commit, relay to JetStream. The reference is the issue's target of
500 decisions per second (Slurm documents about 500 jobs/s; the Kubernetes scheduler about
180 pods/s with GPU resources); there is no in-run baseline process to compare against.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

from bench._host import describe
from trainyard_platform.deploy.local.nats import NatsServer
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.deploy.local.processes import ManagedProcess
from trainyard_platform.shared.events import Envelope, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import owner

RESULTS = Path(__file__).parent / "results" / "scheduler_e2e.json"
TARGET_PER_S = 500.0


async def _run(
    nats_url: str, nodes: int, jobs: int, queue_url: str, finish: bool
) -> dict[str, float]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    granted: set[str] = set()
    done = asyncio.Event()
    # Each grant with the traceparent it came with (None: stop).
    to_finish: asyncio.Queue[tuple[AllocationGranted, str | None] | None] = asyncio.Queue()

    async def on_grant(msg: Msg) -> None:
        grant = parse_envelope(msg.data).data
        assert isinstance(grant, AllocationGranted)
        granted.add(grant.job_id)
        if finish:
            to_finish.put_nowait((grant, (msg.headers or {}).get("traceparent")))
        if len(granted) >= jobs:
            done.set()

    async def finish_jobs() -> None:
        """The runners: each granted job succeeds at once, freeing its GPU for the next."""
        while (finished := await to_finish.get()) is not None:
            grant, parent = finished
            succeeded = JobSucceeded(
                job_id=grant.job_id,
                allocation_id=grant.allocation_id,
                node_id=grant.node_id,
                epoch=grant.epoch,
                finished_at=dt.datetime.now(dt.UTC),
            )
            env = Envelope.wrap(succeeded, source=owner(succeeded), subject=grant.job_id)
            traced = _trace_headers(parent) if parent else {}  # none came: none goes
            headers = {"Nats-Msg-Id": env.id, **traced}
            await js.publish(env.nats_subject, env.to_json(), headers=headers)

    await nc.subscribe("trainyard.allocation.granted.v1.>", cb=on_grant)
    finisher = asyncio.create_task(finish_jobs())
    run_tag = uuid.uuid4().hex[:6]
    for i in range(nodes):
        node = f"bench-{run_tag}-{i:04d}"
        beat = RunnerHeartbeat(
            node_id=node,
            hostname=node,
            gpu_flavor="a100",
            gpu_count=8,
            sent_at=dt.datetime.now(dt.UTC),
        )
        beat_env = Envelope.wrap(beat, source=owner(beat), subject=node)
        await js.publish(
            beat_env.nats_subject, beat_env.to_json(), headers={"Nats-Msg-Id": beat_env.id}
        )
    await _wait_for_nodes(queue_url, nodes)

    t0 = time.perf_counter()
    for _ in range(jobs):
        job_id = str(uuid.uuid4())
        spec = JobSpec(
            name="bench",
            team=f"team-{len(granted) % 5}",
            user="bench",
            entrypoint="examples.digits_cnn",
            gpus=1,
            gpu_flavor="a100",
            seed=0,
            max_runtime_seconds=3600,
        )
        env = Envelope.wrap(
            JobSubmitted(job_id=job_id, spec=spec, submitted_at=dt.datetime.now(dt.UTC)),
            source=owner(JobSubmitted),
            subject=job_id,
        )
        headers = {"Nats-Msg-Id": env.id, **_trace_headers(None)}
        await js.publish(env.nats_subject, env.to_json(), headers=headers)
    t_submitted = time.perf_counter()
    with contextlib.suppress(TimeoutError):  # a shortfall is reported, not raised
        await asyncio.wait_for(done.wait(), timeout=max(120.0, jobs / 5))
    t_end = time.perf_counter()
    # Stopped in turn, not cancelled: a JetStream publish may swallow the cancellation.
    to_finish.put_nowait(None)
    await finisher
    await nc.close()
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "jobs": jobs,
        "finish": finish,
        "granted": len(granted),
        "submit_seconds": round(t_submitted - t0, 3),
        "seconds": round(t_end - t0, 3),
        "decisions_per_second": round(len(granted) / (t_end - t0), 1),
    }


def _trace_headers(parent: str | None) -> dict[str, str]:
    """The W3C context a real producer sends with an event, as one of its spans: for a
    submission (``parent`` None), the submission service's in a new trace, recorded as that
    service's sampler (the same ``OTEL_TRACES_SAMPLER`` variables as the scheduler's) would
    decide; for a success, the runner's in the trace of the grant's ``parent`` traceparent,
    with its decision."""
    if parent is None:
        trace_id = secrets.token_hex(16)
        flags = "01" if _samples(int(trace_id, 16)) else "00"
    else:
        _, trace_id, _, flags = parent.split("-")
    return {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-{flags}"}


def _samples(trace_id: int) -> bool:
    """Whether a root span of ``trace_id`` is recorded by the sampler the environment names."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    if name in ("always_off", "parentbased_always_off"):
        return False
    if name in ("traceidratio", "parentbased_traceidratio"):
        ratio = TraceIdRatioBased(float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")))
        decision = ratio.should_sample(None, trace_id, "submit").decision
        return decision is Decision.RECORD_AND_SAMPLE
    return True


async def _wait_for_nodes(queue_url: str, nodes: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body = await asyncio.to_thread(_get_json, queue_url)
        if len(body.get("nodes", [])) >= nodes:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the scheduler did not register {nodes} nodes within 60 s")


ADMIN_TOKEN = secrets.token_urlsafe(32)
"""The operator token the benchmark's scheduler is started with (``GET /v1/queue``)."""


def _get_json(url: str) -> dict[str, list[object]]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        body: dict[str, list[object]] = json.loads(response.read())
    return body


def _wait_ready(url: str, process: ManagedProcess) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not process.is_running():
            raise RuntimeError(f"scheduler exited:\n{process.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("scheduler not ready within 120 s")


def _measure(
    base: Path,
    nats_url: str,
    pg: PostgresServer,
    nodes: int,
    jobs: int,
    finish: bool,
    log_dir: Path | None,
) -> dict[str, float]:
    """One run: a fresh scheduler on a fresh database and stream."""
    port = free_port()
    name = f"bench_{nodes}_{uuid.uuid4().hex[:6]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "TRAINYARD_NATS_URL": nats_url,
        "TRAINYARD_DATABASE_URL": pg.create_database(name),
        "TRAINYARD_SCHEDULER_PORT": str(port),
        "TRAINYARD_SCHEDULER_NODE_TIMEOUT_SECONDS": "600",
        "TRAINYARD_SCHEDULER_ADMIN_TOKEN": ADMIN_TOKEN,
        "TRAINYARD_SCHEDULER_LOG_LEVEL": "DEBUG" if log_dir else "INFO",
    }
    process = ManagedProcess(
        "scheduler",
        [sys.executable, "-m", "trainyard_platform.services.scheduler"],
        env=env,
        log_path=(log_dir or base) / f"scheduler-{name}.log",
        cwd=Path(__file__).parents[1],
    )
    process.start()
    try:
        _wait_ready(f"http://127.0.0.1:{port}/readyz", process)
        queue_url = f"http://127.0.0.1:{port}/v1/queue"
        return asyncio.run(_run(nats_url, nodes, jobs, queue_url, finish))
    finally:
        process.stop()
        # A fresh stream per run: the next scheduler must not replay this one.
        asyncio.run(_delete_streams(nats_url))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_e2e")
    parser.add_argument("--nodes", type=int, nargs="+", default=[25, 100])
    parser.add_argument("--jobs-per-gpu", type=float, default=1.0)
    parser.add_argument(
        "--finish",
        action="store_true",
        help="runners report each granted job succeeded at once, so with --jobs-per-gpu > 1 "
        "the rest wait in the queue (pending notes, releases) and start as GPUs free up",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per cluster size")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--log-dir", type=Path, help="keep the scheduler's logs here (with one line per pass)"
    )
    args = parser.parse_args(argv)

    runs, summary = [], []
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)  # PostgreSQL runs as its own user when we are root
        with NatsServer(base / "nats") as nats_server, PostgresServer(base / "pg") as pg:
            for nodes in args.nodes:
                jobs = int(nodes * 8 * args.jobs_per_gpu)
                rates = []
                for _ in range(args.repeat):
                    run = _measure(
                        base, nats_server.url, pg, nodes, jobs, args.finish, args.log_dir
                    )
                    runs.append(run)
                    rates.append(run["decisions_per_second"])
                    print(
                        f"{run['nodes']:>5} nodes {run['gpus']:>5} GPUs {run['jobs']:>5} jobs: "
                        f"{run['granted']} granted in {run['seconds']:.2f} s = "
                        f"{run['decisions_per_second']:.0f} decisions/s"
                    )
                median = statistics.median(rates)
                summary.append(
                    {
                        "nodes": nodes,
                        "jobs": jobs,
                        "median_decisions_per_second": median,
                        "min": min(rates),
                        "max": max(rates),
                        "vs_target": round(median / TARGET_PER_S, 2),
                    }
                )
                print(
                    f"{nodes:>5} nodes: median {median:.0f} decisions/s "
                    f"(min {min(rates):.0f}, max {max(rates):.0f}) = "
                    f"{median / TARGET_PER_S:.2f}x the 500/s target"
                )
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": describe(),
        "target_decisions_per_second": TARGET_PER_S,
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


async def _delete_streams(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for stream in ("TRAINYARD", "TRAINYARD_DEADLETTER"):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(stream)
    await nc.close()


if __name__ == "__main__":
    sys.exit(main())
