"""Fixtures for the runner's integration tests: a clean bus, an event recorder, a runner
running in-process on virtual GPUs, and a fake job module written into a temp code folder."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nats.js import api
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from services.runner import handlers
from services.runner.agent import NodeAgent
from services.runner.config import Settings
from services.runner.gpus import virtual_inventory
from shared.bus import Bus
from shared.events import Envelope, Payload, nats_subject, parse_envelope
from shared.events.payloads import AllocationGranted, AllocationRevoked, JobSpec
from shared.settings import NatsSettings, StorageSettings
from shared.storage import open_store

P = TypeVar("P", bound=Payload)

FAKE_JOB = textwrap.dedent(
    '''
    """A stand-in training job: speaks the control protocol with the standard library."""
    import json, os, signal, sys, time

    mode, launches = sys.argv[1], sys.argv[2]
    with open(launches, "a") as f:
        f.write(os.environ["TRAINYARD_ALLOCATION_ID"] + "\\n")
    control = os.fdopen(int(os.environ["TRAINYARD_CONTROL_FD"]), "w", buffering=1)

    def send(message):
        control.write(json.dumps(message) + "\\n")
        control.flush()

    def checkpoint(step):
        root = os.environ["TRAINYARD_CHECKPOINT_URI"]
        send({"kind": "checkpoint", "checkpoint": {
            "uri": f"{root}/step-{step:08d}/checkpoint.pt",
            "manifest_uri": f"{root}/step-{step:08d}/manifest.json",
            "step": step, "size_bytes": 123, "sha256": "ab" * 32}})

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
def code_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "fakejob.py").write_text(FAKE_JOB)
    return folder


@pytest.fixture
def launches(tmp_path: Path) -> Path:
    return tmp_path / "launches.txt"


def launched(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def settings(tmp_path: Path, code_dir: Path, nats_settings: NatsSettings) -> Settings:
    return Settings(
        node_id=f"node-{uuid.uuid4().hex[:8]}",
        virtual_gpus=2,
        work_dir=tmp_path / "work",
        code_dir=code_dir,
        heartbeat_interval_seconds=0.2,
        progress_interval_seconds=0.2,
        kill_grace_seconds=0.5,
        drain_timeout_seconds=5,
        nats=nats_settings,
        storage=StorageSettings(uri=(tmp_path / "objects").as_uri()),
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
        tasks = [
            asyncio.create_task(agent.heartbeats()),
            asyncio.create_task(agent.drain_on(stop)),
            asyncio.create_task(
                bus.consume(
                    f"runner-{settings.node_id}",
                    [
                        nats_subject(AllocationGranted, settings.node_id),
                        nats_subject(AllocationRevoked, settings.node_id),
                    ],
                    handlers.dispatcher(agent),
                    stop,
                )
            ),
        ]
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
) -> AllocationGranted:
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
        ),
    )


async def publish(bus: Bus, payload: Payload, subject: str) -> None:
    await bus.publish(Envelope.wrap(payload, source="test", subject=subject))
