"""The end of a job's allocations: release, bill, charge fair share, move the job on.

Contract:
- ``end_gang`` releases every live allocation of a job (one per node of its gang), says
  ``AllocationReleased`` for each (billing; every one with ``platform_failure``
  when the reporting runner said the attempt failed through the platform, so that no member
  of a gang is its team's to pay), charges the GPU-seconds to the team's fair-share usage
  (decayed to now with the half-life, then added), and moves the job on (requeued,
  finished, failed or cancelled) as ``domain.allocation_ended`` decides. Each is released
  at the time its runner (or the last heartbeat) reported, but never later, for its bill
  and its usage, than its grant plus the spec's ``max_runtime_seconds`` and the kill grace
  (``domain.release_time``): no attempt is billed more than the worst case a budget
  reserves for it (``shared.worst_case``). The GPU leases an ending gives up at once end
  at the reported time itself (``domain.end_time``; ``gpu_leases.released_at``), later
  than the bill's end for one held past it: the GPUs were not free before. An attempt that
  failed through the platform (``JobFailed.through_platform``, the rule billing charges by)
  adds nothing to the usage, for any member: a team whose jobs land on a failing node is
  not put back in its queue for the platform's fault. Every other end counts, a lost
  node's too. A runner's ``platform_error`` heard only after its allocation was released
  (a lost node's runner back, a gang member fenced while it failed) is stale, so it ends
  nothing, but as billing reverses that bill then, the scheduler takes the charge its
  release made back from the usage (``refund_late_platform_failure``), once.
  Members of the gang other than the one that reported are told to stop
  (``AllocationRevoked(reason="fenced")``) unless the job succeeded.
  Only the reporter's GPUs are freed at once (``reporter``: the allocation whose runner
  said it ended, so its processes are gone; a lost node's, whose node no pass places on).
  Every other allocation ended here (``Ending.stopping``: a gang's other members, every
  allocation of a job the scheduler ends itself, as at an expired notice) is released all
  the same (billed up to its release, the job moved on), but its GPU leases stay live,
  ``stopping_since`` now: its runner may still be stopping the job there (SIGTERM, the
  grace for its checkpoint, SIGKILL), so no pass places a new job on them (the unique live
  lease per GPU refuses one) and a waiting job's reason names them as being freed
  (``convert.stopping_holder``). They are freed when that runner reports the allocation's
  end (``handlers``: a report fenced as stale still frees them), when a heartbeat of its
  node handled after they were held (the scheduler's clock: ``free_unlisted``) does not
  list the allocation (the runner finished
  without a report heard, or restarted and killed what was left), or when the node is
  declared lost (``node_watch``). It is ``plan_end``
  (decide and build the events, no I/O) then ``apply_endings``, which writes any number of
  planned endings of distinct jobs in a few statements (the handlers end a batch's run of
  end reports that way).
- ``release_expired_notices`` ends, by force, every job whose preemption notice is older
  than the grace: outcome ``preempted``, the job requeued for a new attempt (its next
  allocation takes a new, higher epoch, so a late report from the old runner is fenced),
  ``AllocationRevoked(reason="fenced")`` to each node (its GPUs stay leased while the runner
  stops it, above), and a ``JobPreempted`` said on the silent runner's behalf so the job's
  view moves on.
- Said for the runner, so the job's view follows the scheduler's decision: a job requeued
  after a lost node or a failure gets a ``JobPreempted`` per allocation (event id
  ``said-preempted:<allocation>``; reason ``node lost; requeued for attempt 2 (restart 1 of 3)`` or
  ``attempt 1 failed (user_error: ...); restarting in 5 s``, or after a platform failure
  ``attempt 1 failed (platform_error: ...); retrying in 5 s (platform retry 1 of 3; ...)``);
  a job preempted whose runner reported the stop with the reason ``cancelled`` (the stop
  of a cancel: ``CANCEL_STOP_REASON``) while the job was not being cancelled gets one too,
  reason ``preempted``: the submission service leaves a job whose stop says ``cancelled``
  as it was, waiting for the scheduler's ``job.cancelled``, so without it a runner's wrong
  reason would keep the job RUNNING in its view while it waits in its queue;
  a job that ends FAILED gets
  one ``JobFailed`` (event id ``said-failed:<allocation>``) carrying the decision's reason,
  its ``failure_kind`` and, after a runner's report, its exit code and log tail. A requeued
  job backs off until ``jobs.eligible_at`` (``Tuning.restart_backoff_s``).
- Each ending also tells the nodes' health (``cordon.record_ends``): a platform failure
  its runner says is the node's own (``JobFailed.node_fault``) counts against the node that
  reported it, a success resets the count of each of the job's nodes; enough failures in a
  row cordon the node. A platform failure that follows the job's own input neither counts
  nor resets.
The caller holds the scheduling lock and runs a pass afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

import asyncpg

from trainyard_platform.services.scheduler import allocation_repository as allocation_repo
from trainyard_platform.services.scheduler import cordon
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.domain import (
    PLATFORM,
    Allocation,
    EndDecision,
    EndKind,
    Failure,
    Job,
    JobStatus,
    Outcome,
    allocation_ended,
    end_time,
    release_time,
)
from trainyard_platform.services.scheduler.policy.fairshare import charge, decay_usage
from trainyard_platform.services.scheduler.scheduling import Tuning, job_trace, traced
from trainyard_platform.shared import outbox
from trainyard_platform.shared.events.payloads import (
    AllocationReleased,
    AllocationRevoked,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSucceeded,
)
from trainyard_platform.shared.logs import job_scope
from trainyard_platform.shared.outbox import Traced

log = logging.getLogger(__name__)

CANCEL_STOP_REASON: Final = "cancelled"
"""The reason a runner reports for the stop of a cancel: the scheduler revokes a cancelled
job's allocations with the reason ``cancelled`` and no detail (``handlers``), and the runner
reports the revocation's detail, else its reason. The submission service knows that stop by
it (``services.submission.domain.CANCEL_STOP_REASON``)."""


@dataclass(frozen=True)
class Ending:
    """What ending one job's allocations writes (``plan_end``), for ``apply_endings``."""

    job: Job
    allocations: Sequence[Allocation]
    kind: EndKind
    decision: EndDecision
    releases: list[tuple[str, datetime, Outcome]]
    gpu_seconds: float
    """Charged to the team's fair-share usage: the members' time, none of it when the
    attempt failed through the platform."""
    events: list[Traced]
    """In order, each with the trace context current when it was planned."""
    node_ends: tuple[cordon.NodeEnd, ...] = ()
    """What the ending says of its nodes' health (``cordon.record_ends``): the reporting
    node's platform failure, or a success on every node of the job."""
    stopping: frozenset[str] = frozenset()
    """The allocations whose runner has not said their processes are gone (all but the
    reporter's): their GPUs stay leased, stopping, after the release (``apply_endings``)."""
    unreported: Mapping[str, float] = field(default_factory=dict)
    """The GPU-seconds charged to the usage for each allocation whose runner has not
    reported its end (all but a reporting runner's; a lost node's too): kept on the
    allocation until its runner's first late report settles it
    (``refund_late_platform_failure``)."""
    ended: Mapping[str, datetime] = field(default_factory=dict)
    """When each allocation ended (``domain.end_time``) where that is after its release
    for the bill (``releases``, capped by ``domain.release_time``): the end of the GPU
    leases it gives up at once, which were held until then."""


