"""Execution layer: what the runner and the SDK cost a training job, each against a baseline
measured in the same run.

Run: ``.venv/bin/python -m bench.execution`` (about 8 minutes; ``--quick`` about 3). Needs
root (the runner runs jobs as unprivileged users) and PyPI (for the cold environments).
Prints a table per measurement and writes ``bench/results/execution.json``.

Everything is real and on loopback: a NATS server with JetStream
(``deploy.local.nats.NatsServer``), a moto S3 server (``deploy.local.s3.S3Server``) as the
object store, and the runner's ``NodeAgent`` in this process (wired as
``services.runner.service.serve`` does, like ``tests/integration/runner/conftest.py``) on one
virtual GPU. Jobs are granted by publishing ``allocation.granted``; their code is a bundle
(``trainyard.bundle.pack``) of ``bench/_execution_train.py`` as ``train.py``.

1. **Platform overhead.** The same script (an MLP on synthetic tensors, one thread, a fixed
   number of steps, every batch through ``ctx.data``, metrics every 10 steps) run bare
   (``python train.py``, no platform variables: the SDK prints its metrics) and as a job.
   The script measures its own samples/s over its training loop (after a warm-up; start-up
   excluded). Bare runs twice per repetition: with the project's interpreter
   (``.venv/bin/python``, what a user types) and with the job environment's interpreter (the
   runner's cached venv), which separates the interpreter from the platform. The order of
   the three rotates between repetitions. Target: runner >= 0.98 x bare.
2. **Checkpoint stall.** The same loop with a state of ``--checkpoint-mb`` MiB of float32
   tensors saved every few seconds of training: the time the loop is blocked per checkpoint
   with the SDK's ``save_checkpoint`` under the runner (a snapshot copy; the SDK writes it to
   staging in the background and the runner uploads it to S3) against a synchronous
   ``torch.save`` + ``S3Store.put_file`` to the same endpoint (bare). Also: when each
   checkpoint was durable (``checkpoint.saved`` on NATS) and the loop's samples/s including
   the checkpoints. Target: async stall <= 0.1 x sync.
3. **Upload throughput.** ``services.runner.checkpoints.commit_staged`` of a staged
   checkpoint (verify, private copy with sha256, ``put_file``, manifest) against the raw
   ``minio`` client's ``fput_object`` of the same file to the same endpoint, alternating;
   the copy and hash are also timed alone. Target: >= 0.8 x raw.
4. **Grant to first training step.** From publishing ``allocation.granted`` to the first
   ``job.progress`` on NATS (the job reports at its first step), for a job with two small
   requirements whose environment the runner has cached, and cold: a new runner with a
   fresh environments folder (its installer cache warm, and empty).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import importlib.metadata
import itertools
import json
import logging
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from nats.js import api
from pydantic import SecretStr

from bench._host import describe
from trainyard.bundle import pack
from trainyard.sdk.checkpoints import file_digest, snapshot
from trainyard_platform.deploy.local.nats import NatsServer
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.services.runner import checkpoints, launch
from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.environments import EnvironmentCache, job_interpreter
from trainyard_platform.services.runner.gpus import virtual_inventory
from trainyard_platform.services.runner.sandbox import bundle_key
from trainyard_platform.services.runner.service import agent_loops
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    CheckpointSaved,
    CodeBundle,
    JobFailed,
    JobPreempted,
    JobProgress,
    JobSpec,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.settings import NatsSettings, StorageSettings
from trainyard_platform.shared.storage import LocalStore, ObjectStore, S3Store
from trainyard_platform.shared.storage.s3 import client_from_settings

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "execution.json"
TRAIN_SCRIPT = Path(__file__).parent / "_execution_train.py"
MARKER = "TRAINYARD_BENCH"
TEAM = "bench"
BUCKET = "trainyard"
REQUIREMENTS = ["tabulate==0.9.0", "termcolor==2.4.0"]
TARGET_OVERHEAD = 0.98
TARGET_STALL = 0.1
TARGET_UPLOAD = 0.8
MB = 1_000_000
START_PHASES = ("grant_to_started_s", "started_to_first_progress_s", "grant_to_first_progress_s")

log = logging.getLogger("bench.execution")


@dataclass(frozen=True)
class Config:
    repeats: int
    steps: int
    warmup: int
    report_every: int
    checkpoint_mb: int
    checkpoints_per_run: int
    checkpoint_runs: int
    checkpoint_every_s: float
    upload_mb: int
    upload_repeats: int
    start_repeats: int


FULL = Config(
    repeats=8,
    steps=2500,
    warmup=100,
    report_every=10,
    checkpoint_mb=256,
    checkpoints_per_run=4,
    checkpoint_runs=2,
    checkpoint_every_s=6.0,
    upload_mb=256,
    upload_repeats=5,
    start_repeats=4,
)
QUICK = Config(
    repeats=3,
    steps=1200,
    warmup=100,
    report_every=10,
    checkpoint_mb=256,
    checkpoints_per_run=3,
    checkpoint_runs=1,
    checkpoint_every_s=6.0,
    upload_mb=256,
    upload_repeats=2,
    start_repeats=1,
)


# --- events ----------------------------------------------------------------------------


@dataclass
class Seen:
    at: float
    """``time.perf_counter()`` when the bench received it."""
    wall: float
    """``time.time()`` when the bench received it."""
    payload: Payload


@dataclass
class Events:
    """Every event on the stream from the bench's start, by job."""

    by_job: dict[str, list[Seen]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def record(self, msg: Any) -> None:
        at, wall = time.perf_counter(), time.time()
        payload = parse_envelope(msg.data).data
        job_id = getattr(payload, "job_id", None)
        if job_id is not None:
            self.by_job.setdefault(job_id, []).append(Seen(at, wall, payload))
            self.changed.set()

    def of(self, job_id: str, kind: type[Payload]) -> list[Seen]:
        return [s for s in self.by_job.get(job_id, []) if isinstance(s.payload, kind)]

    def first(self, job_id: str, kind: type[Payload]) -> Seen | None:
        found = self.of(job_id, kind)
        return found[0] if found else None

    async def wait_for(self, predicate: Callable[[], Any], limit_s: float) -> Any:
        async with asyncio.timeout(limit_s):
            while True:
                self.changed.clear()
                found = predicate()
                if found:
                    return found
                await self.changed.wait()


# --- the runner and its jobs -------------------------------------------------------------


@dataclass
class Runner:
    settings: Settings
    agent: NodeAgent
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]]
    stack: contextlib.AsyncExitStack

    async def shutdown(self) -> None:
        self.stop.set()
        async with asyncio.timeout(60):
            await asyncio.gather(*self.tasks)
        await self.stack.aclose()


