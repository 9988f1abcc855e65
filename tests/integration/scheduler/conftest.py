"""The scheduler's handlers on the real bus and a fresh database: events in, events out."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
import pytest

from trainyard_platform.services.scheduler.inventory import InventoryMode
from trainyard_platform.services.scheduler.loops import LeaderWork
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.services.scheduler.service import MIGRATIONS, NAME, SUBJECTS
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobPreempted,
    JobSpec,
    JobSubmitted,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

RUNNER_RESTARTED = "lost: the runner restarted while the job was running"
"""The reason a restarted runner reports for the jobs it lost (``runner.domain``)."""


def preempted(grant: AllocationGranted, reason: str = "revoked: preempted") -> JobPreempted:
    """The runner's report that ``grant``'s allocation ended preempted, now."""
    return JobPreempted(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        reason=reason,
    )


P = TypeVar("P", bound=Payload)
WAIT_S = 15.0


class Scheduler:
    """The scheduler's consumer and outbox relay running; helpers to talk to it."""

    def __init__(self, pool: asyncpg.Pool, bus: Bus, work: LeaderWork | None = None) -> None:
        self.pool = pool
        self.bus = bus
        self.work = work
        self.seen: list[Envelope[Payload]] = []

    def on_message(self, raw: bytes) -> None:
        self.seen.append(parse_envelope(raw))

    async def publish(self, payload: Payload, subject: str) -> Envelope[Payload]:
        envelope = Envelope.wrap(payload, source=owner(payload), subject=subject)
        await self.bus.publish(envelope)
        return envelope

    async def processed(self, envelope: Envelope[Payload]) -> None:
        """Wait until the scheduler has applied (committed) ``envelope``."""

        async def done() -> bool:
            return bool(
                await self.pool.fetchval(
                    "SELECT true FROM inbox WHERE consumer = $1 AND event_id = $2",
                    NAME,
                    envelope.id,
                )
            )

        await until(done)

    async def send(self, payload: Payload, subject: str) -> Envelope[Payload]:
        """Publish and wait until handled."""
        envelope = await self.publish(payload, subject)
        await self.processed(envelope)
        return envelope

    def events(self, kind: type[P], where: Callable[[P], bool] = lambda _: True) -> list[P]:
        return [e.data for e in self.seen if isinstance(e.data, kind) and where(e.data)]

    def envelopes(self, kind: type[Payload]) -> list[Envelope[Payload]]:
        return [e for e in self.seen if isinstance(e.data, kind)]

    async def wait_for(
        self, kind: type[P], where: Callable[[P], bool] = lambda _: True, count: int = 1
    ) -> list[P]:
        async def done() -> bool:
            return len(self.events(kind, where)) >= count

        await until(done)
        return self.events(kind, where)

    async def heartbeat(
        self,
        node_id: str,
        gpus: int,
        flavor: str = "cpu",
        topology: str = "default",
        address: str = "127.0.0.1",
    ) -> None:
        await self.send(
            RunnerHeartbeat(
                node_id=node_id,
                hostname=f"{node_id}.local",
                gpu_flavor=flavor,
                gpu_count=gpus,
                sent_at=datetime.now(UTC),
                topology=topology,
                address=address,
            ),
            node_id,
        )

    async def submit(
        self,
        job_id: str,
        gpus: int,
        flavor: str = "cpu",
        lowered_from: str | None = None,
        **spec: Any,
    ) -> None:
        """Submit a job as submission announces it (``lowered_from``: a spent budget had it
        admitted at ``low`` instead of that class)."""
        await self.send(
            JobSubmitted(
                job_id=job_id,
                spec=make_spec(gpus=gpus, gpu_flavor=flavor, **spec),
                submitted_at=datetime.now(UTC),
                lowered_from=lowered_from,
            ),
            job_id,
        )


def make_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "name": "mnist",
        "team": "vision",
        "user": "ada",
        "entrypoint": "train.py",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "seed": 1,
        "max_runtime_seconds": 3600,
    }
    fields.update(overrides)
    return JobSpec(**fields)


async def until(done: Callable[[], Any], timeout: float = WAIT_S) -> None:
    """Wait until ``done()`` (a plain or async predicate) is true; fail after ``timeout``."""
    async with asyncio.timeout(timeout):
        while True:
            result = done()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with open_pool(DatabaseSettings(url=database_url), NAME) as p:
        await migrate(p, NAME, MIGRATIONS)
        yield p


Tuned = Callable[..., Awaitable["Scheduler"]]


@pytest.fixture
async def scheduler_with(pool: asyncpg.Pool, nats_settings: NatsSettings) -> AsyncIterator[Tuned]:
    """Start the scheduler's leader work (consumer, passes) and outbox relay with the given
    tunables: ``await scheduler_with(grace_s=1, ...)``."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(
            cancel_grace_s: float = 5.0,
            restart_backoff_s: float = 0.2,
            restart_backoff_max_s: float = 300.0,
            pass_interval_s: float = 0.2,
            platform_retries: int = 3,
            cordon_after_platform_failures: int = 3,
            cordon_seconds: float = 600.0,
            max_waiting_jobs: int = 10_000,
            node_inventory: InventoryMode = InventoryMode.OPTIONAL,
            **policy: Any,
        ) -> Scheduler:
            bus = await stack.enter_async_context(Bus.connect(nats_settings, "scheduler-test"))
            # Preemption tests here check the mechanics on jobs granted a moment ago: the
            # anti-thrash minimum runtime and the spare of a borrower larger than what its
            # queue borrows are off unless a test asks for them.
            policy.setdefault("min_runtime_s", 0.0)
            policy.setdefault("oversize_protection_s", 0.0)
            tuning = Tuning(
                PolicyConfig(**policy),
                cancel_grace_s=cancel_grace_s,
                restart_backoff_s=restart_backoff_s,
                restart_backoff_max_s=restart_backoff_max_s,
                platform_retries=platform_retries,
                cordon_after_platform_failures=cordon_after_platform_failures,
                cordon_seconds=cordon_seconds,
                max_waiting_jobs=max_waiting_jobs,
                node_inventory=node_inventory,
            )
            work = LeaderWork(
                NAME,
                pool,
                bus,
                SUBJECTS,
                tuning,
                pass_interval_s=pass_interval_s,
                node_timeout_s=3600,
            )
            harness = Scheduler(pool, bus, work)

            async def collect(msg: Any) -> None:
                harness.on_message(msg.data)

            sub = await bus.nats.subscribe("trainyard.>", cb=collect)
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=0.1).run(stop)),
                asyncio.create_task(work.run(stop)),
            ]

            async def shut() -> None:
                stop.set()
                await asyncio.gather(*tasks)
                await sub.unsubscribe()

            stack.push_async_callback(shut)
            return harness

        yield start


@pytest.fixture
async def scheduler(scheduler_with: Tuned) -> Scheduler:
    return await scheduler_with()
