"""Red team, second pass: events a runner may send on the bus (its user may publish
``job.progress`` for any job id: the subject cannot name its node), forged about another
team's job that was never granted to it.

Found on the local stack: with the runner's own NATS credentials, a ``job.progress`` naming a
made-up allocation of another team's queued job set that job's step and merged 30,000
metrics into it (served with every read of the job). Submission now applies one only for an
allocation the scheduler granted that job; one of another allocation waits for that grant
like the other early reports (bounded per job, forgotten when the job ends) and changes
nothing the job's users see.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from tests.integration import test_forged_events as forged
from trainyard_platform.services.submission.early_reports import MAX_KEPT_PER_NODE
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    CheckpointSaved,
    JobProgress,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import RUNNER, SCHEDULER

pytestmark = pytest.mark.integration

platform = forged.platform
Platform = forged.Platform


async def _queued_job(platform: Platform) -> str:
    """A job of team ``vision`` in submission's database, queued, never granted."""
    job_id = str(uuid.uuid4())
    pool = platform.pools["submission"]
    async with pool.acquire() as conn, conn.transaction():
        team = await conn.fetchval(
            "INSERT INTO teams (name) VALUES ('vision') "
            "ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING id"
        )
        user = await conn.fetchval(
            "INSERT INTO users (team_id, name, role) VALUES ($1, 'ada', 'member') "
            "ON CONFLICT (team_id, name) DO UPDATE SET role = excluded.role RETURNING id",
            team,
        )
        now = datetime.now(UTC)
        await conn.execute(
            "INSERT INTO jobs (id, team_id, user_id, name, spec, status, submitted_at, "
            "updated_at) VALUES ($1, $2, $3, 'victim', $4::jsonb, 'QUEUED', $5, $5)",
            job_id,
            team,
            user,
            forged._spec().model_dump_json(),
            now,
        )
    return job_id


async def test_progress_of_an_allocation_never_granted_changes_nothing(
    platform: Platform,
) -> None:
    job = await _queued_job(platform)
    before = await platform.quiet()
    made_up = str(uuid.uuid4())
    forged_reports = [
        Envelope.wrap(
            JobProgress(
                job_id=job,
                allocation_id=made_up,
                step=6 + n,
                metrics={f"k{i}": 1.0 for i in range(3000)},
                node_id=forged.NODE_A,  # the node it is (it may say no other)
            ),
            source=RUNNER,
            subject=job,
        )
        for n in range(MAX_KEPT_PER_NODE + 1)
    ]
    async with platform.bus_of(f"runner-{forged.NODE_A}") as runner:  # its own credentials
        for envelope in forged_reports:
            await runner.publish(envelope)
    # The reports wait for a grant that never comes, at most MAX_KEPT_PER_NODE of them.
    last = forged_reports[-1].to_json()
    await platform.dead.wait_for({last: {"submission"}}, "progress beyond the kept ones")
    assert "refused, not kept" in platform.dead.by_body[last]["submission"]
    after = await platform.quiet()
    assert after["submission.jobs"] == before["submission.jobs"]
    assert after["submission.job_history"] == before["submission.job_history"]
    kept = await platform.pools["submission"].fetchval(
        "SELECT count(*) FROM early_reports WHERE job_id = $1", job
    )
    assert kept == MAX_KEPT_PER_NODE


async def test_another_nodes_reports_never_take_the_room_of_the_node_granted_the_job(
    platform: Platform,
) -> None:
    """The room kept for a job's early reports was the job's, whoever filled it: node A,
    with its own credentials, filled another team's job's with starts of allocations never
    to be granted, and the job's own start, said by the node it was then granted on before
    the grant came (as after NATS lost its store), was refused and dead-lettered; the job
    showed SCHEDULED while it ran. Each node now fills only its own share."""
    job = await _queued_job(platform)
    hostile = [
        Envelope.wrap(forged.sample(JobStarted, job, forged.NODE_A), source=RUNNER, subject=job)
        for _ in range(MAX_KEPT_PER_NODE + 1)
    ]
    async with platform.bus_of(f"runner-{forged.NODE_A}") as runner:  # its own credentials
        for envelope in hostile:
            await runner.publish(envelope)
    last = hostile[-1].to_json()
    await platform.dead.wait_for({last: {"submission"}}, "a start beyond node A's share")

    granted = forged.sample(AllocationGranted, job, forged.NODE_B)
    assert isinstance(granted, AllocationGranted)
    own = Envelope.wrap(
        forged.SAMPLES[JobStarted](job, forged.NODE_B, granted.allocation_id),
        source=RUNNER,
        subject=job,
    )
    async with platform.bus_of(f"runner-{forged.NODE_B}") as runner:  # before its grant
        await runner.publish(own)
    pool = platform.pools["submission"]
    kept = "SELECT count(*) FROM early_reports WHERE allocation_id = $1"
    async with asyncio.timeout(forged.WAIT_S):
        while not await pool.fetchval(kept, granted.allocation_id):
            refused = platform.dead.by_body.get(own.to_json(), {}).get("submission")
            assert refused is None, refused
            await asyncio.sleep(0.1)
    async with platform.bus_of("scheduler") as scheduler:
        await scheduler.publish(Envelope.wrap(granted, source=SCHEDULER, subject=forged.NODE_B))
    status = "SELECT status FROM jobs WHERE id = $1"
    async with asyncio.timeout(forged.WAIT_S):
        while await pool.fetchval(status, job) != "RUNNING":
            await asyncio.sleep(0.1)
    assert await pool.fetchval(kept, granted.allocation_id) == 0