async def end_gang(
    conn: asyncpg.Connection,
    job: Job,
    allocations: Sequence[Allocation],
    kind: EndKind,
    reported_at: datetime,
    now: datetime,
    tuning: Tuning,
    reporter: str | None = None,
    failed: JobFailed | None = None,
) -> EndDecision:
    """Release ``allocations`` (all the job's live ones) and move the job on; ``reporter``
    is the allocation whose runner said it ended (None: the scheduler decided), ``failed``
    its report when it said the job failed."""
    with job_trace(job.job_id, job.trace_context, "release"):
        ending = plan_end(job, allocations, kind, reported_at, now, tuning, reporter, failed)
    await apply_endings(conn, [ending], now, tuning)
    return ending.decision


def plan_end(
    job: Job,
    allocations: Sequence[Allocation],
    kind: EndKind,
    reported_at: datetime,
    now: datetime,
    tuning: Tuning,
    reporter: str | None = None,
    failed: JobFailed | None = None,
    preempted: JobPreempted | None = None,
) -> Ending:
    """Decide how ``job``'s ``allocations`` end and what that says, without I/O; the events
    carry the trace context current now. ``failed``: the runner's report of a failure;
    ``preempted``: its report of a preemption."""
    decision = allocation_ended(
        job.status,
        kind,
        attempt=job.attempt,
        restarts=job.restarts,
        max_restarts=job.spec.max_restarts,
        failure=(
            Failure(failed.failure_kind, failed.reason, ran=failed.exit_code is not None)
            if failed is not None
            else None
        ),
        backoff_base_s=tuning.restart_backoff_s,
        backoff_max_s=tuning.restart_backoff_max_s,
        platform_retries=job.platform_retries,
        max_platform_retries=tuning.platform_retries,
    )
    releases: list[tuple[str, datetime, Outcome]] = []
    events: list[Traced] = []
    gpu_seconds = 0.0
    unreported: dict[str, float] = {}
    # The runner whose own report ends the attempt has said all it will; a lost node's
    # runner has said nothing yet (it may report when it is back).
    heard = reporter if kind != "lost" else None
    # The reporter's platform failure ends the whole attempt: every member released for it
    # is the platform's to pay, not only the reporter's (billing cannot tell the others),
    # and none of its time is the team's usage either.
    through_platform = kind == "failed" and failed is not None and failed.through_platform
    ended: dict[str, datetime] = {}
    for allocation in allocations:
        released_at = release_time(
            reported_at, allocation.granted_at, now, job.spec.max_runtime_seconds
        )
        releases.append((allocation.allocation_id, released_at, decision.outcome))
        ended_at = end_time(reported_at, allocation.granted_at, now)
        if ended_at > released_at:  # held past the end of its bill
            ended[allocation.allocation_id] = ended_at
        gpus = len(allocation.gpu_indices)
        if not through_platform:
            charged = gpus * (released_at - allocation.granted_at).total_seconds()
            gpu_seconds += charged
            if allocation.allocation_id != heard and charged > 0:
                unreported[allocation.allocation_id] = charged
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
            platform_failure=through_platform,
        )
        events.append(traced(released, job.job_id))
        if allocation.allocation_id != reporter and kind != "succeeded":
            events.append(fence_revocation(allocation, allocation.node_id, tuning.cancel_grace_s))
    if decision.job_status is JobStatus.CANCELLED:
        cancel_reason = job.status_reason or "cancelled"
        events.append(traced(JobCancelled(job_id=job.job_id, reason=cancel_reason), job.job_id))
    elif decision.job_status is JobStatus.FAILED and allocations:
        # The scheduler decides the job's outcome and says it: the runner of a lost node
        # cannot, and a runner's own report is only about its attempt.
        events.append(_said_failed(job.job_id, allocations, reporter, decision, failed, now))
    elif decision.requeued and (decision.restart or decision.platform_retry):
        # Likewise: the job's view must leave RUNNING now, not when it is placed again.
        events.extend(_said_preempted(job.job_id, allocations, reported_at, decision.reason))
    elif decision.requeued and preempted is not None and preempted.reason == CANCEL_STOP_REASON:
        # The runner's report reads as a cancel's stop, which the job's view leaves as it
        # was until the scheduler's job.cancelled; but no cancel stopped it: say so.
        events.extend(_said_preempted(job.job_id, allocations, reported_at, "preempted"))
    return Ending(
        job,
        allocations,
        kind,
        decision,
        releases,
        gpu_seconds,
        events,
        _node_ends(allocations, kind, decision, reporter, failed),
        frozenset(a.allocation_id for a in allocations if a.allocation_id != reporter),
        unreported,
        ended,
    )


