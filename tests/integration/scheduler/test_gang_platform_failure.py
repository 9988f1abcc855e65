"""A gang attempt that failed through the platform costs its team nothing, for every member.

The real scheduler (leader work and outbox relay) and billing's real consumer (inbox,
handlers, ledger, outbox) run on NATS and PostgreSQL (each its own schema). A job of two
nodes is granted on n1 and n2; n1's runner reports a ``platform_error``; the scheduler
releases both members for it and fences n2, whose runner reports only its stop
(``job.preempted``, fenced). Billing must charge both allocations to the platform, and the
scheduler must add neither to the team's fair-share usage.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal

import asyncpg
import pytest
from pydantic import SecretStr

from tests.integration.scheduler.conftest import Tuned, preempted, until
from trainyard_platform.services.billing.config import Settings as BillingSettings
from trainyard_platform.services.billing.handlers import SUBJECTS as BILLING_SUBJECTS
from trainyard_platform.services.billing.handlers import BillingHandlers
from trainyard_platform.services.billing.service import MIGRATIONS as BILLING_MIGRATIONS
from trainyard_platform.services.billing.service import NAME as BILLING
from trainyard_platform.services.billing.service import seed_prices
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    CostRecorded,
    JobFailed,
)
from trainyard_platform.shared.inbox import idempotent
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

pytestmark = pytest.mark.integration


@pytest.fixture
async def billing(database_url: str, nats_settings: NatsSettings) -> AsyncIterator[asyncpg.Pool]:
    """Billing's consumer and outbox relay running on the bus; its database pool."""
    async with (
        open_pool(DatabaseSettings(url=database_url), BILLING) as pool,
        Bus.connect(nats_settings, "billing-test") as bus,
    ):
        await migrate(pool, BILLING, BILLING_MIGRATIONS)
        settings = BillingSettings(prices={"cpu": 3.6}, currency="USD", admin_token=SecretStr("t"))
        await seed_prices(pool, settings)
        stop = asyncio.Event()
        handle = idempotent(pool, BILLING, BillingHandlers().dispatch)
        tasks = [
            asyncio.create_task(bus.consume_batches(BILLING, BILLING_SUBJECTS, handle, stop)),
            asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=0.05).run(stop)),
        ]
        try:
            yield pool
        finally:
            stop.set()
            await asyncio.gather(*tasks)


def platform_failure(grant: AllocationGranted) -> JobFailed:
    """The runner's report that ``grant``'s attempt failed through the platform."""
    return JobFailed(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        exit_code=None,
        reason="No space left on device",
        failure_kind="platform_error",
        node_fault=True,
    )


async def test_every_member_of_a_gang_that_failed_through_the_platform_is_the_platform_s(
    scheduler_with: Tuned, billing: asyncpg.Pool, pool: asyncpg.Pool
) -> None:
    """Before, only n1's allocation (whose runner reported the failure) was charged to the
    platform; n2's, released by the same decision and fenced, was billed to the team. And
    the scheduler added both members' time to the team's fair-share usage all the same."""
    scheduler = await scheduler_with(platform_retries=0)  # the job fails: no new attempt
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.heartbeat("n2", gpus=1)
    await scheduler.submit("job-1", gpus=2)
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    reporter, peer = sorted(grants, key=lambda g: g.node_id)
    assert (reporter.node_id, peer.node_id) == ("n1", "n2")
    members = {reporter.allocation_id, peer.allocation_id}

    await scheduler.send(platform_failure(reporter), "job-1")
    releases = await scheduler.wait_for(AllocationReleased, count=2)
    assert {r.allocation_id for r in releases} == members
    assert all(r.outcome == "failed" and r.platform_failure for r in releases), releases
    # Released (and said) in the transaction that would have charged the team's usage.
    assert await pool.fetchval("SELECT gpu_seconds FROM usage WHERE team = 'vision'") is None
    revoked = await scheduler.wait_for(AllocationRevoked)
    assert [(r.allocation_id, r.reason) for r in revoked] == [(peer.allocation_id, "fenced")]
    # The fenced runner reports its stop, no failure of its own (the scheduler ignores it).
    await scheduler.send(preempted(peer, "fenced"), "job-1")

    async def billed() -> bool:
        count = await billing.fetchval(
            "SELECT count(*) FROM usage_ledger WHERE allocation_id = ANY($1::text[])",
            sorted(members),
        )
        return bool(count == 2)

    await until(billed)
    bills = {
        r["allocation_id"]: (r["charged_to"], r["outcome"])
        for r in await billing.fetch("SELECT allocation_id, charged_to, outcome FROM usage_ledger")
    }
    assert bills == {
        reporter.allocation_id: ("platform", "failed"),
        peer.allocation_id: ("platform", "failed"),
    }
    # Nothing of the team's in the ledger, nor said to the other services.
    charged = await billing.fetchval("SELECT coalesce(sum(cost), 0) FROM ledger_entries")
    assert charged == Decimal(0)
    said: dict[str, float] = {}
    for r in await billing.fetch("SELECT body FROM outbox ORDER BY seq"):
        data = parse_envelope(r["body"]).data
        if isinstance(data, CostRecorded):
            said[data.allocation_id] = data.cost
    assert said == {reporter.allocation_id: 0, peer.allocation_id: 0}
    # The waste report counts both members' time as the platform's, neither as the team's
    # failed attempt.
    figures = {
        (r["allocation_id"], r["figure"])
        for r in await billing.fetch(
            "SELECT allocation_id, figure FROM waste_allocation_parts "
            "WHERE figure IN ('platform_failure', 'failed_attempts')"
        )
    }
    assert figures == {
        (reporter.allocation_id, "platform_failure"),
        (peer.allocation_id, "platform_failure"),
    }
