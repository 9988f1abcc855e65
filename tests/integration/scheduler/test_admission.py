"""Admission through the real bus and database: a job the configuration can never run is refused
on arrival with its reason (its final ``job.failed``, kind ``rejected``); a job that only lacks
capacity waits, says why in its pending note, and runs once the capacity comes."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from tests.integration.scheduler.conftest import Scheduler, Tuned, make_spec
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admission import REFUSED_PREFIX
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobFailed,
    JobPending,
    JobSubmitted,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import owner

pytestmark = pytest.mark.integration


async def _queue(pool: asyncpg.Pool, team: str, flavor: str, nominal: int) -> None:
    """An operator's queue for ``team`` with a quota of one flavor (no cohort)."""
    await pool.execute("INSERT INTO queues (name, team) VALUES ($1, $1)", team)
    await pool.execute(
        "INSERT INTO quotas (queue, flavor, nominal) VALUES ($1, $2, $3)", team, flavor, nominal
    )


async def test_each_unsatisfiable_job_is_refused_with_its_reason(scheduler: Scheduler) -> None:
    pool = scheduler.pool
    await scheduler.heartbeat("n1", gpus=4, flavor="a100")
    await _queue(pool, "nlp", "a100", 2)

    await scheduler.submit("urgent", gpus=1, flavor="a100", priority="urgent")
    await scheduler.submit("over-quota", gpus=3, flavor="a100", team="nlp")
    await scheduler.submit("no-quota", gpus=1, flavor="cpu", team="nlp")
    await scheduler.submit("no-layout", gpus=7, flavor="a100")

    failed = await scheduler.wait_for(JobFailed, count=4)
    assert {f.job_id: f.reason.removeprefix(REFUSED_PREFIX) for f in failed} == {
        "urgent": "priority class 'urgent' does not exist; existing: high, low, normal",
        "over-quota": "asks for 3 a100 GPUs but queue nlp can never hold more than 2 (its "
        "nominal quota 2); ask for at most 2",
        "no-quota": "asks for 1 cpu GPU but queue nlp has no cpu quota; ask an operator for "
        "cpu quota",
        "no-layout": "asks for 7 a100 GPUs, which cannot be laid out on a100 nodes of at most "
        "4 GPUs (a job larger than one node takes equal parts on at most twice the fewest "
        "nodes it needs); ask for 6 or 8 GPUs",
    }
    for f in failed:
        assert f.reason.startswith(REFUSED_PREFIX)
        assert (f.failure_kind, f.allocation_id, f.node_id, f.epoch) == ("rejected", "", "", 0)
    envelopes = scheduler.envelopes(JobFailed)
    assert {e.source for e in envelopes} == {"trainyard/scheduler"}
    assert {e.id for e in envelopes} == {f"refused:{f.job_id}" for f in failed}
    # Refused jobs never enter the scheduler's tables: nothing waits, holds GPUs or is billed.
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert scheduler.events(AllocationGranted) == []
    assert scheduler.events(JobPending) == []


async def test_a_team_with_the_most_waiting_jobs_has_its_next_one_refused(
    scheduler_with: Tuned,
) -> None:
    """Waiting jobs cost nothing, yet every scheduling pass weighs each one (and publishes
    its pending note): a member submitting without end made every team's pass, and wait,
    longer. A team has at most max_waiting_jobs waiting (here 3); the next is refused on
    arrival saying so, another team's jobs are not, and once a job starts the team may
    submit again."""
    scheduler = await scheduler_with(max_waiting_jobs=3)
    for i in range(3):
        await scheduler.submit(f"flood-{i}", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "flood-2")
    await scheduler.submit("flood-3", gpus=1)
    await scheduler.submit("other-team", gpus=1, team="nlp")

    failed = await scheduler.wait_for(JobFailed, lambda f: f.job_id == "flood-3")
    assert failed[0].failure_kind == "rejected"
    assert failed[0].reason == (
        f"{REFUSED_PREFIX}team vision already has 3 jobs waiting, the most a team may have "
        "(TRAINYARD_SCHEDULER_MAX_WAITING_JOBS_PER_TEAM); submit more as these start or end"
    )
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "other-team")
    waiting = "SELECT job_id FROM jobs WHERE status = 'QUEUED' ORDER BY job_id"
    assert [r["job_id"] for r in await scheduler.pool.fetch(waiting)] == [
        "flood-0",
        "flood-1",
        "flood-2",
        "other-team",
    ]

    await scheduler.heartbeat("n1", gpus=2)  # one of the team's jobs starts, at least
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id.startswith("flood-"))
    await scheduler.submit("flood-4", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "flood-4")
    assert [f.job_id for f in scheduler.events(JobFailed)] == ["flood-3"]