def _node_ends(
    allocations: Sequence[Allocation],
    kind: EndKind,
    decision: EndDecision,
    reporter: str | None,
    failed: JobFailed | None,
) -> tuple[cordon.NodeEnd, ...]:
    """A success on each of the job's nodes, or a platform failure on the node whose runner
    reported it as the node's own fault (``JobFailed.node_fault``; a gang's other members
    were only fenced); nothing for any other end, a platform failure that follows the job's
    own input included (its git host, its command: a tenant's jobs must not cordon nodes)."""
    if kind == "succeeded":
        return tuple((a.node_id, None) for a in allocations)
    if decision.failure_kind != PLATFORM or failed is None or not failed.node_fault:
        return ()
    node = next((a.node_id for a in allocations if a.allocation_id == reporter), failed.node_id)
    return ((node, failed.reason or PLATFORM),)


def _said_failed(
    job_id: str,
    allocations: Sequence[Allocation],
    reporter: str | None,
    decision: EndDecision,
    failed: JobFailed | None,
    now: datetime,
) -> Traced:
    """The job's final ``job.failed``, about the reporting allocation (else the first)."""
    first = next((a for a in allocations if a.allocation_id == reporter), allocations[0])
    reported = failed.finished_at if failed is not None else now
    said = JobFailed(
        job_id=job_id,
        allocation_id=first.allocation_id,
        node_id=first.node_id,
        epoch=first.epoch,
        finished_at=end_time(reported, first.granted_at, now),
        exit_code=failed.exit_code if failed is not None else None,
        reason=decision.reason or "failed",
        log_tail=failed.log_tail if failed is not None else "",
        failure_kind=decision.failure_kind or "user_error",
    )
    return traced(said, job_id, event_id=f"said-failed:{first.allocation_id}")


