"""Billing believes a runner's report only as its allocation's own: about the allocation's
job, from the node it was granted on, at its epoch (the scheduler fences reports the same
way). A report that claims another allocation, comes from another node or carries another
epoch changes no waste figure, no job's end and no bill, and cannot keep the allocation's
own report out, whatever order they come in.

Built on ``test_waste``'s day (its ``client``), with jobs of their own later that month.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import httpx
import pytest

from tests.integration.billing.conftest import feed
from tests.integration.billing.test_waste import (
    H,
    J,
    at,
    beat,
    client,
    failed,
    figures,
    granted,
    released,
    spec,
    submitted,
    succeeded,
    supplied,
    waste,
    wrap,
)
from trainyard_platform.services.billing import budgets_repository as budgets
from trainyard_platform.services.billing.budgets import Budget, month_start
from trainyard_platform.shared.events.payloads import CheckpointRef, CheckpointSaved
from trainyard_platform.shared.events.trust import RUNNER

pytestmark = pytest.mark.integration

__all__ = ["client"]  # the fixture, with test_waste's day fed


def checkpoint(allocation_id: str, job_id: str, hours: float, epoch: int = 1) -> CheckpointSaved:
    return CheckpointSaved(
        job_id=job_id,
        allocation_id=allocation_id,
        epoch=epoch,
        checkpoint=CheckpointRef(
            uri=f"s3://c/{job_id}", manifest_uri="s3://c/m.json", step=1, size_bytes=1, sha256="0"
        ),
        saved_at=at(hours),
    )


async def test_a_report_of_another_node_or_epoch_measures_nothing(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """Two reports claim f-1 first (idle, waiting on data): one from node n-7, one at epoch
    5. Then f-1's own runner (n-1, epoch 1) reports it busy and fed: only that one counts."""
    await feed(pool, submitted("f", J, at(30)), granted("f-1", "f", J, "n-1", at(30), "ml-q"))
    await feed(
        pool,
        succeeded("f-1", "f", "n-7", at(31), gpu_utilization_mean=0.0, data_wait_fraction_mean=0.9),
        succeeded(
            "f-1", "f", "n-1", at(31), epoch=5, gpu_utilization_mean=0.0,
            data_wait_fraction_mean=0.9,
        ),
    )  # fmt: skip
    await feed(
        pool,
        succeeded("f-1", "f", "n-1", at(31), gpu_utilization_mean=90.0, data_wait_fraction_mean=0),
        released("f-1", "f", J, "n-1", at(30), at(31), "succeeded"),
    )
    rows = figures(await waste(client, group_by="job", job="f"), "job")
    assert ("idle_gpus", "f") not in rows
    assert ("idle_gpus_unmeasured", "f") not in rows  # measured, by its own runner
    assert ("input_bound", "f") not in rows  # it waited on no data
    assert ("input_bound_unmeasured", "f") not in rows


