"""The scheduler end to end through NATS and Postgres: grant, pend, release, fence, recover."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.scheduler.conftest import (
    RUNNER_RESTARTED,
    Scheduler,
    make_spec,
    preempted,
    until,
)
from trainyard_platform.services.scheduler import handlers as handlers_module
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.convert import build_snapshot, to_epoch
from trainyard_platform.services.scheduler.handlers import SchedulerHandlers
from trainyard_platform.services.scheduler.node_watch import NodeWatch, sweep_lost_nodes
from trainyard_platform.services.scheduler.policy.model import RunningJob
from trainyard_platform.services.scheduler.scheduling import run_pass
from trainyard_platform.shared import bus as bus_module
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    CheckpointRef,
    CheckpointSaved,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPending,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.payloads import Environment as RunEnvironment
from trainyard_platform.shared.events.trust import REGISTRY, owner
from trainyard_platform.shared.inbox import idempotent_batches
from trainyard_platform.shared.logs import trace_fields
from trainyard_platform.shared.telemetry import instrument_database

pytestmark = pytest.mark.integration

DB_SCOPE = "opentelemetry.instrumentation.asyncpg"


def succeeded(grant: AllocationGranted, epoch: int | None = None) -> JobSucceeded:
    return JobSucceeded(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch if epoch is None else epoch,
        finished_at=datetime.now(UTC),
    )


async def job_row(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, attempt, restarts FROM jobs WHERE job_id = $1", job_id
    )


async def test_grant_is_routed_to_the_node(scheduler: Scheduler) -> None:
    received: list[bytes] = []

    async def on_grant(msg) -> None:  # type: ignore[no-untyped-def]
        received.append(msg.data)

    await scheduler.bus.nats.subscribe("trainyard.allocation.granted.v1.local-node-1", cb=on_grant)
    await scheduler.heartbeat("local-node-1", gpus=2)
    await scheduler.submit("job-1", gpus=2, name="resnet")

    (grant,) = await scheduler.wait_for(AllocationGranted)
    assert (grant.job_id, grant.node_id, grant.gpu_indices, grant.attempt) == (
        "job-1",
        "local-node-1",
        [0, 1],
        0,
    )
    assert grant.spec.name == "resnet"
    (envelope,) = scheduler.envelopes(AllocationGranted)
    assert envelope.subject == "local-node-1"
    assert envelope.source == "trainyard/scheduler"
    await until(lambda: bool(received))  # the node's own subscription too
    leases = await scheduler.pool.fetch(
        "SELECT node_id, gpu_index FROM gpu_leases WHERE released_at IS NULL ORDER BY gpu_index"
    )
    assert [(r["node_id"], r["gpu_index"]) for r in leases] == [
        ("local-node-1", 0),
        ("local-node-1", 1),
    ]


async def test_job_that_does_not_fit_pends_then_gets_the_gpus(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("local-node-1", gpus=2)
    await scheduler.submit("job-1", gpus=2)
    (first,) = await scheduler.wait_for(AllocationGranted)

    await scheduler.submit("job-2", gpus=2)
    (pending,) = await scheduler.wait_for(JobPending)
    assert pending.job_id == "job-2"
    assert pending.position == 1
    assert pending.reason == (
        "needs 2 cpu GPUs on one node; no cpu GPU is free; they are held by job-1; "
        "expected start in ~60 min"
    )
    assert pending.blocking == "job-1"
    # job-1 declared an hour (make_spec): job-2 is expected when that hour is over.
    assert pending.estimated_start is not None
    assert abs((pending.estimated_start - first.granted_at).total_seconds() - 3600) < 5

    await scheduler.send(succeeded(first), "job-1")
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert released.outcome == "succeeded"
    assert (released.job_id, released.team, released.user, released.gpus) == (
        "job-1",
        "vision",
        "ada",
        2,
    )
    assert released.granted_at == first.granted_at
    assert released.released_at >= released.granted_at
    (second,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "job-2")
    assert second.gpu_indices == [0, 1]
    assert second.epoch > first.epoch
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "SUCCEEDED"
    assert (await job_row(scheduler.pool, "job-2"))["status"] == "ALLOCATED"


async def test_unchanged_pending_reason_is_not_republished(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=4)
    await scheduler.wait_for(JobPending)
    # Another pass (a new node of another flavor) changes nothing for job-1.
    await scheduler.heartbeat("n2", gpus=8, flavor="h100")
    await scheduler.submit("job-2", gpus=1, flavor="h100")
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "job-2")
    assert len(scheduler.events(JobPending, lambda p: p.job_id == "job-1")) == 1


async def test_no_node_of_the_flavor(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.submit("job-1", gpus=1, flavor="a100")
    (pending,) = await scheduler.wait_for(JobPending)
    assert pending.reason == "no ready node has a100 GPUs"


async def test_database_refuses_a_second_live_lease_on_a_gpu(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    async with scheduler.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO queues (name, team, implicit) VALUES ('default:t', 't', true)"
        )
        await conn.execute(
            "INSERT INTO jobs (job_id, team, user_name, gpu_flavor, gpus, max_restarts, spec, "
            "status, submitted_at, updated_at, queue) "
            "VALUES ('intruder', 't', 'u', 'cpu', 1, 0, '{}', 'ALLOCATED', now(), now(), 'default:t')"
        )
        other = uuid.uuid4()
        await conn.execute(
            "INSERT INTO allocations (allocation_id, job_id, node_id, epoch, attempt, gpu_indices,"
            " status, granted_at, gang_id) "
            "VALUES ($1, 'intruder', 'n1', 999, 0, $2, 'GRANTED', now(), $1)",
            other,
            grant.gpu_indices,
        )
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO gpu_leases (allocation_id, node_id, gpu_index) VALUES ($1, 'n1', $2)",
                other,
                grant.gpu_indices[0],
            )
        # The free GPU next to it is fine.
        await conn.execute(
            "INSERT INTO gpu_leases (allocation_id, node_id, gpu_index) VALUES ($1, 'n1', 1)",
            other,
        )


async def test_redelivered_submission_creates_one_job(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    submitted = JobSubmitted(job_id="job-1", spec=make_spec(gpus=1), submitted_at=datetime.now(UTC))
    first = await scheduler.send(submitted, "job-1")
    # The same event again past JetStream's de-duplication (another message id): the inbox
    # must stop it. Then the same job under a new event id: the job table must.
    await scheduler.bus.publish_raw(first.nats_subject, first.to_json(), "redelivery-1", {})
    await scheduler.send(submitted, "job-1")
    await scheduler.heartbeat("n2", gpus=1)  # a pass after both: still one allocation
    # Passes run after the events (submissions don't wait for the pass lock): wait for the
    # grant, then give a wrong second grant the time of a few more passes to show up.
    await scheduler.wait_for(AllocationGranted)
    await asyncio.sleep(1.0)
    assert await scheduler.pool.fetchval("SELECT count(*) FROM jobs") == 1
    assert await scheduler.pool.fetchval("SELECT count(*) FROM allocations") == 1
    assert len(scheduler.events(AllocationGranted)) == 1


async def test_stale_epoch_is_ignored(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.send(succeeded(grant, epoch=grant.epoch - 1), "job-1")
    await scheduler.send(
        JobSucceeded(
            job_id="job-1",
            allocation_id=str(uuid.uuid4()),
            node_id="n1",
            epoch=grant.epoch,
            finished_at=datetime.now(UTC),
        ),
        "job-1",
    )
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "ALLOCATED"
    assert (
        await scheduler.pool.fetchval("SELECT count(*) FROM gpu_leases WHERE released_at IS NULL")
        == 1
    )
    assert scheduler.events(AllocationReleased) == []
    # The live epoch applies.
    await scheduler.send(succeeded(grant), "job-1")
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "SUCCEEDED"


async def test_started_marks_running_and_stale_start_is_ignored(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)

    def started(epoch: int) -> JobStarted:
        return JobStarted(
            job_id="job-1",
            allocation_id=grant.allocation_id,
            node_id="n1",
            attempt=0,
            epoch=epoch,
            started_at=datetime.now(UTC),
            code_version="abc",
            environment=RunEnvironment(
                python="3.11",
                torch="2",
                platform="linux",
                hostname="h",
                node_id="n1",
                gpu_flavor="cpu",
            ),
            spec=grant.spec,
        )

    await scheduler.send(started(grant.epoch + 5), "job-1")
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "ALLOCATED"
    await scheduler.send(started(grant.epoch), "job-1")
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "RUNNING"
    status = await scheduler.pool.fetchval("SELECT status FROM allocations")
    assert status == "RUNNING"


async def test_preempted_job_is_requeued_for_its_next_attempt(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.send(preempted(grant, "revoked"), "job-1")
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert released.outcome == "preempted"
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    assert grants[1].attempt == 1
    assert grants[1].epoch > grant.epoch


async def test_a_preemption_reported_as_a_cancels_stop_is_said_preempted_by_the_scheduler(
    scheduler: Scheduler,
) -> None:
    """A runner reports the stop of a cancel with the reason ``cancelled``, which the
    submission service leaves as it was until the scheduler's ``job.cancelled``. Said of a
    job nobody cancelled (a runner's wrong word), the job was requeued and nothing else was
    said: it stayed RUNNING in the job's view while it waited in its queue."""
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.send(preempted(grant, "cancelled"), "job-1")
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert released.outcome == "preempted"
    await scheduler.wait_for(JobPreempted, lambda p: p.reason == "preempted")
    (said,) = [e for e in scheduler.envelopes(JobPreempted) if e.id.startswith("said-")]
    assert said.id == f"said-preempted:{grant.allocation_id}"
    assert (said.data.allocation_id, said.data.reason) == (grant.allocation_id, "preempted")
    assert JobCancelled not in [type(e.data) for e in scheduler.seen]


def saved(grant: AllocationGranted, step: int, **overrides: object) -> CheckpointSaved:
    """``grant``'s node's report that the job committed a checkpoint of ``step``."""
    data = f"weights {step}".encode()
    key = f"jobs/{grant.job_id}/checkpoints/step-{step:08d}-a0000"
    report = CheckpointSaved(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        epoch=grant.epoch,
        node_id=grant.node_id,
        saved_at=datetime.now(UTC),
        checkpoint=CheckpointRef(
            uri=f"s3://trainyard/{key}/checkpoint.pt",
            manifest_uri=f"s3://trainyard/{key}/manifest.json",
            step=step,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        ),
    )
    return report.model_copy(update=overrides)


async def test_the_next_attempt_is_granted_the_checkpoint_its_job_reported(
    scheduler: Scheduler,
) -> None:
    """A grant named no checkpoint: the runner restored the newest folder under the job's
    prefix, which any node can write. The next attempt's grant names the newest checkpoint
    the job's own allocation reported committed, with its size and sha256; a lower step
    reported later does not replace it, and a report of another node or another epoch is
    not believed."""
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    assert grant.resume is None  # nothing reported yet: a fresh start
    kept = saved(grant, 20)
    await scheduler.send(kept, "job-1")
    await scheduler.send(saved(grant, 10), "job-1")
    await scheduler.send(saved(grant, 90, node_id="n2"), "job-1")
    await scheduler.send(saved(grant, 91, epoch=grant.epoch + 1000), "job-1")
    await scheduler.send(preempted(grant, "revoked"), "job-1")
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    assert grants[1].attempt == 1
    assert grants[1].resume == kept.checkpoint


async def test_a_running_job_carries_its_place_in_its_queues_order(scheduler: Scheduler) -> None:
    """The policy lets a waiting job preempt only a job it would stand before once that job
    is re-queued: the snapshot's running job carries the submit time and arrival sequence
    it waits with again, the same after a preemption."""
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    queued = await scheduler.pool.fetchrow(
        "SELECT submitted_at, seq FROM jobs WHERE job_id = $1", "job-1"
    )

    async def running() -> RunningJob:
        async with scheduler.pool.acquire() as conn:
            rows = await repo.load_snapshot_rows(conn)
        (job,) = build_snapshot(rows, datetime.now(UTC), 3600.0).snapshot.running
        return job

    first = await running()
    assert (first.submitted_at, first.seq) == (to_epoch(queued["submitted_at"]), queued["seq"])
    await scheduler.send(preempted(grant, "revoked"), "job-1")
    await scheduler.wait_for(AllocationGranted, count=2)
    again = await running()
    assert again.started_at > first.started_at  # its next allocation
    assert (again.submitted_at, again.seq) == (first.submitted_at, first.seq)


async def test_only_the_schedulers_own_preemptions_count_against_max_preemptions(
    scheduler: Scheduler,
) -> None:
    """A runner that restarts or drains reports its jobs preempted, but the scheduler gave no
    notice: that is not a preemption by the policy, and must neither grow the job's
    protection nor bring it closer to ``max_preemptions`` (a tenant restarting nothing could
    otherwise make a job unpreemptible by a flaky node)."""
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)

    async def preempted_count() -> int:
        async with scheduler.pool.acquire() as conn:
            (row,) = (await repo.load_snapshot_rows(conn)).running
        return int(row["preemptions"])

    for attempt, noticed in enumerate((False, False, True, False, True)):
        grants = await scheduler.wait_for(AllocationGranted, count=attempt + 1)
        grant = grants[-1]
        if noticed:  # the policy's notice, as a pass gives it
            await scheduler.pool.execute(
                "UPDATE allocations SET notice_at = now(), notice_reason = 'test' "
                "WHERE allocation_id = $1",
                grant.allocation_id,
            )
        await scheduler.send(preempted(grant, RUNNER_RESTARTED), "job-1")
    await scheduler.wait_for(AllocationGranted, count=6)
    assert await preempted_count() == 2