async def apply_endings(
    conn: asyncpg.Connection, endings: Sequence[Ending], now: datetime, tuning: Tuning
) -> None:
    """Write planned endings (of distinct jobs) in a few statements, whatever their number:
    releases (the GPUs of each ending's ``stopping`` allocations kept leased), fair-share usage (two per team), requeues (one, each with its reason, restart
    and back-off), other job states (one per distinct next state and reason), then every
    event in plan order."""
    await allocation_repo.release_allocations(
        conn,
        [r for e in endings for r in e.releases],
        frozenset(a for e in endings for a in e.stopping),
        now,
        {a: charged for e in endings for a, charged in e.unreported.items()},
        {a: ended_at for e in endings for a, ended_at in e.ended.items()},
    )
    by_team: dict[str, float] = {}
    for ending in endings:
        team = ending.job.spec.team
        by_team[team] = by_team.get(team, 0.0) + ending.gpu_seconds
    for team, gpu_seconds in by_team.items():
        await charge_usage(conn, team, gpu_seconds, now, tuning.half_life_s)
    requeued: list[repo.Requeue] = []
    moved: dict[tuple[JobStatus, str | None], list[str]] = {}  # (status, reason) -> jobs
    for ending in endings:
        job_id, decision = ending.job.job_id, ending.decision
        if decision.requeued:
            why = decision.reason or f"{ending.kind}; requeued"
            eligible_at = None
            if decision.backoff_s > 0:
                eligible_at = now + timedelta(seconds=decision.backoff_s)
            requeued.append(
                repo.Requeue(job_id, why, decision.restart, decision.platform_retry, eligible_at)
            )
        else:
            moved.setdefault((decision.job_status, decision.reason), []).append(job_id)
    await repo.requeue_jobs(conn, requeued, now)
    for (status, reason), job_ids in moved.items():
        await repo.set_job_status(conn, job_ids, status, now, reason)
    await outbox.enqueue_traced(conn, [event for e in endings for event in e.events])
    await cordon.record_ends(
        conn,
        [end for e in endings for end in e.node_ends],
        now,
        tuning.cordon_after_platform_failures,
        tuning.cordon_seconds,
    )
    for ending in endings:
        with job_scope(ending.job.job_id):  # a sweep's endings are in no event's span
            log.info(
                "allocation(s) %s of job %s ended (%s): job %s",
                ", ".join(a.allocation_id for a in ending.allocations),
                ending.job.job_id,
                ending.decision.outcome,
                ending.decision.job_status.value,
            )


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


