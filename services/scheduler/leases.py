"""The end of a job's allocations: release, bill, charge fair share, move the job on.

Contract:
- ``end_gang`` releases every live allocation of a job (one per node of its gang) and their
  leases, says ``AllocationReleased`` for each (billing), charges the GPU-seconds to the
  team's fair-share usage (decayed to now with the half-life, then added), and moves the
  job on (requeued, finished, failed or cancelled) as ``domain.allocation_ended`` decides.
  Members of the gang other than the one that reported are told to stop
  (``AllocationRevoked(reason="fenced")``) unless the job succeeded.
- ``release_expired_notices`` ends, by force, every job whose preemption notice is older
  than the grace: outcome ``preempted``, the job requeued for a new attempt (its next
  allocation takes a new, higher epoch, so a late report from the old runner is fenced),
  ``AllocationRevoked(reason="fenced")`` to each node, and a ``JobPreempted`` said on the
  silent runner's behalf so the job's view moves on. A job requeued after a lost node gets
  the same ``JobPreempted`` (reason ``node lost; requeued``); one that fails for it, a
  ``JobFailed``.
The caller holds the scheduling lock and runs a pass afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import asyncpg

from services.scheduler import allocation_repository as allocation_repo
from services.scheduler import repository as repo
from services.scheduler.domain import (
    Allocation,
    EndDecision,
    EndKind,
    Job,
    JobStatus,
    allocation_ended,
    release_time,
)
from services.scheduler.policy.fairshare import charge, decay_usage
from services.scheduler.scheduling import Tuning, emit, job_trace
from shared.events.payloads import (
    AllocationReleased,
    AllocationRevoked,
    JobCancelled,
    JobFailed,
    JobPreempted,
)

log = logging.getLogger(__name__)


async def end_gang(
    conn: asyncpg.Connection,
    job: Job,
    allocations: Sequence[Allocation],
    kind: EndKind,
    reported_at: datetime,
    now: datetime,
    tuning: Tuning,
    reporter: str | None = None,
) -> EndDecision:
    """Release ``allocations`` (all the job's live ones) and move the job on; ``reporter``
    is the allocation whose runner said it ended (None: the scheduler decided)."""
    with job_trace(job.job_id, job.trace_context, "release"):
        return await _end_gang(conn, job, allocations, kind, reported_at, now, tuning, reporter)


async def _end_gang(
    conn: asyncpg.Connection,
    job: Job,
    allocations: Sequence[Allocation],
    kind: EndKind,
    reported_at: datetime,
    now: datetime,
    tuning: Tuning,
    reporter: str | None,
) -> EndDecision:
    decision = allocation_ended(
        job.status, kind, restarts=job.restarts, max_restarts=job.spec.max_restarts
    )
    gpu_seconds = 0.0
    for allocation in allocations:
        released_at = release_time(reported_at, allocation.granted_at, now)
        await allocation_repo.release_allocation(
            conn, allocation.allocation_id, released_at, decision.outcome
        )
        gpus = len(allocation.gpu_indices)
        gpu_seconds += gpus * (released_at - allocation.granted_at).total_seconds()
        released = AllocationReleased(
            allocation_id=allocation.allocation_id,
            job_id=job.job_id,
            node_id=allocation.node_id,
            team=job.spec.team,
            user=job.spec.user,
            gpu_flavor=job.spec.gpu_flavor,
            gpus=gpus,
            granted_at=allocation.granted_at,
            released_at=released_at,
            outcome=decision.outcome,
        )
        await emit(conn, released, job.job_id)
        if allocation.allocation_id != reporter and kind != "succeeded":
            await _fence(conn, allocation, tuning.cancel_grace_s)
    await charge_usage(conn, job.spec.team, gpu_seconds, now, tuning.half_life_s)
    if decision.requeued:
        reason = decision.reason or f"{kind}; requeued"
        await repo.requeue_job(conn, job.job_id, now, reason, count_restart=kind == "lost")
    else:
        await repo.set_job_status(conn, [job.job_id], decision.job_status, now, decision.reason)
    if decision.job_status is JobStatus.CANCELLED:
        cancel_reason = job.status_reason or "cancelled"
        await emit(conn, JobCancelled(job_id=job.job_id, reason=cancel_reason), job.job_id)
    elif kind == "lost" and decision.job_status is JobStatus.FAILED and allocations:
        # The runner is gone and cannot say it; the scheduler says it for it.
        first = allocations[0]
        failed = JobFailed(
            job_id=job.job_id,
            allocation_id=first.allocation_id,
            node_id=first.node_id,
            epoch=first.epoch,
            finished_at=release_time(reported_at, first.granted_at, now),
            exit_code=None,
            reason=decision.reason or "node lost",
        )
        await emit(conn, failed, job.job_id)
    elif kind == "lost" and decision.requeued:
        # Likewise: the job's view must leave RUNNING now, not when it is placed again.
        await _say_preempted(conn, job.job_id, allocations, reported_at, decision.reason)
    log.info(
        "allocation(s) %s of job %s ended (%s): job %s",
        ", ".join(a.allocation_id for a in allocations),
        job.job_id,
        decision.outcome,
        decision.job_status.value,
    )
    return decision


async def _fence(conn: asyncpg.Connection, allocation: Allocation, grace: float) -> None:
    revoke = AllocationRevoked(
        allocation_id=allocation.allocation_id,
        job_id=allocation.job_id,
        node_id=allocation.node_id,
        epoch=allocation.epoch,
        reason="fenced",
        grace_seconds=grace,
    )
    # The same fixed id as a stray seen in a heartbeat: the outbox keeps one revocation.
    event_id = f"fence:{allocation.allocation_id}:{allocation.node_id}"
    await emit(conn, revoke, allocation.node_id, event_id=event_id)


async def charge_usage(
    conn: asyncpg.Connection, team: str, gpu_seconds: float, now: datetime, half_life_s: float
) -> None:
    """Add ``gpu_seconds`` to ``team``'s fair-share usage, decayed to ``now`` first."""
    if gpu_seconds <= 0:
        return
    row = await allocation_repo.usage_for_update(conn, team)
    usage: dict[str, float] = {}
    as_of = now
    if row is not None:
        as_of = max(now, row["as_of"])
        elapsed = (as_of - row["as_of"]).total_seconds()
        usage = decay_usage({team: row["gpu_seconds"]}, elapsed, half_life_s)
    usage = charge(usage, team, gpu_seconds)
    await allocation_repo.set_usage(conn, team, usage[team], as_of)


async def release_expired_notices(
    conn: asyncpg.Connection, now: datetime, tuning: Tuning
) -> list[str]:
    """Revoke by force the GPUs of jobs whose preemption grace is over; returns their ids."""
    await repo.lock_scheduler(conn)
    cutoff = now - timedelta(seconds=tuning.preemption_grace_s)
    ended: list[str] = []
    for job_id in await allocation_repo.jobs_with_expired_notice(conn, cutoff):
        job = await repo.job_for_update(conn, job_id)
        allocations = await allocation_repo.live_allocations(conn, job_id)
        if job is None or not allocations or not job.status.holds_gpus:
            continue
        log.warning("job %s did not stop within the preemption grace: revoking", job_id)
        await end_gang(conn, job, allocations, "preempted", now, now, tuning)
        with job_trace(job_id, job.trace_context, "preempted"):
            reason = (
                "preempted; the runner did not stop within the grace period, so its GPUs "
                "were revoked"
            )
            await _say_preempted(conn, job_id, allocations, now, reason)
        ended.append(job_id)
    return ended


async def _say_preempted(
    conn: asyncpg.Connection,
    job_id: str,
    allocations: Sequence[Allocation],
    reported_at: datetime,
    reason: str | None,
) -> None:
    """``job.preempted`` on behalf of runners that cannot or did not say it (a lost node, a
    runner that did not stop within the grace): the job goes back to its queue and resumes
    from its checkpoint."""
    for allocation in allocations:
        preempted = JobPreempted(
            job_id=job_id,
            allocation_id=allocation.allocation_id,
            node_id=allocation.node_id,
            epoch=allocation.epoch,
            finished_at=release_time(reported_at, allocation.granted_at, reported_at),
            reason=reason or "preempted",
        )
        await emit(conn, preempted, job_id, event_id=f"said-preempted:{allocation.allocation_id}")
