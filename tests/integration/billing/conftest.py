"""Billing's handlers on the real bus and a fresh database: releases in, costs out."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from pydantic import SecretStr

from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.handlers import SUBJECTS, BillingHandlers
from trainyard_platform.services.billing.service import MIGRATIONS, NAME, seed_prices
from trainyard_platform.shared.bus import Bus, Delivery
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    CostRecorded,
    JobSpec,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.inbox import idempotent
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

WAIT_S = 15.0


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
        await seed_prices(
            p,
            Settings(
                prices={"cpu": 0.10, "a100": 2.50}, currency="USD", admin_token=SecretStr("t")
            ),
        )
        yield p


class Billing:
    """Billing's consumer and outbox relay running; helpers to talk to it."""

    def __init__(self, pool: asyncpg.Pool, bus: Bus) -> None:
        self.pool = pool
        self.bus = bus
        self.seen: list[Envelope[Payload]] = []

    async def announce(self, released: AllocationReleased) -> None:
        """Publish the grant that ``released`` ends, as the scheduler would have: billing
        meters only allocations it saw announced."""
        await self.bus.publish(grant_of(released))

    async def send(self, released: AllocationReleased) -> Envelope[Payload]:
        """Announce its grant, publish it and wait until billing has handled it."""
        await self.announce(released)
        payload: Payload = released
        envelope = Envelope.wrap(payload, source=owner(payload), subject=released.job_id)
        await self.bus.publish(envelope)
        await self.processed(envelope)
        return envelope

    async def processed(self, envelope: Envelope[Payload]) -> None:
        async def done() -> bool:
            return bool(
                await self.pool.fetchval(
                    "SELECT true FROM inbox WHERE consumer = $1 AND event_id = $2",
                    NAME,
                    envelope.id,
                )
            )

        await until(done)

    def costs(self) -> list[CostRecorded]:
        return [e.data for e in self.seen if isinstance(e.data, CostRecorded)]


def grant_of(
    released: AllocationReleased,
    *,
    project: str = "default",
    queue: str | None = None,
    epoch: int = 1,
    attempt: int = 1,
    cpus_per_gpu: int = 0,
    memory_gib_per_gpu: int = 0,
    max_runtime_seconds: int = 3600,
) -> Envelope[Payload]:
    """The ``allocation.granted`` (from the scheduler) that ``released`` ends, of a job
    declaring ``cpus_per_gpu``, ``memory_gib_per_gpu`` and ``max_runtime_seconds`` (its
    accrual ends by its grant plus that and the kill grace, as its bill does)."""
    grant: Payload = AllocationGranted(
        allocation_id=released.allocation_id,
        job_id=released.job_id,
        node_id=released.node_id,
        gpu_indices=list(range(released.gpus)),
        epoch=epoch,
        attempt=attempt,
        granted_at=released.granted_at,
        spec=JobSpec(
            name="job",
            team=released.team,
            user=released.user,
            gpus=max(released.gpus, 1),
            gpu_flavor=released.gpu_flavor,
            seed=1,
            max_runtime_seconds=max_runtime_seconds,
            project=project,
            cpus_per_gpu=cpus_per_gpu,
            memory_gib_per_gpu=memory_gib_per_gpu,
        ),
        queue=queue,
    )
    return Envelope.wrap(grant, source=owner(grant), subject=released.node_id)


def release_event(released: AllocationReleased) -> Envelope[Payload]:
    payload: Payload = released
    return Envelope.wrap(payload, source=owner(payload), subject=released.job_id)


async def feed(pool: asyncpg.Pool, *envelopes: Envelope[Payload]) -> None:
    """Hand ``envelopes`` to billing's consumer as one batch (its inbox and handlers, as
    ``Bus.consume_batches`` would, without the bus)."""
    await idempotent(pool, NAME, BillingHandlers().dispatch)([Delivery(e) for e in envelopes])


@pytest.fixture
async def billing(pool: asyncpg.Pool, nats_settings: NatsSettings) -> AsyncIterator[Billing]:
    async with Bus.connect(nats_settings, "billing-test") as bus:
        harness = Billing(pool, bus)

        async def collect(msg: Any) -> None:
            harness.seen.append(parse_envelope(msg.data))

        sub = await bus.nats.subscribe("trainyard.>", cb=collect)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=0.1).run(stop)),
            asyncio.create_task(
                bus.consume_batches(
                    NAME,
                    SUBJECTS,
                    idempotent(pool, NAME, BillingHandlers().dispatch),
                    stop,
                )
            ),
        ]
        try:
            yield harness
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await sub.unsubscribe()
