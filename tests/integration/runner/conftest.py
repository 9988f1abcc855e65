"""Fixtures for the runner's integration tests: a clean bus, an event recorder, a runner
running in-process on virtual GPUs, and a fake job module written into a temp code folder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nats.js import api
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from pydantic import SecretStr

from tests.fixtures.uids import job_uid_base
from trainyard.bundle import pack
from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.cgroups import Hierarchy, find_controllers
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.gpus import virtual_inventory
from trainyard_platform.services.runner.service import agent_loops
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import AllocationGranted, CodeBundle, JobSpec
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.settings import NatsSettings, StorageSettings
from trainyard_platform.shared.storage import ObjectStore, open_store


def writable_cgroups(*controllers: str) -> dict[str, Hierarchy] | None:
    """This process's own cgroup of each of ``controllers``, where a root runner started here
    would make its jobs' cgroups; None unless this process is root and each is mounted and
    writable (the cgroup tests skip then)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        found = find_controllers(
            Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
        )
    except OSError:
        return None
    wanted = {name: found.get(name) for name in controllers}
    if any(h is None or not os.access(h.own, os.W_OK) for h in wanted.values()):
        return None
    return {name: h for name, h in wanted.items() if h is not None}


P = TypeVar("P", bound=Payload)

FAKE_JOB = textwrap.dedent(
    '''
    """A stand-in training job: speaks the control protocol with the standard library."""
    import hashlib, json, os, signal, socket, sys, time
    from urllib.parse import unquote, urlparse

    mode, launches = sys.argv[1], sys.argv[2]
    with open(os.path.join(launches, os.environ["TRAINYARD_ALLOCATION_ID"]), "w") as f:
        f.write(str(os.getuid()))
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.connect(os.environ["TRAINYARD_CONTROL_SOCKET"])

    def send(message):
        control.sendall((json.dumps(message) + "\\n").encode())

    def checkpoint(step, corrupt=False):
        root = unquote(urlparse(os.environ["TRAINYARD_CHECKPOINT_URI"]).path)
        folder = f"step-{step:08d}"
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        data = f"weights at step {step}".encode()
        with open(os.path.join(root, folder, "checkpoint.pt"), "wb") as f:
            f.write(data)
        digest = hashlib.sha256(data if not corrupt else b"other weights").hexdigest()
        manifest = {"step": step, "object": f"{folder}/checkpoint.pt",
                    "size_bytes": len(data), "sha256": digest}
        with open(os.path.join(root, folder, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        send({"kind": "checkpoint", "checkpoint": {
            "uri": f"file://{root}/{folder}/checkpoint.pt",
            "manifest_uri": f"file://{root}/{folder}/manifest.json",
            "step": step, "size_bytes": len(data), "sha256": digest}})

    print("env", os.environ["TRAINYARD_JOB_ID"], os.environ["TRAINYARD_SEED"],
          repr(os.environ["CUDA_VISIBLE_DEVICES"]), flush=True)
    if mode == "succeed":
        for step in range(1, 6):
            send({"kind": "metrics", "step": step, "metrics": {"loss": 1.0 / step}})
            print(f"step {step}", flush=True)
        checkpoint(5)
        send({"kind": "not-a-kind"})
        print("done", flush=True)
        sys.exit(0)
    if mode == "restored":
        # What the runner staged for the job to load: each folder's object, as read.
        root = unquote(urlparse(os.environ["TRAINYARD_CHECKPOINT_URI"]).path)
        staged = {}
        for folder in sorted(os.listdir(root)):
            with open(os.path.join(root, folder, "checkpoint.pt"), "rb") as f:
                staged[folder] = f.read().decode("latin-1")
        with open(os.path.join(launches, "restored"), "w") as f:
            json.dump(staged, f)
        checkpoint(5)
        sys.exit(0)
    if mode == "checkpoint-twice":
        checkpoint(1)
        while not os.path.exists(os.path.join(launches, "go")):
            time.sleep(0.05)
        checkpoint(2)
        sys.exit(0)
    if mode == "refused-final-checkpoint":
        checkpoint(1)
        while not os.path.exists(os.path.join(launches, "go")):
            time.sleep(0.05)
        checkpoint(2, corrupt=True)  # its manifest's sha256 is another object's
        sys.exit(0)
    if mode == "escape":
        import subprocess
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(15, signal.SIG_IGN); time.sleep(600)"],
            start_new_session=True,
        )
        with open(os.path.join(launches, "escaped-pid"), "w") as f:
            f.write(str(child.pid))
        sys.exit(0)
    if mode == "fail":
        for i in range(60):
            print(f"noise {i}", flush=True)
        print("Traceback: something broke", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode in ("wait", "ignore-term"):
        stopping = []
        if mode == "wait":
            signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        else:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        step = 0
        send({"kind": "metrics", "step": 0, "metrics": {"loss": 9.0}})
        while not stopping:
            time.sleep(0.05)
        step = 7
        checkpoint(step)
        print("checkpointed on SIGTERM", flush=True)
        sys.exit(75)
    raise SystemExit(f"unknown mode {mode}")
    '''
)