async def test_lost_node_requeues_its_jobs_elsewhere(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("job-1", gpus=2, max_restarts=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.heartbeat("n2", gpus=2)
    async with scheduler.pool.acquire() as conn, conn.transaction():
        lost = await sweep_lost_nodes(conn, datetime.now(UTC), timedelta(seconds=15))
    assert lost == []  # nobody has been silent for 15 s
    # Five minutes on, n2 has kept beating and n1 has been silent.
    later = datetime.now(UTC) + timedelta(minutes=5)
    await scheduler.pool.execute("UPDATE nodes SET last_heartbeat = $1 WHERE node_id = 'n2'", later)
    async with scheduler.pool.acquire() as conn, conn.transaction():
        lost = await sweep_lost_nodes(conn, later + timedelta(seconds=1), timedelta(seconds=15))
    assert lost == ["n1"]

    (released,) = await scheduler.wait_for(AllocationReleased)
    assert (released.allocation_id, released.outcome) == (grant.allocation_id, "lost")
    # Said for the runner, which cannot: the job's view leaves RUNNING at once.
    (said,) = await scheduler.wait_for(JobPreempted)
    assert (said.allocation_id, said.reason) == (
        grant.allocation_id,
        "node lost; requeued for attempt 2 (restart 1 of 1)",
    )
    (regrant,) = await scheduler.wait_for(AllocationGranted, lambda g: g.node_id == "n2")
    assert (regrant.job_id, regrant.attempt) == ("job-1", 1)
    row = await job_row(scheduler.pool, "job-1")
    assert (row["status"], row["attempt"], row["restarts"]) == ("ALLOCATED", 1, 1)
    assert await scheduler.pool.fetchval("SELECT status FROM nodes WHERE node_id = 'n1'") == "LOST"

    # The old runner's late report is fenced off (a late success would be kept:
    # test_liveness.py).
    late = JobPreempted(
        job_id="job-1",
        allocation_id=grant.allocation_id,
        node_id="n1",
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        reason="revoked",
    )
    await scheduler.send(late, "job-1")
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "ALLOCATED"

    # n1 comes back: READY again, and told to stop the allocation it still runs.
    await scheduler.send(
        RunnerHeartbeat(
            node_id="n1",
            hostname="n1.local",
            gpu_flavor="cpu",
            gpu_count=2,
            running_allocations=[grant.allocation_id],
            sent_at=datetime.now(UTC),
        ),
        "n1",
    )
    assert await scheduler.pool.fetchval("SELECT status FROM nodes WHERE node_id = 'n1'") == "READY"
    (revoke,) = await scheduler.wait_for(AllocationRevoked)
    assert (revoke.allocation_id, revoke.reason, revoke.node_id) == (
        grant.allocation_id,
        "fenced",
        "n1",
    )

    # n2 is lost too: the one restart is used up, so the job fails.
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE nodes SET last_heartbeat = $1 WHERE node_id = 'n1'", later + timedelta(hours=1)
        )
        lost = await sweep_lost_nodes(conn, later + timedelta(minutes=5), timedelta(seconds=15))
    assert lost == ["n2"]
    (failed,) = await scheduler.wait_for(JobFailed)
    assert failed.reason == "node_lost: node lost; max restarts (1) reached after 2 attempts"
    assert (failed.failure_kind, failed.allocation_id) == ("node_lost", regrant.allocation_id)
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "FAILED"


async def test_the_registrys_cancel_of_a_job_whose_parent_is_gone_cancels_it(
    scheduler: Scheduler,
) -> None:
    """The registry asks to cancel a job whose parent model version was deleted before it
    heard of the job (``registry.job_inputs``), on its own subject (``.by-registry``): the
    scheduler believes it as submission's own request, and the job ends cancelled with the
    registry's reason, not scheduled to fail at its first fetch."""
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    await scheduler.submit("job-2", gpus=1)
    await scheduler.wait_for(JobPending)
    reason = "its parent model version vision/base:1 was deleted after the job was admitted"
    request = JobCancelRequested(job_id="job-2", team="vision", user="registry", reason=reason)
    envelope = Envelope.wrap(request, source=REGISTRY, subject="job-2")
    assert envelope.nats_subject.endswith(".by-registry")
    await scheduler.bus.publish(envelope)
    await scheduler.processed(envelope)
    (cancelled,) = await scheduler.wait_for(JobCancelled)
    assert (cancelled.job_id, cancelled.reason) == ("job-2", reason)
    assert (await job_row(scheduler.pool, "job-2"))["status"] == "CANCELLED"


async def test_cancel_queued_and_running_jobs(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    await scheduler.submit("job-2", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    await scheduler.wait_for(JobPending)

    await scheduler.send(JobCancelRequested(job_id="job-2", team="vision", user="ada"), "job-2")
    (cancelled,) = await scheduler.wait_for(JobCancelled)
    assert cancelled.job_id == "job-2"
    assert (await job_row(scheduler.pool, "job-2"))["status"] == "CANCELLED"

    await scheduler.send(
        JobCancelRequested(job_id="job-1", team="vision", user="ada", reason="not needed"), "job-1"
    )
    (revoke,) = await scheduler.wait_for(AllocationRevoked)
    assert (revoke.allocation_id, revoke.epoch, revoke.reason) == (
        grant.allocation_id,
        grant.epoch,
        "cancelled",
    )
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "CANCELLING"
    await scheduler.send(
        JobPreempted(
            job_id="job-1",
            allocation_id=grant.allocation_id,
            node_id="n1",
            epoch=grant.epoch,
            finished_at=datetime.now(UTC),
            reason="revoked: cancelled",
        ),
        "job-1",
    )
    (released,) = await scheduler.wait_for(AllocationReleased)
    assert released.outcome == "cancelled"
    cancels = await scheduler.wait_for(JobCancelled, count=2)
    assert cancels[1].reason == "not needed"
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "CANCELLED"


async def test_node_watch_declares_a_silent_node_lost(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    stop = asyncio.Event()
    watch = NodeWatch(scheduler.pool, interval_seconds=0.05, timeout_seconds=0.2)
    task = asyncio.create_task(watch.run(stop))
    try:
        (released,) = await scheduler.wait_for(AllocationReleased)
    finally:
        stop.set()
        await task
    assert (released.allocation_id, released.outcome) == (grant.allocation_id, "lost")
    # Billed up to the last heartbeat, not to when the loss was noticed.
    last = await scheduler.pool.fetchval("SELECT last_heartbeat FROM nodes WHERE node_id = 'n1'")
    assert released.released_at == max(last, grant.granted_at)
    (pending,) = await scheduler.wait_for(JobPending)
    assert (pending.job_id, pending.reason) == ("job-1", "no ready node has cpu GPUs")
    assert (await job_row(scheduler.pool, "job-1"))["status"] == "QUEUED"


async def test_concurrent_passes_are_serialised(scheduler: Scheduler) -> None:
    """Two replicas placing at once: the second pass waits for the first and sees its lease."""
    await scheduler.heartbeat("n1", gpus=1)

    async def replica(job_id: str) -> None:
        async with scheduler.pool.acquire() as conn, conn.transaction():
            now = datetime.now(UTC)
            await repo.insert_job(conn, job_id, make_spec(gpus=1), now, now)
            await run_pass(conn, now)
            await asyncio.sleep(0.2)  # hold the transaction open while the other one runs

    await asyncio.gather(replica("job-a"), replica("job-b"))
    rows = await scheduler.pool.fetch("SELECT job_id, status FROM jobs ORDER BY status")
    assert sorted(r["status"] for r in rows) == ["ALLOCATED", "QUEUED"]
    assert await scheduler.pool.fetchval("SELECT count(*) FROM gpu_leases") == 1


async def test_a_batch_of_end_reports_applies_as_one_by_one(scheduler: Scheduler) -> None:
    # Four jobs end in one batch, applied in bulk. A second report about job-0 inside the
    # batch closes the bulk run and, applied after it, is fenced: job-0's allocation ended.
    await scheduler.heartbeat("n1", gpus=4)
    for i in range(4):
        await scheduler.submit(f"job-{i}", gpus=1)
    grants = await scheduler.wait_for(AllocationGranted, count=4)
    g = {grant.job_id: grant for grant in grants}
    late_failure = JobFailed(
        job_id="job-0",
        allocation_id=g["job-0"].allocation_id,
        node_id="n1",
        epoch=g["job-0"].epoch,
        finished_at=datetime.now(UTC),
        exit_code=1,
        reason="crashed",
    )
    batch = [
        succeeded(g["job-0"]),
        succeeded(g["job-1"]),
        late_failure,
        succeeded(g["job-2"]),
        preempted(g["job-3"], "revoked"),
    ]
    assert scheduler.work is not None
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await scheduler.work.handlers.apply(
            [Delivery(Envelope.wrap(p, source=owner(p), subject=p.job_id)) for p in batch], conn
        )

    rows = await scheduler.pool.fetch("SELECT job_id, status, attempt FROM jobs ORDER BY 1")
    assert [(r["status"], r["attempt"]) for r in rows[:3]] == [("SUCCEEDED", 0)] * 3
    assert rows[3]["attempt"] == 1  # job-3 requeued for its next attempt
    outcomes = await scheduler.pool.fetch(
        "SELECT job_id, outcome FROM allocations WHERE attempt = 0 ORDER BY 1"
    )
    assert [r["outcome"] for r in outcomes] == ["succeeded"] * 3 + ["preempted"]
    released = await scheduler.pool.fetchval(
        "SELECT count(*) FROM outbox WHERE subject LIKE '%allocation.released%'"
    )
    assert released == 4
    assert await scheduler.pool.fetchval("SELECT gpu_seconds FROM usage") > 0


class _Lines(logging.Handler):
    """The handlers' log lines, each with the trace and job ids its JSON line would carry."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, dict[str, str]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), trace_fields(record)))

    def about(self, text: str) -> dict[str, str]:
        (fields,) = [f for message, f in self.lines if text in message]
        return fields


@pytest.fixture
def handler_lines() -> Iterator[_Lines]:
    logger = logging.getLogger(handlers_module.__name__)
    lines, level = _Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


def _processes(spans: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The consumer spans of the submissions handled one by one, by job id (the first of a
    repeat; a batch's span names no job)."""
    found: dict[str, ReadableSpan] = {}
    for s in spans.get_finished_spans():
        subject = (s.attributes or {}).get("cloudevents.event_subject")
        if s.name == "trainyard.job.submitted.v1 process" and subject is not None:
            found.setdefault(str(subject), s)
    return found


def _submission(job_id: str, now: datetime, **spec: object) -> Delivery:
    payload = JobSubmitted(job_id=job_id, spec=make_spec(**spec), submitted_at=now)
    return Delivery(Envelope.wrap(payload, source=owner(payload), subject=job_id))


async def test_a_batch_of_submissions_queues_as_one_by_one(
    scheduler: Scheduler, spans: InMemorySpanExporter, handler_lines: _Lines
) -> None:
    # A run of submissions is inserted in one statement: in order (their seq), each with the
    # trace context of its own handling, a refused one left out, a job known before and a
    # repeat inside the run (which closes the run) ignored, each new job reported once, and
    # what is logged about a job names it though the statement is outside its span.
    await scheduler.submit("known", gpus=1)
    now = datetime.now(UTC)
    batch = [
        _submission("b", now),
        _submission("a", now),
        _submission("known", now),
        _submission("refused", now, priority="no-such-class"),
        _submission("a", now),
        _submission("c", now),
    ]
    arrivals: list[str] = []
    handlers = SchedulerHandlers(arrived=arrivals.append)
    spans.clear()
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await handlers.apply(batch, conn)

    assert arrivals == ["b", "a", "c"]
    rows = await scheduler.pool.fetch(
        "SELECT job_id, status, queue, spec, trace_context, submitted_at FROM jobs "
        "WHERE job_id <> 'known' ORDER BY seq"
    )
    assert [r["job_id"] for r in rows] == ["b", "a", "c"]
    assert all(r["status"] == "QUEUED" and r["queue"] == "default:vision" for r in rows)
    assert all(r["submitted_at"] == now for r in rows)
    assert JobSpec.model_validate(rows[0]["spec"]) == make_spec()
    processes = _processes(spans)
    for row in rows:  # the trace of its own handling (the first, for "a")
        traceparent = row["trace_context"]["traceparent"]
        own = processes[row["job_id"]].get_span_context()
        assert int(traceparent.split("-")[1], 16) == own.trace_id
    refused = await scheduler.pool.fetchval(
        "SELECT count(*) FROM outbox WHERE event_id = 'refused:refused'"
    )
    assert refused == 1
    assert handler_lines.about("job known already known")["job_id"] == "known"


def _traced(delivery: Delivery) -> tuple[Delivery, str]:
    """``delivery`` with the context of a producer's span in a new trace; its traceparent."""
    parent = trace.SpanContext(
        int(uuid.uuid4().hex, 16), int(uuid.uuid4().hex[:16], 16), True, trace.TraceFlags(1)
    )
    traceparent = f"00-{parent.trace_id:032x}-{parent.span_id:016x}-01"
    return Delivery(delivery.envelope, {"traceparent": traceparent}), traceparent


async def test_a_run_of_traced_submissions_is_one_batch_span_with_links(
    scheduler: Scheduler, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Submissions that come with a trace context are checked in one consumer span per run
    # (at most the link limit of them: 3 here), linked to each one's context, and each job
    # keeps the context it came with (its grant joins the producer's trace); a refused one
    # and one without a context are each handled in a span of their own, the refusal said
    # in the job's trace.
    monkeypatch.setattr(bus_module, "_link_limit", 3)
    now = datetime.now(UTC)
    a, a_parent = _traced(_submission("a", now))
    b, b_parent = _traced(_submission("b", now))
    refused, refused_parent = _traced(_submission("refused", now, priority="no-such-class"))
    c, c_parent = _traced(_submission("c", now))
    loose = _submission("loose", now)
    handlers = SchedulerHandlers()
    spans.clear()
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await handlers.apply([a, b, refused, c, loose], conn)

    name = "trainyard.job.submitted.v1 process"
    batches = [s for s in spans.get_finished_spans() if s.name == name and s.links]
    assert [(s.attributes or {})["messaging.batch.message_count"] for s in batches] == [3, 2]
    assert all(s.parent is None and s.kind is trace.SpanKind.CONSUMER for s in batches)
    linked = [
        f"00-{link.context.trace_id:032x}-{link.context.span_id:016x}-01"
        for s in batches
        for link in s.links
    ]
    assert linked == [a_parent, b_parent, refused_parent, c_parent]  # not "loose": none came

    stored = dict(await scheduler.pool.fetch("SELECT job_id, trace_context FROM jobs"))
    assert set(stored) == {"a", "b", "c", "loose"}
    for job_id, parent in (("a", a_parent), ("b", b_parent), ("c", c_parent)):
        assert stored[job_id] == {"traceparent": parent}, job_id
    own = _processes(spans)  # the spans of single events, by job id
    assert set(own) == {"refused", "loose"}
    assert own["loose"].parent is None
    loose_trace = int(stored["loose"]["traceparent"].split("-")[1], 16)
    assert loose_trace == own["loose"].get_span_context().trace_id
    refused_span = own["refused"]
    assert refused_span.parent is not None
    assert refused_span.parent.span_id == int(refused_parent.split("-")[2], 16)
    headers = await scheduler.pool.fetchval(
        "SELECT headers FROM outbox WHERE event_id = 'refused:refused'"
    )
    said_in = headers["traceparent"].split("-")
    assert int(said_in[1], 16) == refused_span.get_span_context().trace_id
    assert int(said_in[2], 16) == refused_span.get_span_context().span_id


async def test_a_run_of_traced_end_reports_is_one_batch_span_and_each_job_keeps_its_trace(
    scheduler: Scheduler, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # End reports that come with a trace context are handled in one consumer span per run
    # (at most the link limit of them: 2 here), linked to each report's context and named by
    # the type when the run has one; what each ending says (its allocation.released, which
    # billing hangs from) carries the report's own context, so the job's trace goes on
    # through the runner's span. A report without a context is handled in a span of its own,
    # which its release then carries.
    monkeypatch.setattr(bus_module, "_link_limit", 2)
    await scheduler.heartbeat("n1", gpus=4)
    for i in range(4):
        await scheduler.submit(f"job-{i}", gpus=1)
    g = {grant.job_id: grant for grant in await scheduler.wait_for(AllocationGranted, count=4)}
    reports = [
        succeeded(g["job-0"]),
        succeeded(g["job-1"]),
        preempted(g["job-2"], "revoked"),
        succeeded(g["job-3"]),
    ]
    deliveries = [Delivery(Envelope.wrap(p, source=owner(p), subject=p.job_id)) for p in reports]
    traced = [_traced(d) for d in deliveries[:3]]
    parents = [parent for _, parent in traced]
    assert scheduler.work is not None
    spans.clear()
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await scheduler.work.handlers.apply([d for d, _ in traced] + deliveries[3:], conn)
        statuses = await conn.fetch("SELECT status FROM jobs ORDER BY job_id")  # before a pass

    batches = [s for s in spans.get_finished_spans() if s.links]
    assert [s.name for s in batches] == [
        "trainyard.job.succeeded.v1 process",
        "scheduler process",
    ]
    counts = [(s.attributes or {})["messaging.batch.message_count"] for s in batches]
    assert counts == [2, 2]
    assert all(s.parent is None and s.kind is trace.SpanKind.CONSUMER for s in batches)
    linked = [
        f"00-{link.context.trace_id:032x}-{link.context.span_id:016x}-01"
        for s in batches
        for link in s.links
    ]
    assert linked == parents  # not job-3's: it came without one
    own = {
        str((s.attributes or {}).get("cloudevents.event_subject")): s
        for s in spans.get_finished_spans()
        if not s.links and s.name.endswith(" process")
    }
    assert set(own) == {"job-3"}
    assert own["job-3"].parent is None
    rows = await scheduler.pool.fetch(
        "SELECT body, headers FROM outbox WHERE subject LIKE '%allocation.released%'"
    )
    said = {json.loads(r["body"])["data"]["job_id"]: r["headers"]["traceparent"] for r in rows}
    for i, parent in enumerate(parents):
        assert said[f"job-{i}"] == parent, i
    job_3 = own["job-3"].get_span_context()
    assert said["job-3"].startswith(f"00-{job_3.trace_id:032x}-{job_3.span_id:016x}-")
    assert [r["status"] for r in statuses] == ["SUCCEEDED", "SUCCEEDED", "QUEUED", "SUCCEEDED"]


async def test_submissions_and_end_reports_of_distinct_jobs_are_one_run(
    scheduler: Scheduler, spans: InMemorySpanExporter, handler_lines: _Lines
) -> None:
    # Arrivals and completions interleave under load; they commute, so a run of both (of
    # distinct jobs) is one batch span linked to every event, the jobs admitted keep their
    # submissions' contexts and each release carries its report's: no event of the run has a
    # span of its own, the outcome is that of one by one, and what is logged about an event
    # (a report about a job nobody knows) names its job and its trace.
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("job-0", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    g = {grant.job_id: grant for grant in await scheduler.wait_for(AllocationGranted, count=2)}
    now = datetime.now(UTC)
    done = [
        Delivery(Envelope.wrap(p, source=owner(p), subject=p.job_id))
        for p in (succeeded(g["job-0"]), succeeded(g["job-1"]))
    ]
    ghost = succeeded(g["job-0"]).model_copy(update={"job_id": "ghost"})
    run = [
        _traced(_submission("x", now)),
        _traced(done[0]),
        _traced(_submission("y", now)),
        _traced(done[1]),
        _traced(Delivery(Envelope.wrap(ghost, source=owner(ghost), subject="ghost"))),
    ]
    assert scheduler.work is not None
    spans.clear()
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await scheduler.work.handlers.apply([d for d, _ in run], conn)
        statuses = dict(await conn.fetch("SELECT job_id, status FROM jobs"))  # before a pass

    (batch,) = [s for s in spans.get_finished_spans() if s.name.endswith(" process")]
    assert batch.name == "scheduler process" and batch.parent is None
    assert (batch.attributes or {})["messaging.batch.message_count"] == 5
    linked = [f"00-{k.context.trace_id:032x}-{k.context.span_id:016x}-01" for k in batch.links]
    assert linked == [parent for _, parent in run]
    stored = dict(await scheduler.pool.fetch("SELECT job_id, trace_context FROM jobs"))
    assert stored["x"] == {"traceparent": run[0][1]}
    assert stored["y"] == {"traceparent": run[2][1]}
    rows = await scheduler.pool.fetch(
        "SELECT body, headers FROM outbox WHERE subject LIKE '%allocation.released%'"
    )
    said = {json.loads(r["body"])["data"]["job_id"]: r["headers"]["traceparent"] for r in rows}
    assert said == {"job-0": run[1][1], "job-1": run[3][1]}
    assert statuses == {"job-0": "SUCCEEDED", "job-1": "SUCCEEDED", "x": "QUEUED", "y": "QUEUED"}
    ignored = handler_lines.about("job ghost succeeded ignored")
    assert ignored["job_id"] == "ghost"
    assert ignored["trace_id"] == run[4][1].split("-")[1]


async def test_a_stale_success_in_a_run_is_handled_in_a_span_of_its_own(
    scheduler: Scheduler, spans: InMemorySpanExporter
) -> None:
    # A success that does not match the job's live allocation may be a lost node's real
    # result (late_success): rare, and worth seeing, so even in a run it is handled in its
    # own span, under the report's context, while the run's other reports go on without one.
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("job-0", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    g = {grant.job_id: grant for grant in await scheduler.wait_for(AllocationGranted, count=2)}
    stale = succeeded(g["job-0"], epoch=g["job-0"].epoch + 1)
    fresh = succeeded(g["job-1"])
    run = [
        _traced(Delivery(Envelope.wrap(p, source=owner(p), subject=p.job_id)))
        for p in (stale, fresh)
    ]
    assert scheduler.work is not None
    spans.clear()
    async with scheduler.pool.acquire() as conn, conn.transaction():
        await repo.lock_scheduler(conn)
        await scheduler.work.handlers.apply([d for d, _ in run], conn)

    process = [s for s in spans.get_finished_spans() if s.name.endswith(" process")]
    (batch,) = [s for s in process if s.links]
    assert len(batch.links) == 2
    (own,) = [s for s in process if not s.links]
    assert (own.attributes or {})["cloudevents.event_subject"] == "job-0"
    assert own.parent is not None
    assert own.parent.span_id == int(run[0][1].split("-")[2], 16)
    assert (await job_row(scheduler.pool, "job-0"))["status"] == "ALLOCATED"  # ignored


async def test_a_lone_submission_is_queued_inside_its_own_span(
    scheduler: Scheduler, spans: InMemorySpanExporter, handler_lines: _Lines
) -> None:
    # A batch with one submission (most batches at a low rate, and each event of a failed
    # batch handled again alone) is handled whole in its event's span, as before runs were
    # inserted together: its INSERT is a query of the job's trace (a failing one fails
    # there), and the lines logged about it carry that trace.
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    assert instrument_database(provider)
    await scheduler.submit("known", gpus=1)
    handlers = SchedulerHandlers()
    spans.clear()
    for job_id in ("lone", "known"):
        async with scheduler.pool.acquire() as conn, conn.transaction():
            await repo.lock_scheduler(conn)
            await handlers.apply([_submission(job_id, datetime.now(UTC))], conn)

    processes = _processes(spans)
    inserts = {
        s.parent.span_id
        for s in spans.get_finished_spans()
        if s.instrumentation_scope is not None
        and s.instrumentation_scope.name == DB_SCOPE
        and str((s.attributes or {}).get("db.statement", "")).startswith("INSERT INTO jobs")
        and s.parent is not None
    }
    for job_id in ("lone", "known"):
        assert processes[job_id].get_span_context().span_id in inserts, job_id
    known = processes["known"].get_span_context()
    fields = handler_lines.about("job known already known")
    assert fields["trace_id"] == format(known.trace_id, "032x")
    assert fields["job_id"] == "known"
    assert await scheduler.pool.fetchval("SELECT status FROM jobs WHERE job_id = 'lone'") == (
        "QUEUED"
    )


async def test_a_submission_that_cannot_be_stored_fails_its_batch_then_only_itself(
    scheduler: Scheduler, spans: InMemorySpanExporter
) -> None:
    # A run's one INSERT fails for any job of it: nothing of the batch is applied (the
    # inbox rows neither), and handled again one by one (the bus's rule) only that job fails,
    # in its own span.
    now = datetime.now(UTC)
    # Text can't hold NUL. The spec model refuses one too, so it is put past the model (as a
    # stored row or another producer's bytes might): the database is the last guard here.
    spec = make_spec().model_copy(update={"user": "a\x00b"})
    payload = JobSubmitted(job_id="poison", spec=spec, submitted_at=now)
    poison = Delivery(Envelope.wrap(payload, source=owner(payload), subject="poison"))
    batch = [_submission("good-1", now), poison, _submission("good-2", now)]
    apply = idempotent_batches(scheduler.pool, "review", SchedulerHandlers().apply)
    with pytest.raises(asyncpg.PostgresError):
        await apply(batch)
    assert await scheduler.pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert (
        await scheduler.pool.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'review'") == 0
    )

    spans.clear()
    failed = []
    for delivery in batch:
        try:
            await apply([delivery])
        except asyncpg.PostgresError:
            failed.append(delivery.envelope.subject)
    assert failed == ["poison"]
    rows = await scheduler.pool.fetch("SELECT job_id, status FROM jobs ORDER BY seq")
    assert [(r["job_id"], r["status"]) for r in rows] == [
        ("good-1", "QUEUED"),
        ("good-2", "QUEUED"),
    ]
    assert _processes(spans)["poison"].status.status_code is trace.StatusCode.ERROR