async def test_a_checkpoint_of_an_allocation_never_granted_changes_nothing(
    platform: Platform,
) -> None:
    """The same forgery as a ``checkpoint.saved``: it added a checkpoint to the other team's
    job view. It now waits for a grant that never comes, like the progress above."""
    job = await _queued_job(platform)
    before = await platform.quiet()
    base = f"s3://ckpt/jobs/{job}/checkpoints/step-00000006"
    forged_checkpoint = Envelope.wrap(
        CheckpointSaved(
            job_id=job,
            allocation_id=str(uuid.uuid4()),
            epoch=1,
            checkpoint=CheckpointRef(
                uri=f"{base}/checkpoint.pt",
                manifest_uri=f"{base}/manifest.json",
                step=6,
                size_bytes=1000,
                sha256="0" * 64,
            ),
            saved_at=datetime.now(UTC),
            node_id=forged.NODE_A,  # the node it is (it may say no other)
        ),
        source=RUNNER,
        subject=job,
    )
    async with platform.bus_of(f"runner-{forged.NODE_A}") as runner:  # its own credentials
        await runner.publish(forged_checkpoint)
    pool = platform.pools["submission"]
    for _ in range(60):  # handled when it is kept, waiting for its grant
        if await pool.fetchval("SELECT count(*) FROM early_reports WHERE job_id = $1", job):
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("the forged checkpoint was never handled")
    count = "SELECT count(*) FROM job_checkpoints WHERE job_id = $1"
    assert await pool.fetchval(count, job) == 0
    after = await platform.quiet()
    assert after["submission.jobs"] == before["submission.jobs"]


async def test_a_success_of_another_jobs_allocation_writes_nothing_of_it(
    platform: Platform,
) -> None:
    """A runner may say ``job.succeeded`` for any job id. Its ``metrics`` were merged into
    the job's view before the report was judged: naming an allocation granted to one of its
    own jobs (so nothing waited for a grant), or any allocation once the job had ended, a
    node wrote the final metrics every read of another team's job serves. A report is now
    believed only of an allocation granted to that very job on the node that says it."""
    pool = platform.pools["submission"]
    own, queued, ended = [await _queued_job(platform) for _ in range(3)]
    mine = str(uuid.uuid4())
    now = datetime.now(UTC)
    async with pool.acquire() as conn, conn.transaction():
        # The node's own job, granted to it: the allocation id it knows.
        await conn.execute(
            "INSERT INTO job_allocations (allocation_id, job_id, node_id, gpu_indices, "
            "attempt, epoch, granted_at) VALUES ($1, $2, $3, '{0}', 1, 1, $4)",
            mine,
            own,
            forged.NODE_A,
            now,
        )
        await conn.execute(
            "UPDATE jobs SET status = 'SUCCEEDED', finished_at = $2 WHERE id = $1", ended, now
        )
    before = await platform.quiet()
    reports = [
        Envelope.wrap(
            JobSucceeded(
                job_id=victim,
                allocation_id=allocation,
                node_id=forged.NODE_A,  # the node it is (it may say no other)
                epoch=1,
                finished_at=now,
                metrics={"accuracy": 0.01},
            ),
            source=RUNNER,
            subject=victim,
        )
        for victim, allocation in ((queued, mine), (ended, str(uuid.uuid4())))
    ]
    async with platform.bus_of(f"runner-{forged.NODE_A}") as runner:  # its own credentials
        for envelope in reports:
            await runner.publish(envelope)
    handled = "SELECT count(*) FROM inbox WHERE event_id = ANY($1::text[])"
    for _ in range(60):
        if await pool.fetchval(handled, [r.id for r in reports]) == len(reports):
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("the forged successes were never handled")
    after = await platform.quiet()
    assert after["submission.jobs"] == before["submission.jobs"]
    assert after["submission.job_history"] == before["submission.job_history"]
    written = "SELECT count(*) FROM jobs WHERE id = ANY($1::text[]) AND metrics <> '{}'::jsonb"
    assert await pool.fetchval(written, [queued, ended]) == 0