async def test_a_refused_job_stays_refused_and_a_fixed_resubmission_runs(
    scheduler: Scheduler,
) -> None:
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.submit("odd", gpus=1, priority="urgent")
    await scheduler.wait_for(JobFailed, lambda f: f.job_id == "odd")

    await scheduler.pool.execute(
        "INSERT INTO priority_classes (name, value, preemptible) VALUES ('urgent', 500, true)"
    )
    await scheduler.submit("odd-again", gpus=1, priority="urgent")
    (grant,) = await scheduler.wait_for(AllocationGranted)
    assert grant.job_id == "odd-again"
    assert [f.job_id for f in scheduler.events(JobFailed)] == ["odd"]


async def test_what_more_capacity_would_satisfy_waits_with_the_reason(
    scheduler: Scheduler,
) -> None:
    await scheduler.heartbeat("n1", gpus=4, flavor="a100")
    await scheduler.submit("big", gpus=16, flavor="a100")  # 4 nodes x 4, one node so far
    await scheduler.submit("h200", gpus=2, flavor="h200")  # no h200 node yet

    big = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "big"))[0]
    assert big.reason == "needs 16 a100 GPUs; all ready a100 nodes together have 4"
    h200 = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "h200"))[0]
    assert h200.reason == "no ready node has h200 GPUs"
    assert scheduler.events(JobFailed) == []

    # An operator adds the nodes: both run.
    for node in ("n2", "n3", "n4"):
        await scheduler.heartbeat(node, gpus=4, flavor="a100")
    await scheduler.heartbeat("g1", gpus=8, flavor="h200")
    grants = await scheduler.wait_for(AllocationGranted, count=5)
    assert {g.job_id for g in grants} == {"big", "h200"}
    assert scheduler.events(JobFailed) == []


async def test_a_lost_node_still_counts_for_the_gang_rules(scheduler: Scheduler) -> None:
    """A big node restarting (lost for a moment) must not get jobs refused that fit it."""
    await scheduler.heartbeat("big", gpus=8, flavor="a100")
    await scheduler.heartbeat("small", gpus=4, flavor="a100")
    await scheduler.pool.execute(
        "UPDATE nodes SET status = 'LOST', lost_at = now() WHERE node_id = 'big'"
    )
    await scheduler.submit("seven", gpus=7, flavor="a100")
    waits = (await scheduler.wait_for(JobPending, lambda p: p.job_id == "seven"))[0]
    assert waits.reason == "needs 7 a100 GPUs; all ready a100 nodes together have 4"
    assert scheduler.events(JobFailed) == []

    await scheduler.heartbeat("big", gpus=8, flavor="a100")
    (grant,) = await scheduler.wait_for(AllocationGranted)
    assert (grant.job_id, grant.node_id) == ("seven", "big")


async def test_a_node_joining_within_a_batch_counts_for_the_jobs_after_it(
    scheduler: Scheduler,
) -> None:
    """Admission facts are read once per team and flavor in a batch, and a node that joins in
    the same batch makes them be read again."""
    await scheduler.heartbeat("small", gpus=4, flavor="a100")
    big = RunnerHeartbeat(
        node_id="big",
        hostname="big.local",
        gpu_flavor="a100",
        gpu_count=8,
        sent_at=datetime.now(UTC),
    )
    batch: list[Payload] = [
        JobSubmitted(
            job_id="before",
            spec=make_spec(gpus=7, gpu_flavor="a100"),
            submitted_at=datetime.now(UTC),
        ),
        JobSubmitted(
            job_id="also-before",
            spec=make_spec(gpus=5, gpu_flavor="a100"),
            submitted_at=datetime.now(UTC),
        ),
        big,
        JobSubmitted(
            job_id="after",
            spec=make_spec(gpus=7, gpu_flavor="a100"),
            submitted_at=datetime.now(UTC),
        ),
    ]
    assert scheduler.work is not None
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        deliveries = [
            Delivery(Envelope.wrap(p, source=owner(p), subject=getattr(p, "job_id", "big")))
            for p in batch
        ]
        await scheduler.work.handlers.apply(deliveries, conn)

    refused = await scheduler.pool.fetch(
        "SELECT event_id FROM outbox WHERE event_id LIKE 'refused:%' ORDER BY 1"
    )
    assert [r["event_id"] for r in refused] == ["refused:also-before", "refused:before"]
    jobs = await scheduler.pool.fetch("SELECT job_id FROM jobs")
    assert [r["job_id"] for r in jobs] == ["after"]