CODE_FOR_NODE: dict[str, CodeBundle] = {}
"""The fake job's bundle, uploaded for each node's settings: ``grant`` names it."""


@pytest.fixture(scope="session", autouse=True)
def _tracer_provider() -> None:
    """A recording tracer provider, so trace context is injected into NATS headers."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())


@dataclass
class Recorded:
    envelope: Envelope[Payload]
    headers: dict[str, str]


@dataclass
class EventLog:
    """Every event on the stream, in order, with its NATS headers."""

    events: list[Recorded] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def of(self, kind: type[P], subject: str | None = None) -> list[P]:
        return [
            r.envelope.data
            for r in self.events
            if isinstance(r.envelope.data, kind) and subject in (None, r.envelope.subject)
        ]

    def records(self, subject: str) -> list[Recorded]:
        return [r for r in self.events if r.envelope.subject == subject]

    async def wait_for(
        self, predicate: Callable[[], Any], timeout: float = 30, what: str = "event"
    ) -> Any:
        """Wait until ``predicate()`` is truthy and return its value."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self.changed.clear()
                    found = predicate()
                    if found:
                        return found
                    await self.changed.wait()
        except TimeoutError:
            seen = [f"{r.envelope.type} {r.envelope.subject}" for r in self.events][-20:]
            raise AssertionError(f"no {what} within {timeout} s; last events: {seen}") from None

    async def first(self, kind: type[P], subject: str, timeout: float = 30) -> P:
        found: list[P] = await self.wait_for(
            lambda: self.of(kind, subject), timeout, what=kind.__name__
        )
        return found[0]


@pytest.fixture
async def events(bus: Bus) -> AsyncIterator[EventLog]:
    log = EventLog()

    async def record(msg: Any) -> None:
        log.events.append(Recorded(parse_envelope(msg.data), dict(msg.headers or {})))
        log.changed.set()

    sub = await bus.jetstream.subscribe(
        "trainyard.>",
        cb=record,
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.ALL,
    )
    try:
        yield log
    finally:
        await sub.unsubscribe()


