"""Billing down while jobs run: what was said meanwhile is billed once it is back, nothing
missing and nothing twice, with its ledger and rollups complete."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import pytest

from tests.integration.billing.conftest import grant_of, release_event, until
from trainyard_platform.services.billing.handlers import SUBJECTS, BillingHandlers
from trainyard_platform.services.billing.service import NAME
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import AllocationReleased
from trainyard_platform.shared.inbox import idempotent
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def released(n: int) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=f"a{n}",
        job_id=f"j{n % 7}",
        node_id="node-1",
        team=("ml", "vision")[n % 2],
        user="ada",
        gpu_flavor="a100",
        gpus=1 + n % 4,
        granted_at=T0 + timedelta(minutes=n),
        released_at=T0 + timedelta(minutes=n, seconds=90 + n),
        outcome="succeeded",
    )


async def consume_until(pool: asyncpg.Pool, bus: Bus, done: int, last_id: str) -> None:
    """Run billing's consumer until ``done`` allocations are billed and the event
    ``last_id`` is handled, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        bus.consume_batches(
            NAME, SUBJECTS, idempotent(pool, NAME, BillingHandlers().dispatch), stop
        )
    )

    async def billed() -> bool:
        return bool(
            await pool.fetchval("SELECT count(*) FROM usage_ledger") >= done
            and await pool.fetchval(
                "SELECT true FROM inbox WHERE consumer = $1 AND event_id = $2", NAME, last_id
            )
        )

    try:
        await until(billed)
    finally:
        stop.set()
        await task


async def test_what_was_said_while_billing_was_down_is_billed_once_when_it_is_back(
    pool: asyncpg.Pool, nats_settings: NatsSettings
) -> None:
    async with Bus.connect(nats_settings, "outage-test") as bus:
        first = [released(n) for n in range(20)]
        for release in first:
            await bus.publish(grant_of(release))
            await bus.publish(end := release_event(release))
        await consume_until(pool, bus, 20, end.id)
        # Down: the scheduler goes on releasing, and repeats a release it already said.
        later = [released(n) for n in range(20, 50)]
        for release in later:
            await bus.publish(grant_of(release))
            await bus.publish(release_event(release))
        await bus.publish(again := release_event(first[3]))  # said again, under a new id
        assert await pool.fetchval("SELECT count(*) FROM usage_ledger") == 20
        await consume_until(pool, bus, 50, again.id)  # back, up to the repeated release
    expected = sum(
        (
            (Decimal(r.gpus) * Decimal((r.released_at - r.granted_at).seconds) * Decimal("2.5")
             / 3600).quantize(Decimal("0.000001"))
            for r in first + later
        ),
        Decimal(0),
    )  # fmt: skip
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries") == 50
    assert await pool.fetchval("SELECT sum(cost) FROM ledger_entries") == expected
    for unit in ("hour", "day", "month"):
        assert (
            await pool.fetchval("SELECT sum(cost) FROM cost_rollups WHERE granularity = $1", unit)
            == expected
        )
