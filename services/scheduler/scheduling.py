"""The scheduler's transactional steps, shared by the event handlers and the node watch.

Contract:
- ``run_pass`` takes the scheduling lock, loads a snapshot, asks the policy, and applies its
  decisions in the caller's transaction: an allocation, one lease per GPU and an
  ``AllocationGranted`` per placement; a ``JobPending`` for a waiting job only when its reason
  or position differs from the last one published.
- ``end_allocation`` releases a live allocation (its leases too), says ``AllocationReleased``,
  and moves the job on (requeued, finished, failed or cancelled) as ``domain`` decides.
Every event leaves through the outbox, so it is published exactly when the change commits.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg

from services.scheduler import repository as repo
from services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    EndDecision,
    EndKind,
    Job,
    JobStatus,
    allocation_ended,
    release_time,
)
from services.scheduler.policy import Decisions, Placement, first_fit
from shared import outbox
from shared.events import Envelope, Payload
from shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    JobCancelled,
    JobFailed,
    JobPending,
)

log = logging.getLogger(__name__)

SOURCE = "trainyard/scheduler"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


async def emit(
    conn: asyncpg.Connection, payload: Payload, subject: str, event_id: str | None = None
) -> None:
    """Enqueue ``payload`` in the outbox of the current transaction."""
    await outbox.enqueue(
        conn, Envelope.wrap(payload, source=SOURCE, subject=subject, event_id=event_id)
    )


async def run_pass(conn: asyncpg.Connection, now: datetime) -> Decisions:
    """One scheduling pass inside the caller's transaction (see the module docstring)."""
    await repo.lock_scheduler(conn)
    snapshot = await repo.load_snapshot(conn)
    decisions = first_fit(snapshot)
    job_ids = [p.job_id for p in decisions.placements] + [w.job_id for w in decisions.waiting]
    jobs = await repo.jobs_by_id(conn, job_ids)
    gpu_counts = {n.node_id: n.gpu_count for n in snapshot.nodes}
    for placement in decisions.placements:
        await _grant(conn, jobs[placement.job_id], placement, gpu_counts, now)
    for waiting in decisions.waiting:
        job = jobs[waiting.job_id]
        if (job.pending_reason, job.pending_position) == (waiting.reason, waiting.position):
            continue
        await repo.set_pending(conn, job.job_id, waiting.reason, waiting.position)
        await emit(
            conn,
            JobPending(job_id=job.job_id, reason=waiting.reason, position=waiting.position),
            job.job_id,
        )
    if decisions.placements:
        log.info(
            "pass placed %s; %d waiting",
            ", ".join(
                f"{p.job_id}->{p.node_id}{list(p.gpu_indices)}" for p in decisions.placements
            ),
            len(decisions.waiting),
        )
    return decisions


async def _grant(
    conn: asyncpg.Connection,
    job: Job,
    placement: Placement,
    gpu_counts: dict[str, int],
    now: datetime,
) -> None:
    count = gpu_counts[placement.node_id]
    if any(not 0 <= i < count for i in placement.gpu_indices):
        # The policy must only hand out indices the node has; the lease index cannot see it.
        raise ValueError(f"placement {placement} is outside the {count} GPUs of the node")
    job.status.check(JobStatus.ALLOCATED)
    allocation = Allocation(
        allocation_id=str(uuid.uuid4()),
        job_id=job.job_id,
        node_id=placement.node_id,
        epoch=await repo.next_epoch(conn),
        attempt=job.attempt,
        gpu_indices=placement.gpu_indices,
        status=AllocationStatus.GRANTED,
        granted_at=now,
    )
    await repo.insert_allocation(conn, allocation)
    await repo.set_job_status(conn, job.job_id, JobStatus.ALLOCATED, now)
    granted = AllocationGranted(
        allocation_id=allocation.allocation_id,
        job_id=job.job_id,
        node_id=allocation.node_id,
        gpu_indices=list(allocation.gpu_indices),
        epoch=allocation.epoch,
        attempt=allocation.attempt,
        granted_at=now,
        spec=job.spec,
    )
    await emit(conn, granted, allocation.node_id)


async def end_allocation(
    conn: asyncpg.Connection,
    job: Job,
    allocation: Allocation,
    kind: EndKind,
    reported_at: datetime,
    now: datetime,
) -> EndDecision:
    """Release ``allocation`` (the job's live one) and move the job on; the caller runs a pass."""
    decision = allocation_ended(
        job.status, kind, restarts=job.restarts, max_restarts=job.spec.max_restarts
    )
    released_at = release_time(reported_at, allocation.granted_at, now)
    await repo.release_allocation(conn, allocation.allocation_id, released_at, decision.outcome)
    released = AllocationReleased(
        allocation_id=allocation.allocation_id,
        job_id=job.job_id,
        node_id=allocation.node_id,
        team=job.spec.team,
        user=job.spec.user,
        gpu_flavor=job.spec.gpu_flavor,
        gpus=len(allocation.gpu_indices),
        granted_at=allocation.granted_at,
        released_at=released_at,
        outcome=decision.outcome,
    )
    await emit(conn, released, job.job_id)
    if decision.requeued:
        reason = decision.reason or f"{kind}; requeued"
        await repo.requeue_job(conn, job.job_id, now, reason, count_restart=kind == "lost")
    else:
        await repo.set_job_status(conn, job.job_id, decision.job_status, now, decision.reason)
    if decision.job_status is JobStatus.CANCELLED:
        cancel_reason = job.status_reason or "cancelled"
        await emit(conn, JobCancelled(job_id=job.job_id, reason=cancel_reason), job.job_id)
    elif kind == "lost" and decision.job_status is JobStatus.FAILED:
        # The runner is gone and cannot say it; the scheduler says it for it.
        failed = JobFailed(
            job_id=job.job_id,
            allocation_id=allocation.allocation_id,
            node_id=allocation.node_id,
            epoch=allocation.epoch,
            finished_at=released_at,
            exit_code=None,
            reason=decision.reason or "node lost",
        )
        await emit(conn, failed, job.job_id)
    log.info(
        "allocation %s of job %s ended (%s): job %s",
        allocation.allocation_id,
        job.job_id,
        decision.outcome,
        decision.job_status.value,
    )
    return decision