@pytest.fixture
def reachable_tmp() -> Iterator[Path]:
    """A folder the jobs' own users can reach (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-test-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "fakejob.py").write_text(FAKE_JOB)
    return folder


@pytest.fixture
def launches(reachable_tmp: Path) -> Path:
    """A folder every job may write to: each launch leaves a file named by its allocation."""
    folder = reachable_tmp / "launches"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def launched(folder: Path) -> list[str]:
    """Allocation ids of the launches, oldest first."""
    files = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    return [p.name for p in files]


def upload_bundle(store: ObjectStore, team: str, folder: Path) -> CodeBundle:
    """Pack ``folder`` and store it where the submission service would have."""
    bundle = pack(folder)
    try:
        store.put_file(f"bundles/{team}/{bundle.sha256}.tar.gz", bundle.path)
    finally:
        bundle.path.unlink(missing_ok=True)
    return CodeBundle(sha256=bundle.sha256, size_bytes=bundle.size_bytes)


@pytest.fixture
def settings(
    tmp_path: Path, reachable_tmp: Path, code_dir: Path, nats_settings: NatsSettings
) -> Settings:
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    storage = StorageSettings(uri=(tmp_path / "objects").as_uri())
    CODE_FOR_NODE[node_id] = upload_bundle(open_store(storage.uri), "team-a", code_dir)
    return Settings(
        node_id=node_id,
        job_uid_base=job_uid_base(),
        virtual_gpus=2,
        work_dir=reachable_tmp / "work",
        code_dir=code_dir,
        heartbeat_interval_seconds=0.2,
        progress_interval_seconds=0.2,
        kill_grace_seconds=0.5,
        drain_timeout_seconds=5,
        nats=nats_settings,
        storage=storage,
        admin_token=SecretStr("op-token"),
        # The tests' git servers listen on loopback, which no runner fetches from unless
        # its operator allows it (``git_remote``); a test of the default empties it.
        fetch_allow_private=["127.0.0.0/8"],
    )


@dataclass
class RunningRunner:
    agent: NodeAgent
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]]

    async def shutdown(self) -> None:
        self.stop.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*self.tasks)


StartRunner = Callable[[Settings], Awaitable[RunningRunner]]


@pytest.fixture
async def start_runner() -> AsyncIterator[StartRunner]:
    """Start runners in-process (the wiring of ``services.runner.service.serve`` without
    the HTTP server and signal handling); all are shut down at the end."""
    started: list[tuple[RunningRunner, contextlib.AsyncExitStack]] = []

    async def start(settings: Settings) -> RunningRunner:
        stack = contextlib.AsyncExitStack()
        bus = await stack.enter_async_context(Bus.connect(settings.nats, "runner-under-test"))
        store = open_store(settings.storage.uri, settings.storage)
        stop = asyncio.Event()
        agent = NodeAgent(settings, bus, store, virtual_inventory(settings.virtual_gpus or 0), stop)
        await agent.recover()
        tasks = [asyncio.create_task(loop) for loop in agent_loops(agent, bus, stop).values()]
        runner = RunningRunner(agent, stop, tasks)
        started.append((runner, stack))
        return runner

    yield start
    for runner, stack in reversed(started):
        if not runner.stop.is_set():
            await runner.shutdown()
        await stack.aclose()


def grant(
    node_id: str,
    args: list[str],
    *,
    entrypoint: str = "fakejob",
    job_id: str | None = None,
    max_runtime_seconds: int = 120,
    gpu_indices: list[int] | None = None,
    code: CodeBundle | None = None,
) -> AllocationGranted:
    """A grant of one GPU of ``node_id`` to a job running the fake job's bundle (or
    ``code``) with ``args``."""
    job_id = job_id or f"job-{uuid.uuid4().hex[:8]}"
    return AllocationGranted(
        allocation_id=str(uuid.uuid4()),
        job_id=job_id,
        node_id=node_id,
        gpu_indices=[1] if gpu_indices is None else gpu_indices,
        epoch=3,
        attempt=1,
        granted_at=datetime.now(UTC),
        spec=JobSpec(
            name="fake",
            team="team-a",
            user="alice",
            entrypoint=entrypoint,
            args=args,
            gpus=1,
            gpu_flavor="cpu",
            hyperparameters={"lr": 0.1},
            seed=1234,
            max_runtime_seconds=max_runtime_seconds,
            code=code or CODE_FOR_NODE.get(node_id),
        ),
    )


async def publish(bus: Bus, payload: Payload, subject: str) -> None:
    await bus.publish(Envelope.wrap(payload, source=owner(payload), subject=subject))
