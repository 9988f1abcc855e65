"""Cordoned nodes with the real scheduler pieces (leader work, passes, admin API) on NATS and
PostgreSQL: no new allocation on a cordoned node, its running job goes on, an uncordon makes
it usable again; the scheduler cordons a node after repeated platform failures, steers the
retry elsewhere, and lifts its cordon at its end."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.scheduler.conftest import Scheduler, Tuned, until
from trainyard_platform.services.scheduler.api import create_app
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationRevoked,
    JobFailed,
    JobPending,
    JobSucceeded,
)

pytestmark = pytest.mark.integration

TOKEN = "op-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def http(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(pool, service_guard(SecretStr(TOKEN))))
    async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as client:
        yield client


def platform_failure(
    grant: AllocationGranted,
    reason: str = "No space left on device",
    node_fault: bool = True,
) -> JobFailed:
    """The runner's report of a platform failure: the node's own (``node_fault``), or one
    that follows the job's input (its git host, its command)."""
    return JobFailed(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        exit_code=None,
        reason=reason,
        failure_kind="platform_error",
        node_fault=node_fault,
    )


def succeeded(grant: AllocationGranted) -> JobSucceeded:
    return JobSucceeded(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
    )


async def node_row(pool: asyncpg.Pool, node_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT cordoned_at, cordon_reason, cordoned_by, cordoned_until, platform_failures "
        "FROM nodes WHERE node_id = $1",
        node_id,
    )


async def queued_node(http: httpx.AsyncClient, node_id: str) -> dict[str, Any]:
    response = await http.get("/v1/queue", headers=AUTH)
    assert response.status_code == 200, response.text
    (node,) = [n for n in response.json()["nodes"] if n["node_id"] == node_id]
    return dict(node)