async def start_runner(work_dir: Path, nats: NatsSettings, storage: StorageSettings) -> Runner:
    """A runner in this process, as ``services.runner.service.serve`` wires it (no HTTP)."""
    settings = Settings(
        node_id=f"bench-{uuid.uuid4().hex[:8]}",
        virtual_gpus=1,
        work_dir=work_dir,
        code_dir=work_dir,
        drain_timeout_seconds=10,
        nats=nats,
        storage=storage,
        admin_token=SecretStr(secrets.token_urlsafe(32)),  # no HTTP here; required
    )
    stack = contextlib.AsyncExitStack()
    bus = await stack.enter_async_context(Bus.connect(settings.nats, settings.node_id))
    store = S3Store(client_from_settings(storage), BUCKET)
    stop = asyncio.Event()
    agent = NodeAgent(settings, bus, store, virtual_inventory(1), stop)
    await agent.recover()
    tasks = [asyncio.create_task(loop) for loop in agent_loops(agent, bus, stop).values()]
    return Runner(settings, agent, stop, tasks, stack)


@dataclass
class Harness:
    root: Path
    """A folder job users can traverse (mode 0711): work dirs live under it."""
    s3: S3Server
    nats: NatsSettings
    bus: Bus
    events: Events
    store: S3Store
    code: CodeBundle
    code_dir: Path
    runner: Runner | None = None
    commits: list[dict[str, Any]] = field(default_factory=list)
    """Every ``commit_staged`` the runner ran: its store, step, wall-clock start and end."""

    @contextlib.contextmanager
    def timing_commits(self) -> Iterator[None]:
        """Time the runner's uploads (the supervisor calls ``checkpoints.commit_staged``
        through the module, so wrapping the attribute sees each call)."""
        original = checkpoints.commit_staged

        def timed_commit(
            staging: Path, step: int, store: ObjectStore, attempt: int
        ) -> CheckpointRef:
            began = time.time()
            try:
                return original(staging, step, store, attempt)
            finally:
                self.commits.append(
                    {"store": store.root_uri, "step": step, "began": began, "ended": time.time()}
                )

        checkpoints.commit_staged = timed_commit
        try:
            yield
        finally:
            checkpoints.commit_staged = original

    @property
    def storage(self) -> StorageSettings:
        return self.s3.storage_settings(f"s3://{BUCKET}")

    def folder(self, name: str) -> Path:
        path = self.root / f"{name}-{uuid.uuid4().hex[:6]}"
        path.mkdir()
        path.chmod(0o711)
        return path