async def refund_late_platform_failure(
    conn: asyncpg.Connection,
    team: str,
    report: JobSucceeded | JobFailed | JobPreempted,
    now: datetime,
    half_life_s: float,
) -> float:
    """Settle the charge the release of ``report``'s allocation left open (``Ending.unreported``)
    now that its own runner (its job, node and epoch as granted) reports its end after the
    release, which the fence calls stale: when that first report is a ``platform_error``
    (``JobFailed.through_platform``), the attempt was the platform's, as billing reverses
    that bill then, so the charge comes off ``team``'s usage; any other report leaves it.
    Either way the charge is settled, so a redelivered or a second report takes nothing back
    (billing heeds only the allocation's first report too). Returns the GPU-seconds taken
    off, as of the usage's time.

    Exact: the charge itself (the GPU-seconds the release added, kept on the allocation)
    and its decay, by the same half-life from the time it was added to the usage's time,
    as the usage row decays; taken off once. Approximate: a usage row whose time was
    already past the release's clock when the charge was added decayed it a little less
    than this assumes, and the usage never goes below zero."""
    charge_at = await allocation_repo.settle_unreported(
        conn, report.job_id, report.allocation_id, report.node_id, report.epoch
    )
    if charge_at is None or not (isinstance(report, JobFailed) and report.through_platform):
        return 0.0
    charged, charged_at = charge_at
    row = await allocation_repo.usage_for_update(conn, team)
    if row is None:
        return 0.0
    as_of = max(now, row["as_of"])
    usage = decay_usage(
        {team: row["gpu_seconds"]}, (as_of - row["as_of"]).total_seconds(), half_life_s
    )
    refund = decay_usage({team: charged}, (as_of - charged_at).total_seconds(), half_life_s)[team]
    refund = min(refund, usage[team])
    await allocation_repo.set_usage(conn, team, usage[team] - refund, as_of)
    return refund


async def release_expired_notices(
    conn: asyncpg.Connection, now: datetime, tuning: Tuning
) -> list[str]:
    """Revoke by force the GPUs of jobs whose preemption grace is over; returns their ids."""
    await repo.lock_scheduler(conn)
    cutoff = now - timedelta(seconds=tuning.preemption_grace_s)
    ended: list[str] = []
    for job_id in await allocation_repo.jobs_with_expired_notice(conn, cutoff):
        with job_scope(job_id):  # the sweep is in no event's span: its lines name the job
            if await _release_expired(conn, job_id, now, tuning):
                ended.append(job_id)
    return ended


async def _release_expired(
    conn: asyncpg.Connection, job_id: str, now: datetime, tuning: Tuning
) -> bool:
    """End ``job_id`` by force (``release_expired_notices``); False when nothing was left to
    end."""
    job = await repo.job_for_update(conn, job_id)
    allocations = await allocation_repo.live_allocations(conn, job_id)
    if job is None or not allocations or not job.status.holds_gpus:
        return False
    log.warning("job %s did not stop within the preemption grace: revoking", job_id)
    await end_gang(conn, job, allocations, "preempted", now, now, tuning)
    with job_trace(job_id, job.trace_context, "preempted"):
        reason = (
            "preempted; the runner did not stop within the grace period, so its GPUs were revoked"
        )
        await outbox.enqueue_traced(conn, _said_preempted(job_id, allocations, now, reason))
    return True


def _said_preempted(
    job_id: str,
    allocations: Sequence[Allocation],
    reported_at: datetime,
    reason: str | None,
) -> list[Traced]:
    """``job.preempted`` on behalf of runners that cannot or did not say it (a lost node, a
    runner that did not stop within the grace): the job goes back to its queue and resumes
    from its checkpoint."""
    return [
        traced(
            JobPreempted(
                job_id=job_id,
                allocation_id=allocation.allocation_id,
                node_id=allocation.node_id,
                epoch=allocation.epoch,
                finished_at=end_time(reported_at, allocation.granted_at, reported_at),
                reason=reason or "preempted",
            ),
            job_id,
            event_id=f"said-preempted:{allocation.allocation_id}",
        )
        for allocation in allocations
    ]


def fence_revocation(allocation: Allocation, node_id: str, grace: float) -> Traced:
    """``AllocationRevoked(reason="fenced")`` telling ``node_id`` to stop ``allocation``. Its
    event id is fixed, so the outbox keeps one such revocation however often it is said."""
    revoke = AllocationRevoked(
        allocation_id=allocation.allocation_id,
        job_id=allocation.job_id,
        node_id=node_id,
        epoch=allocation.epoch,
        reason="fenced",
        grace_seconds=grace,
    )
    return traced(revoke, node_id, event_id=f"fence:{allocation.allocation_id}:{node_id}")
