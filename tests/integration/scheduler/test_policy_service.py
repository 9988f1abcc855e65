"""The policy wired into the service, through NATS and Postgres: priority preemption, reclaim
across a cohort, forced release after the grace, gangs, checkpoint-aware victims, and what a
pending job is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.fixtures.json_log import json_lines
from tests.integration.scheduler.conftest import Scheduler, Tuned, make_spec, preempted, until
from trainyard_platform.services.scheduler import admin
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admin_schemas import (
    CohortRequest,
    QueueRequest,
    QuotaRequest,
)
from trainyard_platform.services.scheduler.api import create_app
from trainyard_platform.services.scheduler.scheduling import run_pass
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    CheckpointRef,
    CheckpointSaved,
    JobFailed,
    JobPending,
    JobPreempted,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.payloads import Environment as RunEnvironment
from trainyard_platform.shared.identity import operator_token_principal

OPERATOR = operator_token_principal()

pytestmark = pytest.mark.integration


def started(grant: AllocationGranted) -> JobStarted:
    return JobStarted(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        attempt=grant.attempt,
        epoch=grant.epoch,
        started_at=datetime.now(UTC),
        code_version="abc",
        environment=RunEnvironment(
            python="3.11",
            torch="2",
            platform="linux",
            hostname="h",
            node_id=grant.node_id,
            gpu_flavor="cpu",
        ),
        spec=grant.spec,
    )


def checkpoint(grant: AllocationGranted, saved_at: datetime) -> CheckpointSaved:
    ref = CheckpointRef(uri="s3://b/c", manifest_uri="s3://b/m", step=10, size_bytes=1, sha256="0")
    return CheckpointSaved(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        epoch=grant.epoch,
        checkpoint=ref,
        saved_at=saved_at,
    )


async def job(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, attempt, queue, priority_class FROM jobs WHERE job_id = $1", job_id
    )


async def running(scheduler: Scheduler, job_id: str) -> AllocationGranted:
    (grant,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == job_id)
    await scheduler.send(started(grant), job_id)
    return grant


async def test_a_passs_line_about_a_job_names_that_job(scheduler: Scheduler) -> None:
    # The pass that gives "low" its notice runs while the scheduler handles "high"'s
    # submission: its line about "low" carried job_id "high", the job of the event handled.
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.submit("low", gpus=4, priority="low")
    await running(scheduler, "low")
    with json_lines("trainyard_platform.services.scheduler", "scheduler") as log:
        await scheduler.submit("high", gpus=4, priority="high")
        await scheduler.wait_for(AllocationRevoked)
    [notice] = [line for line in log.lines if "preemption notice to low" in line["message"]]
    assert notice["job_id"] == "low"


async def test_high_priority_preempts_low_and_gets_its_gpus(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.submit("low", gpus=4, priority="low")
    low = await running(scheduler, "low")

    await scheduler.submit("high", gpus=4, priority="high")
    (revoke,) = await scheduler.wait_for(AllocationRevoked)
    assert (revoke.allocation_id, revoke.epoch, revoke.reason, revoke.node_id) == (
        low.allocation_id,
        low.epoch,
        "preempted",
        "n1",
    )
    assert revoke.grace_seconds == 300.0  # the policy's default grace
    (envelope,) = scheduler.envelopes(AllocationRevoked)
    assert envelope.subject == "n1"
    # (Later passes may tell it more, e.g. that its victim is leaving: the first is enough.)
    waits = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "high"))[0]
    assert waits.reason.startswith("freeing GPUs held by lower priority jobs of its queue (low)")
    assert waits.blocking == "low"
    assert waits.estimated_start is not None
    notice = await scheduler.pool.fetchval("SELECT notice_reason FROM allocations")
    assert notice.startswith(
        "preempted for job high: priority high outranks low in queue default:vision; it loses ~"
    )
    assert notice.endswith(" of work on 4 GPUs since it started")
    assert revoke.detail == notice  # the event says why, as the allocation records it
    assert (await job(scheduler.pool, "low"))["status"] == "RUNNING"  # it keeps its GPUs for now

    # The runner checkpoints and stops the victim: the high job gets the GPUs.
    await scheduler.send(preempted(low), "low")
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert (released.allocation_id, released.outcome) == (low.allocation_id, "preempted")
    (high,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "high")
    assert (high.node_id, high.gpu_indices) == ("n1", [0, 1, 2, 3])
    # The victim is back in its queue for its next attempt, and told why it waits.
    requeued = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "low"))[0]
    assert requeued.blocking == "high"
    row = await job(scheduler.pool, "low")
    assert (row["status"], row["attempt"], row["priority_class"]) == ("QUEUED", 1, "low")


async def test_a_lender_reclaims_borrowed_quota_across_its_cohort(scheduler: Scheduler) -> None:
    pool = scheduler.pool
    await scheduler.heartbeat("n1", gpus=4)
    await admin.put_cohort(pool, "research", CohortRequest(), OPERATOR)
    for name, team in (("qa", "team-a"), ("qb", "team-b")):
        quotas = {"cpu": QuotaRequest(nominal=2)}
        body = QueueRequest(team=team, cohort="research", quotas=quotas)
        await admin.put_queue(pool, name, body, OPERATOR)

    # team-b borrows team-a's idle quota.
    await scheduler.submit("b-big", gpus=4, team="team-b")
    borrower = await running(scheduler, "b-big")
    assert await pool.fetchval("SELECT borrowed FROM allocations") is True
    transport = httpx.ASGITransport(app=create_app(pool, service_guard(SecretStr("t"))))
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as http:
        view = (await http.get("/v1/queue", headers={"Authorization": "Bearer t"})).json()
    qb = next(q for q in view["queues"] if q["name"] == "qb")
    assert [(q["flavor"], q["nominal"], q["used"], q["borrowed"]) for q in qb["quotas"]] == [
        ("cpu", 2, 4, 2)
    ]
    assert [r["job_id"] for r in qb["running"]] == ["b-big"]
    assert view["cohorts"] == [
        {
            "name": "research",
            "queues": ["qa", "qb"],
            "pools": [{"flavor": "cpu", "size": 4, "used": 4}],
        }
    ]

    # team-a wants its quota back.
    await scheduler.submit("a-job", gpus=2, team="team-a")
    (revoke,) = await scheduler.wait_for(AllocationRevoked)
    assert (revoke.allocation_id, revoke.reason) == (borrower.allocation_id, "preempted")
    waits = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "a-job"))[0]
    # team-a reads this: team-b's job is named by its team only.
    assert waits.reason.startswith(
        "freeing GPUs held by jobs running on borrowed quota (a team-b job)"
    )
    assert waits.blocking == "team-b"
    await scheduler.send(preempted(borrower), "b-big")
    (granted,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "a-job")
    assert len(granted.gpu_indices) == 2
    requeued = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "b-big"))[0]
    assert "qa" in (requeued.blocking or "")
    assert (await job(pool, "b-big"))["queue"] == "qb"


async def test_a_victim_that_does_not_stop_loses_its_gpus_after_the_grace(
    scheduler_with: Tuned,
) -> None:
    scheduler = await scheduler_with(grace_s=1.0)
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("low", gpus=2, priority="low")
    low = await running(scheduler, "low")
    await scheduler.submit("high", gpus=2, priority="high")
    (revoke,) = await scheduler.wait_for(AllocationRevoked)
    assert (revoke.reason, revoke.grace_seconds) == ("preempted", 1.0)

    # The runner never answers: after the grace the scheduler revokes by force.
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert (released.allocation_id, released.outcome) == (low.allocation_id, "preempted")
    fenced = await scheduler.wait_for(AllocationRevoked, lambda r: r.reason == "fenced")
    assert [(r.allocation_id, r.node_id) for r in fenced] == [(low.allocation_id, "n1")]
    (said,) = await scheduler.wait_for(JobPreempted, lambda p: p.job_id == "low")
    assert said.allocation_id == low.allocation_id
    assert [e.source for e in scheduler.envelopes(JobPreempted)] == ["trainyard/scheduler"]
    (high,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "high")
    assert high.epoch > low.epoch
    row = await job(scheduler.pool, "low")
    assert (row["status"], row["attempt"]) == ("QUEUED", 1)

    # The old runner's late report is fenced off: nothing changes.
    late = JobSucceeded(
        job_id="low",
        allocation_id=low.allocation_id,
        node_id="n1",
        epoch=low.epoch,
        finished_at=datetime.now(UTC),
    )
    await scheduler.send(late, "low")
    await scheduler.send(preempted(low), "low")
    assert (await job(scheduler.pool, "low"))["status"] == "QUEUED"
    assert len(scheduler.events(AllocationReleased)) == 1


async def test_pending_jobs_are_told_who_blocks_and_what_would_help(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.submit("j1", gpus=2)
    await running(scheduler, "j1")
    await scheduler.submit("j2", gpus=4)
    (waits,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "j2")
    assert waits.position == 1
    assert waits.blocking == "j1"
    assert waits.suggestion == "asking for 2 GPUs would let it start now"
    assert waits.estimated_start is not None
    row = await scheduler.pool.fetchrow(
        "SELECT pending_reason, pending_blocking, pending_suggestion, pending_estimated_start "
        "FROM jobs WHERE job_id = 'j2'"
    )
    assert tuple(row) == (waits.reason, "j1", waits.suggestion, waits.estimated_start)

    # Passes that change nothing publish nothing.
    assert scheduler.work is not None
    passes = scheduler.work.passes.passes
    await until(lambda: scheduler.work is not None and scheduler.work.passes.passes >= passes + 5)
    assert len(scheduler.events(JobPending, lambda p: p.job_id == "j2")) == 1


async def test_the_victim_is_the_job_that_loses_the_least_work(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("old-save", gpus=1, priority="low")
    await scheduler.submit("fresh-save", gpus=1, priority="low")
    stale = await running(scheduler, "old-save")
    fresh = await running(scheduler, "fresh-save")
    # Both have run half an hour; only one saved a checkpoint a moment ago.
    await scheduler.pool.execute(
        "UPDATE allocations SET granted_at = granted_at - interval '30 minutes'"
    )
    await scheduler.send(checkpoint(fresh, datetime.now(UTC)), "fresh-save")
    await scheduler.send(checkpoint(stale, datetime.now(UTC) - timedelta(hours=2)), "old-save")
    saved = await scheduler.pool.fetch(
        "SELECT job_id FROM allocations WHERE last_checkpoint_at IS NOT NULL ORDER BY job_id"
    )
    assert [r["job_id"] for r in saved] == ["fresh-save", "old-save"]

    await scheduler.submit("high", gpus=1, priority="high")
    (revoke,) = await scheduler.wait_for(AllocationRevoked)
    assert revoke.allocation_id == fresh.allocation_id


async def test_a_gang_spans_nodes_and_ends_together(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=2, topology="rack-1")
    await scheduler.heartbeat("n2", gpus=2, topology="rack-1")
    await scheduler.submit("gang", gpus=4)
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    assert sorted((g.node_id, tuple(g.gpu_indices)) for g in grants) == [
        ("n1", (0, 1)),
        ("n2", (0, 1)),
    ]
    assert len({g.epoch for g in grants}) == 2
    gangs = await scheduler.pool.fetch("SELECT DISTINCT gang_id, gang_size FROM allocations")
    assert [r["gang_size"] for r in gangs] == [2]
    await scheduler.send(started(grants[0]), "gang")
    assert (await job(scheduler.pool, "gang"))["status"] == "RUNNING"

    ended = JobSucceeded(
        job_id="gang",
        allocation_id=grants[0].allocation_id,
        node_id=grants[0].node_id,
        epoch=grants[0].epoch,
        finished_at=datetime.now(UTC),
    )
    await scheduler.send(ended, "gang")
    released = await scheduler.wait_for(AllocationReleased, count=2)
    assert {r.outcome for r in released} == {"succeeded"}
    assert {r.node_id for r in released} == {"n1", "n2"}
    assert (await job(scheduler.pool, "gang"))["status"] == "SUCCEEDED"
    assert scheduler.events(AllocationRevoked) == []  # finishing members are left alone
    used = await scheduler.pool.fetchval("SELECT gpu_seconds FROM usage WHERE team = 'vision'")
    assert used is not None and used >= 0
    # The other member's runner says its end too (fenced: the allocation ended), and only
    # then are its GPUs free: until it does, its processes may still be on them.
    other = grants[1]
    update = {"allocation_id": other.allocation_id, "node_id": other.node_id, "epoch": other.epoch}
    await scheduler.send(ended.model_copy(update=update), "gang")

    # A member that fails takes the gang down; the other node is told to stop.
    await scheduler.submit("gang-2", gpus=4, max_restarts=0)
    second = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "gang-2", count=2)
    failed = JobFailed(
        job_id="gang-2",
        allocation_id=second[1].allocation_id,
        node_id=second[1].node_id,
        epoch=second[1].epoch,
        finished_at=datetime.now(UTC),
        exit_code=1,
        reason="rank 1 crashed",
    )
    await scheduler.send(failed, "gang-2")
    (fence,) = await scheduler.wait_for(AllocationRevoked)
    assert (fence.allocation_id, fence.reason) == (second[0].allocation_id, "fenced")
    assert (await job(scheduler.pool, "gang-2"))["status"] == "FAILED"
    # The fenced member's GPUs stay leased while its runner stops it, until it says so.
    stopping = await scheduler.pool.fetch(
        "SELECT node_id, gpu_index FROM gpu_leases WHERE released_at IS NULL "
        "AND stopping_since IS NOT NULL ORDER BY gpu_index"
    )
    assert [(r["node_id"], r["gpu_index"]) for r in stopping] == [
        (second[0].node_id, i) for i in second[0].gpu_indices
    ]
    await scheduler.send(preempted(second[0], "fenced"), "gang-2")
    live = await scheduler.pool.fetchval(
        "SELECT count(*) FROM gpu_leases WHERE released_at IS NULL"
    )
    assert live == 0


async def test_every_grant_of_a_gang_carries_the_same_rendezvous_list(
    scheduler: Scheduler,
) -> None:
    await scheduler.heartbeat("n2", gpus=2, topology="rack-1", address="10.0.0.2")
    await scheduler.heartbeat("n1", gpus=2, topology="rack-1", address="10.0.0.9")
    # A heartbeat that changes nothing but the address still updates it.
    await scheduler.heartbeat("n1", gpus=2, topology="rack-1", address="10.0.0.1")
    await scheduler.submit("gang", gpus=4)
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    by_node = {g.node_id: g for g in grants}
    assert grants[0].gang == grants[1].gang  # one list, the same in every grant
    assert [
        (m.node_id, m.allocation_id, m.address, m.gpus, m.first_rank) for m in grants[0].gang
    ] == [
        ("n1", by_node["n1"].allocation_id, "10.0.0.1", 2, 0),
        ("n2", by_node["n2"].allocation_id, "10.0.0.2", 2, 2),
    ]
    for grant in grants:  # each grant is one member of its own list
        (me,) = [m for m in grant.gang if m.allocation_id == grant.allocation_id]
        assert (me.node_id, me.gpus) == (grant.node_id, len(grant.gpu_indices))

    # A job on one node gets no list.
    await scheduler.heartbeat("n3", gpus=2, address="10.0.0.3")
    await scheduler.submit("single", gpus=2)
    (single,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "single")
    assert (single.node_id, single.gang) == ("n3", [])


async def test_a_placing_pass_leaves_the_notes_to_the_settled_state(pool: asyncpg.Pool) -> None:
    now = datetime.now(UTC)
    async with pool.acquire() as conn, conn.transaction():
        for n in range(4):
            await repo.upsert_node(conn, f"n{n}", "h", "cpu", 2, now)
        for j in range(16):
            spec = make_spec(gpus=1 + j % 2, team=f"t{j % 3}")
            await repo.insert_job(conn, f"j{j:02d}", spec, now + timedelta(seconds=j), now)

    async def one_pass() -> tuple[int, int, int]:
        async with pool.acquire() as conn, conn.transaction():
            decisions = await run_pass(conn, datetime.now(UTC), settled_notes=True)
        notes = await pool.fetchval(
            "SELECT count(*) FROM outbox WHERE subject LIKE 'trainyard.job.pending.v1.%'"
        )
        return len(decisions.placements), len(decisions.explanations), notes

    placed, waiting, notes = await one_pass()
    assert placed > 0 and waiting > 0 and notes == 0
    assert await one_pass() == (0, waiting, waiting)  # every waiting job told once
    assert await one_pass() == (0, waiting, waiting)  # and nothing repeated
