"""A success reported late by the runner of an allocation whose node was declared lost.

The scheduler declares a node lost when it has not heard it for the node timeout
(``node_watch``), and so presumes its attempts dead; a runner that was only cut off may still
have finished its job, and says so once it is heard again. That result is real and is kept.

Contract of ``accept_late_success(conn, job, live, report, now, tuning)``, for a
``job.succeeded`` that names none of the job's live allocations (inside the handler's
transaction, under the scheduling lock; ``job`` and its ``live`` allocations read FOR UPDATE):
- What ``domain.late_success`` refuses is logged and ignored, as fencing always did: any
  other ended allocation, a stale epoch, or an allocation of another job. Progress, failures
  and preemptions of an ended allocation never reach this (they stay fenced).
- A kept success: the allocation's outcome becomes ``succeeded`` and it ends when it really
  ended, the later of its release (billed up to the node's last heartbeat) and the runner's
  ``finished_at`` (kept between its grant and now, and no later than its grant plus the
  spec's ``max_runtime_seconds`` and the kill grace: no attempt is billed longer,
  ``domain.release_time``; a bill is extended, never cut: ``domain.late_release_time``). A second
  ``AllocationReleased`` for it says so (outcome ``succeeded``, event id
  ``late-success:<allocation>``); billing amends that allocation's one bill to the longer
  interval (``services.billing``: one ledger row per allocation, so it is billed once, for
  what really ran). The extra GPU-seconds go to the team's fair-share usage.
- When the job succeeds by it (``LateSuccess.job_succeeds``) it becomes SUCCEEDED and is not
  run again: every live allocation of a newer attempt is released (outcome ``cancelled``,
  billed from its grant to now like any allocation stopped early, ``domain.release_time``) and its node told
  ``AllocationRevoked(reason="fenced")``, whatever that attempt had reached (its GPUs stay
  leased while its runner stops it, as for any allocation ended without its runner's word:
  ``leases``); a job requeued after the loss leaves its queue.
  The scheduler then says the runner's ``job.succeeded`` again as its own (event id
  ``kept-success:<allocation>``, on ``trainyard.job.succeeded.v1.by-scheduler``): the
  runner's report names an allocation the other services saw end, so they would ignore
  it; the scheduler's copy is the verdict that the job succeeded (submission's view turns
  SUCCEEDED from whatever attempt it showed; the registry registers the model once).
Returns whether the job moved on (the caller asks for a pass).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from trainyard_platform.services.scheduler import allocation_repository as allocation_repo
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.domain import (
    Allocation,
    Job,
    Outcome,
    late_release_time,
    late_success,
    release_time,
)
from trainyard_platform.services.scheduler.leases import charge_usage, fence_revocation
from trainyard_platform.services.scheduler.scheduling import Tuning, traced
from trainyard_platform.shared import outbox
from trainyard_platform.shared.events.payloads import AllocationReleased, JobSucceeded
from trainyard_platform.shared.outbox import Traced

log = logging.getLogger(__name__)


async def accept_late_success(
    conn: asyncpg.Connection,
    job: Job,
    live: Sequence[Allocation],
    report: JobSucceeded,
    now: datetime,
    tuning: Tuning,
) -> bool:
    """Keep ``report`` if it is a lost allocation's real success (see the module docstring)."""
    found = await allocation_repo.ended_allocation(conn, report.allocation_id)
    if found is None or found[0].job_id != job.job_id:
        log.info(
            "job %s succeeded ignored: allocation %s is neither live nor an ended one of it",
            job.job_id,
            report.allocation_id,
        )
        return False
    if found[0].node_id != report.node_id:  # a gang peer's (``domain.fence``)
        log.info(
            "job %s succeeded ignored: allocation %s is node %s's, not %s's",
            job.job_id,
            report.allocation_id,
            found[0].node_id,
            report.node_id,
        )
        return False
    allocation, outcome, released_at = found
    verdict = late_success(
        job.status,
        job_attempt=job.attempt,
        attempt=allocation.attempt,
        outcome=outcome,
        epoch=allocation.epoch,
        reported_epoch=report.epoch,
    )
    if isinstance(verdict, str):
        log.info("job %s succeeded ignored: %s", job.job_id, verdict)
        return False
    ended_at = late_release_time(
        report.finished_at, allocation.granted_at, released_at, now, job.spec.max_runtime_seconds
    )
    await allocation_repo.amend_lost_release(conn, allocation.allocation_id, ended_at)
    gpu_seconds = len(allocation.gpu_indices) * (ended_at - released_at).total_seconds()
    events = [
        _released(
            job,
            allocation,
            ended_at,
            "succeeded",
            event_id=f"late-success:{allocation.allocation_id}",
        )
    ]
    if verdict.job_succeeds:
        releases: list[tuple[str, datetime, Outcome]] = []
        unreported: dict[str, float] = {}  # settled by their runners' reports (leases)
        for newer in live:
            stopped_at = release_time(now, newer.granted_at, now, job.spec.max_runtime_seconds)
            releases.append((newer.allocation_id, stopped_at, "cancelled"))
            charged = len(newer.gpu_indices) * (stopped_at - newer.granted_at).total_seconds()
            gpu_seconds += charged
            if charged > 0:
                unreported[newer.allocation_id] = charged
            events.append(_released(job, newer, stopped_at, "cancelled"))
            events.append(fence_revocation(newer, newer.node_id, tuning.cancel_grace_s))
        # Their runners were only told to stop: their GPUs stay leased while they do.
        stopping = [allocation_id for allocation_id, _, _ in releases]
        await allocation_repo.release_allocations(conn, releases, stopping, now, unreported)
        reason = (
            f"succeeded: {verdict.reason} (allocation {allocation.allocation_id}); not run again"
        )
        await repo.set_job_status(conn, [job.job_id], job.status.check_late_success(), now, reason)
        events.append(
            traced(report, job.job_id, event_id=f"kept-success:{allocation.allocation_id}")
        )
    await charge_usage(conn, job.spec.team, gpu_seconds, now, tuning.half_life_s)
    await outbox.enqueue_traced(conn, events)
    log.warning(
        "job %s: allocation %s reported success after its node was declared lost; kept "
        "(%s, billed to %s%s)",
        job.job_id,
        allocation.allocation_id,
        verdict.reason,
        ended_at.isoformat(),
        f"; newer allocation(s) {', '.join(a.allocation_id for a in live)} stopped"
        if verdict.job_succeeds and live
        else "",
    )
    return verdict.job_succeeds


def _released(
    job: Job,
    allocation: Allocation,
    released_at: datetime,
    outcome: Outcome,
    event_id: str | None = None,
) -> Traced:
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
        outcome=outcome,
    )
    return traced(released, job.job_id, event_id=event_id)