async def test_a_checkpoint_counts_only_from_the_job_s_own_allocation_and_epoch(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """g-1 (2 a100) fails after an hour, its own checkpoint half way: 30 minutes lost. A
    checkpoint said for g under another job's allocation, or at another epoch, later in the
    hour, saves nothing."""
    await feed(pool, submitted("g", J, at(40)), granted("g-1", "g", J, "n-1", at(40), "ml-q"))
    await feed(
        pool,
        wrap(checkpoint("g-1", "g", 40.5)),
        wrap(checkpoint("j-1", "g", 40.9)),  # j's allocation, not g's
        wrap(checkpoint("g-1", "g", 40.95, epoch=7)),  # not g-1's epoch
        failed("g-1", "g", "n-1", at(41), RUNNER),
        released("g-1", "g", J, "n-1", at(40), at(41), "failed"),
    )
    rows = figures(await waste(client, group_by="job", job="g"), "job")
    assert rows["lost_work", "g"] == (Decimal(3600), Decimal("2.500000"))


async def test_a_success_that_is_not_the_allocation_s_own_ends_no_job(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """h failed for good (test_waste's day). A success of h-1 from another node does not
    make it succeeded; nor does its own runner's success after the scheduler released the
    allocation otherwise (s-1, preempted: the scheduler fenced that report)."""
    await feed(pool, succeeded("h-1", "h", "n-7", at(16)))
    await feed(
        pool,
        submitted("s", J, at(50)),
        granted("s-1", "s", J, "n-1", at(50), "ml-q"),
        released("s-1", "s", J, "n-1", at(50), at(51), "preempted"),
    )
    await feed(pool, succeeded("s-1", "s", "n-1", at(51)))
    ends = dict(await pool.fetch("SELECT job_id, outcome FROM waste_job_ends"))
    assert ends["h"] == "failed"
    assert "s" not in ends


async def test_a_success_before_its_grant_ends_the_job_when_the_grant_comes(
    pool: asyncpg.Pool,
) -> None:
    """Billing's replicas apply batches concurrently, so a success may be handled before
    its grant commits: it is kept, and judged when the grant comes, without holding the
    consumer. A success claiming another node, kept first, ends nothing and keeps out
    nothing."""
    await feed(
        pool,
        submitted("u", J, at(60)),
        succeeded("u-1", "u", "n-7", at(61)),  # not u-1's node
        submitted("v", J, at(60)),
        succeeded("v-1", "v", "n-7", at(61)),
    )
    await feed(pool, succeeded("u-1", "u", "n-1", at(61)))  # its own
    assert await pool.fetchval("SELECT count(*) FROM waste_job_ends") == 0
    await feed(
        pool,
        granted("u-1", "u", J, "n-1", at(60), "ml-q"),
        granted("v-1", "v", J, "n-1", at(60), "ml-q"),
    )
    ends = dict(await pool.fetch("SELECT job_id, outcome FROM waste_job_ends"))
    assert ends == {"u": "succeeded"}


async def test_a_platform_error_from_another_node_is_the_team_s(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await feed(
        pool,
        submitted("q", J, at(70)),
        granted("q-1", "q", J, "n-1", at(70), "ml-q"),
        failed("q-1", "q", "n-8", at(71), RUNNER, "platform_error"),
        released("q-1", "q", J, "n-1", at(70), at(71), "failed"),
    )
    assert await pool.fetchval("SELECT charged_to FROM usage_ledger WHERE job_id = 'q'") == "team"


async def test_a_platform_error_from_another_node_stops_no_accrual(pool: asyncpg.Pool) -> None:
    """A running allocation accrues against its team's budgets until billed, unless its own
    runner said it failed through the platform: another node's say-so stops nothing."""
    now = datetime.now(UTC)
    start = now - timedelta(hours=1)
    await feed(
        pool,
        submitted("r", J, start),
        granted("r-1", "r", J, "n-1", start, "ml-q"),
        failed("r-1", "r", "n-8", now, RUNNER, "platform_error"),
    )
    budget = Budget("ml", None, Decimal(100), "USD", (100,), "warn", 1, "test", now)
    async with pool.acquire() as conn:
        accrued = await budgets.accrued(conn, budget, month_start(start), now)
    assert accrued > 0  # 2 a100 for the hour (5.00), within the month


async def test_a_heartbeat_holds_only_its_own_node_s_allocations(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-5 (8 cpu) holds k-1 (4 cpu) while w waits for cpu. Its heartbeats also name l-1,
    an allocation of node n-2: that holds none of n-5's GPUs, so 4 of them sat free."""
    k = spec("ml", "ada", "cpu", 4, "normal")
    await feed(
        pool,
        submitted("w", H, at(80)),
        submitted("k", k, at(80)),
        granted("k-1", "k", k, "n-5", at(80), "ml-q"),
    )
    await feed(pool, supplied("n-5", at(80)))
    await feed(pool, beat("n-5", at(81), ["k-1", "l-1"]))
    await feed(pool, beat("n-5", at(81 + 1 / 60), ["k-1", "l-1"]))
    free = await pool.fetchval("SELECT free_gpus FROM waste_unallocated WHERE node_id = 'n-5'")
    assert free == 4