async def test_no_new_job_on_a_cordoned_node_its_running_job_goes_on_and_uncordon_frees_it(
    scheduler: Scheduler, http: httpx.AsyncClient
) -> None:
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("job-1", gpus=1)
    (first,) = await scheduler.wait_for(AllocationGranted)
    assert first.node_id == "n1"
    await scheduler.heartbeat("n2", gpus=1)

    response = await http.post(
        "/v1/admin/nodes/n1/cordon", json={"reason": "replacing a fan"}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    cordon = response.json()["cordon"]
    assert (cordon["reason"], cordon["by"], cordon["until"]) == (
        "replacing a fan",
        "operator-token",
        None,
    )
    shown = await queued_node(http, "n1")
    assert shown["cordon"]["reason"] == "replacing a fan"
    assert shown["free_gpus"] == [] and shown["used_gpus"] == {"0": "job-1"}

    # Best fit would take n1's free GPU (the fuller node); cordoned, it is n2's.
    await scheduler.submit("job-2", gpus=1)
    second = (await scheduler.wait_for(AllocationGranted, count=2))[-1]
    assert (second.job_id, second.node_id) == ("job-2", "n2")

    # Nothing is free but n1's GPU: job-3 waits, and is not told that GPU is free.
    await scheduler.submit("job-3", gpus=1)
    (pending,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "job-3")
    assert "n1" not in pending.reason, pending.reason

    # job-1 runs on: never revoked, its allocation live.
    assert scheduler.events(AllocationRevoked) == []
    live = await scheduler.pool.fetchval(
        "SELECT count(*) FROM allocations WHERE job_id = 'job-1' AND released_at IS NULL"
    )
    assert live == 1

    response = await http.post("/v1/admin/nodes/n1/uncordon", headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json() == {"node_id": "n1", "cordon": None}
    third = (await scheduler.wait_for(AllocationGranted, count=3))[-1]
    assert (third.job_id, third.node_id) == ("job-3", "n1")
    log = (await http.get("/v1/audit", headers=AUTH)).json()
    assert [(e["action"], e["target"]) for e in reversed(log)] == [
        ("cordon node", "n1"),
        ("uncordon node", "n1"),
    ]


async def test_repeated_platform_failures_cordon_the_node_until_its_cordon_runs_out(
    scheduler_with: Tuned, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = await scheduler_with(
        restart_backoff_s=0.1, platform_retries=5, cordon_after_platform_failures=2
    )
    caplog.set_level(logging.WARNING, logger="trainyard_platform.services.scheduler.cordon")
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.send(platform_failure(grant), "job-1")
    assert (await node_row(scheduler.pool, "n1"))["cordoned_at"] is None  # one is not enough
    grant = (await scheduler.wait_for(AllocationGranted, count=2))[-1]
    assert grant.node_id == "n1"  # the only node: the retry goes back to it
    await scheduler.send(platform_failure(grant), "job-1")

    row = await node_row(scheduler.pool, "n1")
    assert row["cordon_reason"] == "2 platform failures in a row: No space left on device"
    assert row["cordoned_by"] == "scheduler" and row["cordoned_until"] is not None
    assert row["platform_failures"] == 2
    assert any("n1" in r.getMessage() and "cordoned" in r.getMessage() for r in caplog.records)

    # The next retry goes to the node that works.
    await scheduler.heartbeat("n2", gpus=1)
    grant = (await scheduler.wait_for(AllocationGranted, count=3))[-1]
    assert (grant.job_id, grant.node_id) == ("job-1", "n2")

    # job-2 waits (n2 is busy, n1 cordoned) until n1's cordon runs out.
    await scheduler.submit("job-2", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "job-2")
    await scheduler.pool.execute(
        "UPDATE nodes SET cordoned_until = now() - interval '1 second' WHERE node_id = 'n1'"
    )
    later = (await scheduler.wait_for(AllocationGranted, count=4))[-1]
    assert (later.job_id, later.node_id) == ("job-2", "n1")
    row = await node_row(scheduler.pool, "n1")
    assert (row["cordoned_at"], row["cordoned_by"], row["platform_failures"]) == (None, None, 2)

    # A success on n1 resets its count.
    await scheduler.send(succeeded(later), "job-2")

    async def reset() -> bool:
        return (await node_row(scheduler.pool, "n1"))["platform_failures"] == 0

    await until(reset)


async def test_platform_failures_that_follow_the_jobs_input_never_cordon_the_node(
    scheduler_with: Tuned,
) -> None:
    # Before: every platform_error counted, so a tenant whose job's git host answered 5xx
    # (or did not resolve, or whose command was not on PATH) took each node it landed on out
    # of service, K failures at a time. Now the job is retried and fails for good once its
    # platform retries are used up, and the node stays in service, its count at 0.
    scheduler = await scheduler_with(
        restart_backoff_s=0.1, platform_retries=4, cordon_after_platform_failures=2
    )
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    tenant_caused = (
        "spec.code.repository: its server failed to serve the fetch; git fetch of "
        "https://git.example/x.git failed: error: RPC failed; HTTP 503",
        "spec.code.repository: its host name did not resolve from this node",
        "spec.command: 'no-such-program' cannot be run on this node: No such file or directory",
        "spec.requirements: the job's requirements could not be installed: timed out",
        "spec.code.repository: its server failed to serve the fetch",
    )
    for attempt, reason in enumerate(tenant_caused, start=1):
        grant = (await scheduler.wait_for(AllocationGranted, count=attempt))[-1]
        assert (grant.job_id, grant.node_id) == ("job-1", "n1")
        await scheduler.send(platform_failure(grant, reason, node_fault=False), "job-1")

    async def failed_for_good() -> bool:
        status = await scheduler.pool.fetchval("SELECT status FROM jobs WHERE job_id = 'job-1'")
        return bool(status == "FAILED")

    await until(failed_for_good)
    row = await node_row(scheduler.pool, "n1")
    assert (row["cordoned_at"], row["cordoned_by"], row["platform_failures"]) == (None, None, 0)

    # The node still takes work, and one failure of its own still counts.
    await scheduler.submit("job-2", gpus=1)
    grant = (await scheduler.wait_for(AllocationGranted, count=len(tenant_caused) + 1))[-1]
    assert (grant.job_id, grant.node_id) == ("job-2", "n1")
    await scheduler.send(platform_failure(grant), "job-2")

    async def counted() -> bool:
        return bool((await node_row(scheduler.pool, "n1"))["platform_failures"] == 1)

    await until(counted)


async def test_a_gang_member_cannot_end_its_peers_allocation_nor_cordon_its_node(
    scheduler_with: Tuned,
) -> None:
    """A node's grant names every member of its gang (allocation, node), and their epochs: a
    report about a peer's allocation is still not believed of it. The node a report names
    is the one that sent it (its subject, which only that node may publish), so node n1's
    word on n2's allocation ends nothing and counts nothing against n2; n2's own does."""
    scheduler = await scheduler_with(
        restart_backoff_s=0.1, platform_retries=5, cordon_after_platform_failures=1
    )
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.heartbeat("n2", gpus=1)
    await scheduler.submit("job-1", gpus=2)
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    mine, peer = sorted(grants, key=lambda g: g.node_id)
    assert (mine.node_id, peer.node_id) == ("n1", "n2")
    assert {m.allocation_id for m in mine.gang} == {mine.allocation_id, peer.allocation_id}

    lie = platform_failure(peer).model_copy(update={"node_id": "n1"})
    await scheduler.send(lie, "job-1")
    row = await node_row(scheduler.pool, "n2")
    assert (row["cordoned_at"], row["platform_failures"]) == (None, 0)
    assert not scheduler.events(AllocationRevoked)
    live = await scheduler.pool.fetchval(
        "SELECT count(*) FROM allocations WHERE job_id = 'job-1' AND released_at IS NULL"
    )
    assert live == 2

    await scheduler.send(platform_failure(peer), "job-1")  # n2's own word is believed

    async def cordoned() -> bool:
        return (await node_row(scheduler.pool, "n2"))["cordoned_at"] is not None

    await until(cordoned)


async def test_a_cordon_change_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    scheduler: Scheduler, http: httpx.AsyncClient
) -> None:
    """``GET /v1/admin/nodes/{node}/cordon`` is the node's cordon with its ``ETag``;
    ``cordon`` and ``uncordon`` with ``If-Match: <it>`` proceed while the cordon is as it
    was read and are 412, naming ``If-Match`` and that it changed, once another operator
    changed it since: one operator's uncordon no longer lifts a cordon another put in place
    after the first looked. Without a condition, as before. (Before, there was no such
    ``GET`` nor tag, and both writes ignored the headers.)"""
    await scheduler.heartbeat("n1", gpus=1)
    assert (await http.get("/v1/admin/nodes/nope/cordon", headers=AUTH)).status_code == 404
    read = await http.get("/v1/admin/nodes/n1/cordon", headers=AUTH)
    assert read.status_code == 200 and read.json() == {"node_id": "n1", "cordon": None}
    tag = read.headers["ETag"]
    # Another operator cordons it after this one looked.
    other = await http.post(
        "/v1/admin/nodes/n1/cordon",
        json={"reason": "replacing a fan"},
        headers={**AUTH, "If-Match": tag},
    )
    assert other.status_code == 200, other.text
    assert other.headers["ETag"] not in (tag, None)
    stale = {**AUTH, "If-Match": tag}
    for response in (
        await http.post("/v1/admin/nodes/n1/uncordon", headers=stale),
        await http.post("/v1/admin/nodes/n1/cordon", json={"reason": "mine"}, headers=stale),
    ):
        assert response.status_code == 412, response.text
        (error,) = response.json()["errors"]
        assert error["field"] == "If-Match"
        assert "the cordon of node n1 was changed since it was read" in error["message"]
    now = await http.get("/v1/admin/nodes/n1/cordon", headers=AUTH)
    assert now.json()["cordon"]["reason"] == "replacing a fan"
    assert now.headers["ETag"] == other.headers["ETag"]
    lifted = await http.post(
        "/v1/admin/nodes/n1/uncordon", headers={**AUTH, "If-Match": now.headers["ETag"]}
    )
    assert lifted.status_code == 200 and lifted.json()["cordon"] is None, lifted.text
    # Without a condition, as before.
    plain = await http.post("/v1/admin/nodes/n1/cordon", json={"reason": "again"}, headers=AUTH)
    assert plain.status_code == 200, plain.text
    assert (await http.post("/v1/admin/nodes/n1/uncordon", headers=AUTH)).status_code == 200
    log = (await http.get("/v1/audit", headers=AUTH)).json()
    assert [e["action"] for e in reversed(log)] == [
        "cordon node",
        "uncordon node",
        "cordon node",
        "uncordon node",
    ]