def parse_marker(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER + " "):
            result: dict[str, Any] = json.loads(line[len(MARKER) + 1 :])
            return result
    raise RuntimeError(f"no {MARKER} line in the output:\n{text[-2000:]}")


async def run_job(
    h: Harness,
    runner: Runner,
    args: Sequence[str],
    requirements: Sequence[str] = (),
    limit_s: float = 900,
) -> dict[str, Any]:
    """Grant a job of the training script to ``runner``; its result line and event times."""
    node_id = runner.settings.node_id
    grant = AllocationGranted(
        allocation_id=str(uuid.uuid4()),
        job_id=f"bench-{uuid.uuid4().hex[:12]}",
        node_id=node_id,
        gpu_indices=[0],
        epoch=1,
        attempt=1,
        granted_at=dt.datetime.now(dt.UTC),
        spec=JobSpec(
            name="bench-execution",
            team=TEAM,
            user="bench",
            entrypoint="train.py",
            args=list(args),
            gpus=1,
            gpu_flavor="cpu",
            seed=0,
            max_runtime_seconds=int(limit_s),
            code=h.code,
            requirements=list(requirements),
        ),
    )
    job_id = grant.job_id
    cpu_before = time.process_time()
    published = time.perf_counter()
    await h.bus.publish(Envelope.wrap(grant, source=owner(grant), subject=node_id))
    end_kinds = (JobSucceeded, JobFailed, JobPreempted)
    ends: list[Seen] = await h.events.wait_for(
        lambda: [s for s in h.events.by_job.get(job_id, []) if isinstance(s.payload, end_kinds)],
        limit_s + 60,
    )
    end = ends[0]
    runner_cpu_s = time.process_time() - cpu_before
    if not isinstance(end.payload, JobSucceeded):
        raise RuntimeError(f"job {job_id} did not succeed: {end.payload!r}")
    log_path = launch.job_log_path(runner.settings.work_dir, job_id, grant.allocation_id)
    result = parse_marker(log_path.read_text(errors="replace"))
    started = h.events.first(job_id, JobStarted)
    progress = h.events.first(job_id, JobProgress)
    assert started is not None and progress is not None
    result["job_id"] = job_id
    arrivals = [s.at for s in h.events.of(job_id, JobProgress)]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    result["events"] = {
        "progress_events": len(arrivals),
        "max_progress_gap_s": max(gaps, default=0.0),
        "grant_to_started_s": started.at - published,
        "grant_to_first_progress_s": progress.at - published,
        "started_to_first_progress_s": progress.at - started.at,
        "grant_to_end_s": end.at - published,
        # CPU of this process (the runner, and the bench's own client) over the job.
        "runner_cpu_s": runner_cpu_s,
        "runner_cpu_fraction": runner_cpu_s / (end.at - published),
        "checkpoint_saved": [
            {"step": s.payload.checkpoint.step, "wall": s.wall}  # type: ignore[attr-defined]
            for s in h.events.of(job_id, CheckpointSaved)
        ],
    }
    return result


def run_bare(
    python: str, code_dir: Path, args: Sequence[str], extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``python train.py ARGS`` in a fresh folder, without any platform variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-bare-") as cwd:
        done = subprocess.run(
            [python, str(code_dir / "train.py"), *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"bare run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return parse_marker(done.stdout)


def bare_first_step(python: str, code_dir: Path, args: Sequence[str]) -> float:
    """Seconds from starting ``python train.py ARGS`` bare to its first metrics line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-bare-") as cwd:
        began = time.perf_counter()
        with subprocess.Popen(
            [python, str(code_dir / "train.py"), *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ) as process:
            assert process.stdout is not None
            seconds = None
            for line in process.stdout:
                if seconds is None and line.startswith("[trainyard] step 1:"):
                    seconds = time.perf_counter() - began
            if process.wait() != 0 or seconds is None:
                raise RuntimeError("the bare run failed or reported no first step")
    return seconds


def purge(store: ObjectStore, prefix: str) -> None:
    """Delete what a measurement left in moto (it keeps every object in memory)."""
    for key in store.list(prefix):
        store.delete(key)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# --- 1. platform overhead ------------------------------------------------------------------


async def overhead(h: Harness, cfg: Config) -> dict[str, Any]:
    assert h.runner is not None
    args = [
        "--steps",
        str(cfg.steps),
        "--warmup",
        str(cfg.warmup),
        "--report-every",
        str(cfg.report_every),
    ]
    # The job environment's interpreter, as the runner resolves it for a job without
    # requirements (a cached venv when the project's interpreter is closed to job users).
    settings = h.runner.settings
    job_python = (
        await asyncio.to_thread(
            EnvironmentCache(
                settings.environments_root,
                settings.python,
                settings.installer,
                interpreter=job_interpreter(settings.python),
            ).resolve,
            [],
        )
    ).python
    kinds = ["bare", "bare_job_python", "runner"]
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    loops: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    report_max: dict[str, list[float]] = {k: [] for k in kinds}
    gaps: list[float] = []
    runner_cpu: list[float] = []
    order_log = []
    for rep in range(cfg.repeats):
        order = kinds[rep % 3 :] + kinds[: rep % 3]
        order_log.append(order)
        for kind in order:
            if kind == "runner":
                result = await run_job(h, h.runner, args)
            else:
                python = sys.executable if kind == "bare" else job_python
                result = await asyncio.to_thread(run_bare, python, h.code_dir, args)
            samples[kind].append(result["samples_per_s"])
            loops[kind].append(result["loop_s"])
            report_max[kind].append(result["report_metrics_max_s"])
            if kind == "runner":
                gaps.append(result["events"]["max_progress_gap_s"])
                runner_cpu.append(result["events"]["runner_cpu_fraction"])
            cpu[kind].append(result["samples_per_s"] * result["loop_s"] / result["loop_cpu_s"])
            print(f"  overhead rep {rep + 1} {kind}: {result['samples_per_s']:,.0f} samples/s")
    medians = {k: median(v) for k, v in samples.items()}
    ratio = medians["runner"] / medians["bare"]
    ratio_same_python = medians["runner"] / medians["bare_job_python"]
    # Paired ratios (each repetition's runner run against its own bare run).
    paired = [r / b for r, b in zip(samples["runner"], samples["bare"], strict=True)]
    return {
        "workload": {
            "script": "bench/_execution_train.py",
            "model": "MLP 256-512-512-10, SGD, cross-entropy",
            "batch": 128,
            "steps": cfg.steps,
            "warmup_steps_excluded": cfg.warmup,
            "report_metrics_every": cfg.report_every,
            "data_wait_measurement": True,
            "torch_threads": 1,
        },
        "interpreters": {
            "bare": "the project's .venv/bin/python",
            "bare_job_python": "the runner's cached job venv (system python3.11 + base layer)",
            "runner": "the runner's cached job venv, as an unprivileged user",
        },
        "repeats": cfg.repeats,
        "order": order_log,
        "samples_per_s": samples,
        "loop_s": loops,
        "samples_per_cpu_s": cpu,
        "median_samples_per_cpu_s": {k: median(v) for k, v in cpu.items()},
        "ratio_runner_over_bare_per_cpu_s": median(cpu["runner"]) / median(cpu["bare"]),
        "best_samples_per_s": {k: max(v) for k, v in samples.items()},
        "report_metrics_max_s": report_max,
        "runner_max_progress_gap_s": gaps,
        "runner_process_cpu_fraction": runner_cpu,
        "median_paired_ratio": median(paired),
        "median_samples_per_s": medians,
        "ratio_runner_over_bare": ratio,
        "ratio_runner_over_bare_same_interpreter": ratio_same_python,
        "paired_ratios_runner_over_bare": paired,
        "target": f"runner >= {TARGET_OVERHEAD} x bare",
        "met": ratio >= TARGET_OVERHEAD,
    }


# --- 2. checkpoint stall ---------------------------------------------------------------------


async def checkpoint_stall(h: Harness, cfg: Config) -> dict[str, Any]:
    assert h.runner is not None
    args = [
        "--steps",
        "10000000",
        "--warmup",
        str(cfg.warmup),
        "--report-every",
        str(cfg.report_every),
        "--checkpoint-mb",
        str(cfg.checkpoint_mb),
        "--checkpoints",
        str(cfg.checkpoints_per_run),
        "--checkpoint-every-s",
        str(cfg.checkpoint_every_s),
    ]
    runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    for run in range(cfg.checkpoint_runs):
        for kind in ("sync", "async") if run % 2 == 0 else ("async", "sync"):
            if kind == "sync":
                prefix = f"bench-sync-{uuid.uuid4().hex[:8]}"
                result = await asyncio.to_thread(
                    run_bare,
                    sys.executable,
                    h.code_dir,
                    [*args, "--sync-store", f"s3://{BUCKET}/{prefix}"],
                    h.s3.storage_env(f"s3://{BUCKET}"),
                )
                result["durable_s"] = list(result["stalls_s"])
                await asyncio.to_thread(purge, h.store, prefix + "/")
            else:
                with h.timing_commits():
                    result = await run_job(h, h.runner, args)
                saved = {c["step"]: c["wall"] for c in result["events"]["checkpoint_saved"]}
                prefix = checkpoints.job_prefix(result["job_id"])
                commits = {c["step"]: c for c in h.commits if c["store"].endswith(prefix)}
                result["durable_s"] = []
                result["phases"] = []
                for step, began in zip(
                    result["stall_steps"], result["stall_started_at"], strict=True
                ):
                    commit = commits.get(step)
                    result["durable_s"].append(saved[step] - began if step in saved else None)
                    if commit is not None:
                        result["phases"].append(
                            {
                                "save_to_runner_commit_start_s": commit["began"] - began,
                                "runner_commit_s": commit["ended"] - commit["began"],
                            }
                        )
                await asyncio.to_thread(purge, h.store, checkpoints.job_prefix(result["job_id"]))
            runs[kind].append(result)
            shown = ", ".join(f"{s:.3f}" for s in result["stalls_s"])
            print(f"  checkpoint run {run + 1} {kind}: stalls {shown} s")
    stalls = {k: [s for r in v for s in r["stalls_s"]] for k, v in runs.items()}
    durable = {k: [s for r in v for s in r["durable_s"] if s is not None] for k, v in runs.items()}
    med = {k: median(v) for k, v in stalls.items()}
    ratio = med["async"] / med["sync"]
    waits = [w for r in runs["async"] for w in r["waits_for_previous_s"]]
    phases = [p for r in runs["async"] for p in r["phases"]]
    snapshots = [s - w for s, w in zip(stalls["async"], waits, strict=True)]
    size = cfg.checkpoint_mb // 16 * 16 * 1024 * 1024
    sdk_parts = await asyncio.to_thread(
        sdk_write_parts, h.folder("sdk-write"), cfg.checkpoint_mb, cfg.checkpoint_runs + 1
    )
    return {
        "state_bytes": size,
        "state": f"{cfg.checkpoint_mb // 16} float32 tensors of 16 MiB plus the MLP",
        "checkpoint_every_s_of_training": cfg.checkpoint_every_s,
        "runs_per_mode": cfg.checkpoint_runs,
        "checkpoints_per_run": cfg.checkpoints_per_run,
        "sync": "bare: torch.save to a local file, then S3Store.put_file to moto",
        "async": "under the runner: ctx.save_checkpoint (snapshot; the SDK stages it in the "
        "background, the runner uploads it to moto)",
        "stalls_s": stalls,
        "median_stall_s": med,
        "max_stall_s": {k: max(v) for k, v in stalls.items()},
        "async_waits_for_previous_s": waits,
        "async_snapshot_s": snapshots,
        "median_async_snapshot_s": median(snapshots),
        "async_phases": phases,
        "median_async_phases_s": {k: median([p[k] for p in phases]) for k in phases[0]}
        if phases
        else {},
        "durable_after_s": durable,
        "median_durable_after_s": {k: median(v) for k, v in durable.items() if v},
        "sdk_background_write_parts_s": sdk_parts,
        "median_sdk_background_write_parts_s": {k: median(v) for k, v in sdk_parts.items()},
        "loop_samples_per_s": {k: [r["samples_per_s"] for r in v] for k, v in runs.items()},
        "report_metrics_max_s": {
            k: [r["report_metrics_max_s"] for r in v] for k, v in runs.items()
        },
        "async_max_progress_gap_s": [r["events"]["max_progress_gap_s"] for r in runs["async"]],
        "close_wait_s": {k: [r["close_s"] for r in v] for k, v in runs.items()},
        "ratio_async_over_sync": ratio,
        "target": f"async stall <= {TARGET_STALL} x sync",
        "met": ratio <= TARGET_STALL,
    }


def sdk_write_parts(work: Path, mib: int, repeats: int) -> dict[str, list[float]]:
    """The steps of the SDK's checkpoint write on the platform, alone and in turn: the
    snapshot (what the loop waits for), then in its background thread ``torch.save`` to a
    temp file, ``file_digest``, and ``LocalStore.put_file`` into the staging folder (a
    copy, fsynced, renamed into place)."""
    state = {f"layer{i}.weight": torch.randn(4 * 1024 * 1024) for i in range(mib // 16)}
    parts: dict[str, list[float]] = {
        "snapshot": [],
        "torch_save": [],
        "sha256": [],
        "staging_put_file": [],
    }
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            began = time.perf_counter()
            copied = snapshot(state)
            parts["snapshot"].append(time.perf_counter() - began)
            path = Path(tmp) / checkpoints.OBJECT_NAME
            parts["torch_save"].append(timed(torch.save, copied, path))
            parts["sha256"].append(timed(file_digest, path))
            staging = LocalStore(Path(tmp) / "staging")
            parts["staging_put_file"].append(
                timed(staging.put_file, f"step-00000001/{checkpoints.OBJECT_NAME}", path)
            )
            del copied
    return parts


# --- 3. upload throughput ---------------------------------------------------------------------


def stage(staging: Path, step: int, master: Path, size: int, sha256: str) -> None:
    """The SDK's staging layout for ``step``, its object a hard link to ``master``."""
    folder = staging / checkpoints.staged_folder(step)
    folder.mkdir(parents=True)
    os.link(master, folder / checkpoints.OBJECT_NAME)
    manifest = {
        "step": step,
        "object": f"{folder.name}/{checkpoints.OBJECT_NAME}",
        "size_bytes": size,
        "sha256": sha256,
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "job_id": "bench",
        "attempt": 1,
    }
    (folder / checkpoints.MANIFEST_NAME).write_text(json.dumps(manifest))


def copy_hashing(source: Path, dest: Path | None) -> str:
    """What ``commit_staged`` does to the staged object before uploading it: read it in
    1 MiB chunks, hash each, and (``dest``) write it to a private file."""
    digest = hashlib.sha256()
    with source.open("rb") as src, dest.open("wb") if dest else contextlib.nullcontext() as sink:
        while chunk := src.read(1024 * 1024):
            digest.update(chunk)
            if sink is not None:
                sink.write(chunk)
    return digest.hexdigest()


def timed(fn: Callable[..., Any], *args: Any) -> float:
    began = time.perf_counter()
    fn(*args)
    return time.perf_counter() - began


def upload_throughput(h: Harness, cfg: Config, work: Path) -> dict[str, Any]:
    master = work / "master.pt"
    pieces = cfg.upload_mb // 16
    torch.save({f"layer{i}.weight": torch.randn(4 * 1024 * 1024) for i in range(pieces)}, master)
    size = master.stat().st_size
    digest = copy_hashing(master, None)
    client = client_from_settings(h.storage)
    staging = work / "staging"
    staging.mkdir()
    samples: dict[str, list[float]] = {"commit_staged": [], "raw_fput_object": []}
    parts: dict[str, list[float]] = {
        "copy_and_sha256": [],
        "sha256_only": [],
        "copy_only": [],
        "put_file_of_copy": [],
    }
    for rep in range(cfg.upload_repeats):
        job_store = S3Store(client, BUCKET, checkpoints.job_prefix(f"upload-{rep}"))
        raw_name = f"raw-upload-{rep}/{checkpoints.OBJECT_NAME}"

        stage(staging, rep + 1, master, size, digest)
        for kind in (
            ("commit_staged", "raw_fput_object")
            if rep % 2 == 0
            else ("raw_fput_object", "commit_staged")
        ):
            if kind.startswith("commit"):
                samples["commit_staged"].append(
                    timed(checkpoints.commit_staged, staging, rep + 1, job_store, 1)
                )
            else:
                samples["raw_fput_object"].append(
                    timed(client.fput_object, BUCKET, raw_name, str(master))
                )
        purge(job_store, "")
        client.remove_object(BUCKET, raw_name)
        # The parts of commit_staged, alone.
        with tempfile.TemporaryDirectory(prefix="trainyard-bench-copy-") as tmp:
            copy = Path(tmp) / "copy.pt"
            parts["copy_and_sha256"].append(timed(copy_hashing, master, copy))
            parts["sha256_only"].append(timed(copy_hashing, master, None))
            copy.unlink()
            parts["copy_only"].append(timed(shutil.copyfile, master, copy))
            parts["put_file_of_copy"].append(timed(job_store.put_file, "alone/checkpoint.pt", copy))
            purge(job_store, "")
        print(
            f"  upload rep {rep + 1}: commit_staged {size / MB / samples['commit_staged'][-1]:.0f}"
            f" MB/s, raw {size / MB / samples['raw_fput_object'][-1]:.0f} MB/s"
        )
    master.unlink()
    med = {k: median(v) for k, v in samples.items()}
    mbps = {k: size / MB / v for k, v in med.items()}
    ratio = mbps["commit_staged"] / mbps["raw_fput_object"]
    return {
        "object_bytes": size,
        "repeats": cfg.upload_repeats,
        "minio": importlib.metadata.version("minio"),
        "multipart": "minio defaults for both: 5 MiB parts, 3 parallel part uploads",
        "seconds": samples,
        "median_s": med,
        "median_mb_per_s": mbps,
        "parts_seconds": parts,
        "parts_median_s": {k: median(v) for k, v in parts.items()},
        "ratio_commit_over_raw": ratio,
        "target": f"commit_staged >= {TARGET_UPLOAD} x raw fput_object",
        "met": ratio >= TARGET_UPLOAD,
    }


# --- 4. grant to first training step --------------------------------------------------------


async def first_step(h: Harness, cfg: Config) -> dict[str, Any]:
    assert h.runner is not None
    args = ["--steps", "30", "--warmup", "5", "--report-every", "10"]
    cases: dict[str, list[dict[str, float]]] = {
        "bare": [],
        "bare_job_python": [],
        "cached": [],
        "cold_installer_cache_warm": [],
        "cold_installer_cache_empty": [],
    }

    def keep(case: str, result: dict[str, Any]) -> None:
        times = {k: result["events"][k] for k in START_PHASES}
        cases[case].append(times)
        print(f"  first step {case}: {times['grant_to_first_progress_s']:.2f} s")

    # Build the environment once (not measured; the next job tells its interpreter), then
    # the cached case, each repetition next to a bare start of the same script.
    await run_job(h, h.runner, args, REQUIREMENTS)
    job_python = (await run_job(h, h.runner, args, REQUIREMENTS))["python"]
    for _ in range(cfg.start_repeats):
        for case, python in (("bare", sys.executable), ("bare_job_python", job_python)):
            bare = await asyncio.to_thread(bare_first_step, python, h.code_dir, args)
            cases[case].append({"start_to_first_metrics_s": bare})
            print(f"  first step {case}: {bare:.2f} s")
        keep("cached", await run_job(h, h.runner, args, REQUIREMENTS))
    for _ in range(cfg.start_repeats):
        for case in ("cold_installer_cache_warm", "cold_installer_cache_empty"):
            saved = os.environ.get("UV_CACHE_DIR")
            if case.endswith("empty"):
                os.environ["UV_CACHE_DIR"] = str(h.folder("uv-cache-empty"))
            runner = await start_runner(h.folder("cold-runner"), h.nats, h.storage)
            try:
                keep(case, await run_job(h, runner, args, REQUIREMENTS))
            finally:
                await runner.shutdown()
                if saved is None:
                    os.environ.pop("UV_CACHE_DIR", None)
                else:
                    os.environ["UV_CACHE_DIR"] = saved
    medians = {
        case: {k: median([r[k] for r in runs]) for k in runs[0]}
        for case, runs in cases.items()
        if runs
    }
    return {
        "requirements": REQUIREMENTS,
        "installer": "uv",
        "job": "the training script: imports torch and the SDK, builds the MLP, reports at "
        "its first step",
        "repeats": cfg.start_repeats,
        "runs": cases,
        "median": medians,
    }


# --- the whole run ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return describe(
        gpu=None,
        torch=torch.__version__,
        minio=importlib.metadata.version("minio"),
        moto=importlib.metadata.version("moto"),
        object_store="moto S3 server on loopback (deploy/local/s3.py)",
    )


async def run_all(cfg: Config, root: Path, only: set[str]) -> dict[str, Any]:
    with (
        S3Server(log_dir=root / "logs") as s3,
        NatsServer(root / "nats", log_path=root / "logs" / "nats.log") as nats_server,
    ):
        nats_settings = NatsSettings(url=nats_server.url)
        async with Bus.connect(nats_settings, "bench") as bus:
            events = Events()
            sub = await bus.jetstream.subscribe(
                "trainyard.>",
                cb=events.record,
                ordered_consumer=True,
                deliver_policy=api.DeliverPolicy.NEW,
            )
            storage = s3.storage_settings(f"s3://{BUCKET}")
            store = S3Store(client_from_settings(storage), BUCKET)
            code_dir = root / "code"
            code_dir.mkdir()
            shutil.copyfile(TRAIN_SCRIPT, code_dir / "train.py")
            bundle = pack(code_dir)
            try:
                store.put_file(bundle_key(TEAM, bundle.sha256), bundle.path)
            finally:
                bundle.path.unlink(missing_ok=True)
            h = Harness(
                root=root,
                s3=s3,
                nats=nats_settings,
                bus=bus,
                events=events,
                store=store,
                code=CodeBundle(sha256=bundle.sha256, size_bytes=bundle.size_bytes),
                code_dir=code_dir,
            )
            h.runner = await start_runner(h.folder("runner"), nats_settings, storage)
            results: dict[str, Any] = {}
            try:
                # One unmeasured job: builds the job venv, warms the page cache.
                await run_job(h, h.runner, ["--steps", "200", "--warmup", "50"])
                if "overhead" in only:
                    print("1. platform overhead")
                    results["overhead"] = await overhead(h, cfg)
                if "checkpoint" in only:
                    print("2. checkpoint stall")
                    results["checkpoint_stall"] = await checkpoint_stall(h, cfg)
                if "upload" in only:
                    print("3. upload throughput")
                    results["upload"] = await asyncio.to_thread(
                        upload_throughput, h, cfg, h.folder("upload")
                    )
                if "start" in only:
                    print("4. grant to first step")
                    results["first_step"] = await first_step(h, cfg)
            finally:
                await h.runner.shutdown()
                await sub.unsubscribe()
    return results


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def report(results: dict[str, Any]) -> str:
    lines = []
    if o := results.get("overhead"):
        m = o["median_samples_per_s"]
        lines += [
            "",
            "| run | samples/s (median) | runner / this |",
            "|---|---:|---:|",
            f"| bare, .venv/bin/python | {m['bare']:,.0f} | {m['runner'] / m['bare']:.3f} |",
            f"| bare, job venv's python | {m['bare_job_python']:,.0f} "
            f"| {m['runner'] / m['bare_job_python']:.3f} |",
            f"| runner | {m['runner']:,.0f} | |",
            f"median of paired ratios {o['median_paired_ratio']:.3f}; per CPU-second "
            f"{o['ratio_runner_over_bare_per_cpu_s']:.3f}",
            f"target >= {TARGET_OVERHEAD}: {'met' if o['met'] else 'MISSED'}",
        ]
    if c := results.get("checkpoint_stall"):
        s, d = c["median_stall_s"], c["median_durable_after_s"]
        lines += [
            "",
            "| checkpoint | stall median | stall max | durable after (median) |",
            "|---|---:|---:|---:|",
            f"| sync | {fmt_s(s['sync'])} | {fmt_s(c['max_stall_s']['sync'])} "
            f"| {fmt_s(d['sync'])} |",
            f"| async (SDK + runner) | {fmt_s(s['async'])} | {fmt_s(c['max_stall_s']['async'])} "
            f"| {fmt_s(d['async']) if 'async' in d else '-'} |",
            f"ratio {c['ratio_async_over_sync']:.3f}, target <= {TARGET_STALL}: "
            f"{'met' if c['met'] else 'MISSED'}",
        ]
    if u := results.get("upload"):
        m, p = u["median_mb_per_s"], u["parts_median_s"]
        lines += [
            "",
            "| upload | median | MB/s |",
            "|---|---:|---:|",
            f"| commit_staged | {fmt_s(u['median_s']['commit_staged'])} "
            f"| {m['commit_staged']:.0f} |",
            f"| raw fput_object | {fmt_s(u['median_s']['raw_fput_object'])} "
            f"| {m['raw_fput_object']:.0f} |",
            f"ratio {u['ratio_commit_over_raw']:.3f}, target >= {TARGET_UPLOAD}: "
            f"{'met' if u['met'] else 'MISSED'}",
            "parts alone: " + ", ".join(f"{k} {fmt_s(v)}" for k, v in p.items()),
        ]
    if f := results.get("first_step"):
        lines += [
            "",
            "| environment | grant -> job.started | -> first job.progress | grant -> first step |",
            "|---|---:|---:|---:|",
        ]
        for case, m in f["median"].items():
            if case.startswith("bare"):
                lines.append(
                    f"| {case} (process start -> first metrics line) | | | "
                    f"{fmt_s(m['start_to_first_metrics_s'])} |"
                )
                continue
            lines.append(
                f"| {case} | {fmt_s(m['grant_to_started_s'])} "
                f"| {fmt_s(m['started_to_first_progress_s'])} "
                f"| {fmt_s(m['grant_to_first_progress_s'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and steps")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["overhead", "checkpoint", "upload", "start"],
        default=["overhead", "checkpoint", "upload", "start"],
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("note: not root, so jobs run as this user (the platform runs them as others)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = QUICK if args.quick else FULL
    load_before = os.getloadavg()
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="trainyard-bench-exec-"))
    root.chmod(0o711)
    try:
        results = asyncio.run(run_all(cfg, root, set(args.only)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(results))
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "command": "python -m bench.execution" + (" --quick" if args.quick else ""),
        "duration_s": round(time.perf_counter() - started, 1),
        "machine": machine()
        | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "config": cfg.__dict__,
        "targets_met": {
            name: results[key]["met"]
            for name, key in (
                ("platform_overhead", "overhead"),
                ("checkpoint_stall", "checkpoint_stall"),
                ("upload_throughput", "upload"),
            )
            if key in results
        },
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    try:
        shown = args.out.absolute().relative_to(REPO)
    except ValueError:
        shown = args.out
    print(f"wrote {shown} in {out['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
