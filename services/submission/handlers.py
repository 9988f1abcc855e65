"""Event handlers: keep the job view in step with what the platform says about each job.

Each handler runs inside the ``idempotent`` transaction (inbox record + effect commit
together). Lifecycle events move the status only as ``domain.judge`` allows; the rest are
logged and dropped. The envelope's ``source`` tells the scheduler's final ``job.failed``
from a runner's report of one failed attempt, which is recorded (failure and history) while
the status waits for the scheduler's decision. A job the scheduler refused on arrival
(its ``job.failed`` with ``failure_kind`` ``rejected`` and no allocation) goes from QUEUED or
PENDING to FAILED with that reason; it never ran, so no attempt failed and nothing is billed.
Data (metrics, checkpoints, allocations, models, costs) is always
recorded, but a runner's report is believed (its status judged, its data recorded) only of
an allocation granted to that very job on the node that says it (``_runner_report``,
``_not_its_own``): any runner may say one for any job id. Events about jobs this service
never accepted are logged and dropped. The ``job.cancel_requested`` the registry says on
this service's behalf (a job whose parent model version was deleted) is recorded as a
user's cancel is (``_cancel_requested``), so the stop it asks for is not shown as a
preemption.

A runner's report that comes before what it follows (its allocation's grant; for a
``job.succeeded``, the allocation's ``job.started``) is kept (``early_reports``) and judged
right after that arrives: after NATS lost its store the new stream does not keep that order,
and a report ignored then would be lost for good (saying it again is a duplicate the stream
drops). The kept reports of a job go when it ends, in the statement that writes its terminal
status (``repository.set_finished``, the only one that does), whichever event ended it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.submission import early_reports
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.domain import (
    SCHEDULER_SOURCE,
    Apply,
    AttemptFailed,
    Ignore,
    JobState,
    JobStatus,
    LifecycleEvent,
    event_time,
    failed_attempts,
    failure_line,
    failure_record,
    finite_metrics,
    history_reason,
    is_attempt_failure,
    judge,
    process_ended_at,
)
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointSaved,
    CostRecorded,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPending,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSucceeded,
    ModelRegistered,
    dump,
)
from trainyard_platform.shared.events.trust import REGISTRY, delegate_key

log = logging.getLogger(__name__)

CONSUMED: tuple[type[Payload], ...] = (
    JobPending,
    AllocationGranted,
    JobStarted,
    JobProgress,
    CheckpointSaved,
    JobSucceeded,
    JobFailed,
    JobPreempted,
    JobCancelled,
    ModelRegistered,
    CostRecorded,
)
"""Consumed on every subject of their type."""

SAID_ON_ITS_BEHALF: tuple[str, ...] = (nats_subject(JobCancelRequested, delegate_key(REGISTRY)),)
"""What this service consumes only as another says it on its behalf: the registry's
``job.cancel_requested`` (``<type>.by-registry``); its own it records when a user asks."""


async def dispatch(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
    data = envelope.data
    match data:
        case (
            JobPending()
            | AllocationGranted()
            | JobStarted()
            | JobSucceeded()
            | JobFailed()
            | JobPreempted()
            | JobCancelled()
        ):
            await _lifecycle(envelope, data, conn)
        case JobProgress() | CheckpointSaved():
            await _runner_report(envelope, data, conn)
        case ModelRegistered():
            if await _known(conn, envelope, data.job_id):
                await _model(envelope, data, conn)
        case CostRecorded():
            if await _known(conn, envelope, data.job_id):
                await _cost(data, conn)
        case JobCancelRequested() if envelope.source == REGISTRY:
            await _cancel_requested(envelope, data, conn)
        case _:
            return


async def _lifecycle(
    envelope: Envelope[Payload], event: LifecycleEvent, conn: asyncpg.Connection
) -> None:
    row = await repo.lock_job(conn, event.job_id)
    if row is None:
        _unknown(envelope, event.job_id)
        return
    awaited = await early_reports.awaited(
        conn, event, envelope.source, JobStatus(row["status"]), row["allocation_id"]
    )
    if awaited is not None:
        # Judged now it would be ignored, and said again it would be a duplicate the
        # stream drops: it waits instead (early_reports).
        log.info(
            "job %s: %s (%s) came before the %s of allocation %s; kept until it comes",
            event.job_id,
            envelope.type,
            envelope.id,
            awaited.what,
            awaited.allocation_id,
        )
        await early_reports.keep(conn, envelope, event.job_id, awaited.allocation_id)
        return
    foreign = await _not_its_own(conn, envelope, event)
    if foreign is not None:
        log.warning(
            "ignoring %s (%s) for job %s: %s",
            envelope.type,
            envelope.id,
            event.job_id,
            foreign,
        )
        return
    await _judged(envelope, event, row, conn)
    if isinstance(event, AllocationGranted | JobStarted):
        for kept in await early_reports.take(conn, event.allocation_id):
            log.info("job %s: judging %s (%s), which waited", event.job_id, kept.type, kept.id)
            await dispatch(kept, conn)


async def _cancel_requested(
    envelope: Envelope[Payload], event: JobCancelRequested, conn: asyncpg.Connection
) -> None:
    """The registry asked the scheduler to cancel the job on this service's behalf (its
    parent model version was deleted before the registry heard of it:
    ``registry.job_inputs``): recorded as a user's request is (``cancel_requested_at``, the
    first request's time staying), so the view says the job is being cancelled and the
    runner's ``job.preempted`` that reports the stop is not taken for a preemption
    (``domain``: a job whose cancel was requested is never PREEMPTED). Before, this service
    never heard of the request, and the job showed PREEMPTED, its history "preempted", until
    the scheduler's ``job.cancelled`` came. The request comes before that ``job.preempted``
    in the stream (the scheduler revokes the job only once it has the request), but may be
    handled after it (redelivered after a failure, said again after NATS lost its store):
    ``domain.judge`` knows that stop by its reason too, so either order ends the same.
    Nothing is recorded of a job that has ended."""
    row = await repo.lock_job(conn, event.job_id)
    if row is None:
        _unknown(envelope, event.job_id)
        return
    if JobStatus(row["status"]).is_terminal:
        log.info(
            "job %s: ignoring %s (%s) from %s: the job has ended",
            event.job_id,
            envelope.type,
            envelope.id,
            envelope.source,
        )
        return
    log.info("job %s: cancel requested by %s: %s", event.job_id, envelope.source, event.reason)
    await repo.set_cancel_requested_by_delegate(conn, event.job_id, envelope.time)


async def _not_its_own(
    conn: asyncpg.Connection, envelope: Envelope[Payload], event: LifecycleEvent
) -> str | None:
    """Why a runner's report on an allocation (its start, success, failure or preemption)
    is not that allocation's own, or None: the allocation was never granted to this job, or
    was granted on another node than the one that says it (``node_id``, which the bus vouches
    for). Any runner may say these for any job id, so, as for ``_runner_report``, nothing of
    such a report is judged or recorded (before, a success's ``metrics`` were merged into
    the job it named, another team's too, ahead of its judgement). A report whose grant has
    not come yet waited for it already (``early_reports``); the scheduler's own say is
    judged as it is."""
    if not isinstance(event, early_reports.REPORTS) or envelope.source == SCHEDULER_SOURCE:
        return None
    granted_to = await conn.fetchval(
        "SELECT node_id FROM job_allocations WHERE allocation_id = $1 AND job_id = $2",
        event.allocation_id,
        event.job_id,
    )
    if granted_to is None:
        return f"allocation {event.allocation_id!r} was never granted to it"
    if event.node_id != granted_to:
        return f"allocation {event.allocation_id} is node {granted_to}'s, not {event.node_id}'s"
    return None


async def _judged(
    envelope: Envelope[Payload],
    event: LifecycleEvent,
    row: asyncpg.Record,
    conn: asyncpg.Connection,
) -> None:
    """Record ``event`` and move the job's status as ``judge`` rules (``row``: the job,
    locked)."""
    if isinstance(event, AllocationGranted):
        # Whatever the status does, the lease exists and will be billed.
        await repo.insert_allocation(
            conn,
            event.allocation_id,
            event.job_id,
            event.node_id,
            event.gpu_indices,
            event.attempt,
            event.epoch,
            event.granted_at,
        )
    if isinstance(event, JobSucceeded) and event.metrics:
        await repo.merge_metrics(
            conn, event.job_id, None, finite_metrics(event.metrics), envelope.time
        )
    failure = row["failure"]
    attempt_allocations: frozenset[str] = frozenset()
    if isinstance(event, JobFailed) and row["attempt"] is not None:
        attempt_allocations = frozenset(
            await repo.attempt_allocations(conn, event.job_id, row["attempt"])
        )
    state = JobState(
        status=JobStatus(row["status"]),
        allocation_id=row["allocation_id"],
        attempt=row["attempt"],
        pending_reason=row["pending_reason"],
        cancel_requested=row["cancel_requested_at"] is not None,
        attempt_allocations=attempt_allocations,
        failed_attempt=failure.get("attempt") if failure else None,
    )
    if (
        isinstance(event, JobFailed)
        and _refused_on_arrival(event, envelope.source)
        and state.status in _NOT_PLACED
    ):
        await _refused(conn, event, failure)
        return
    verdict = judge(state, event, envelope.source)
    if isinstance(verdict, Ignore):
        log.info(
            "job %s: ignoring %s (%s) from %s: %s",
            event.job_id,
            envelope.type,
            envelope.id,
            envelope.source,
            verdict.reason,
        )
        return
    if isinstance(event, JobFailed):
        await _failed(conn, envelope, event, verdict, row["attempt"], failure)
        return
    if not isinstance(verdict, Apply):  # pragma: no cover - only a failure is an attempt's
        return
    at = event_time(event, envelope.time)
    if isinstance(event, JobCancelled):
        # A cancelled job whose process had already failed ended when that process did.
        at = process_ended_at(state, failure) or at
    await _apply(conn, event, verdict, at)
    if verdict.record:
        await repo.insert_history(conn, event.job_id, verdict.status, at, history_reason(event))


async def _apply(
    conn: asyncpg.Connection, event: LifecycleEvent, verdict: Apply, at: datetime
) -> None:
    job_id = event.job_id
    match event:
        case JobPending():
            await repo.set_pending(
                conn,
                job_id,
                event.reason,
                event.position,
                event.estimated_start,
                event.blocking,
                event.suggestion,
            )
        case AllocationGranted():
            await repo.set_scheduled(
                conn, job_id, event.allocation_id, event.node_id, event.gpu_indices, event.attempt
            )
        case JobStarted():
            await repo.set_running(conn, job_id, event.started_at)
        case JobPreempted():
            await repo.set_preempted(conn, job_id, verdict.status)
        case JobSucceeded() | JobCancelled():
            # The job keeps a recorded failure (of an attempt that failed before).
            await repo.set_finished(conn, job_id, verdict.status, at, None)
        case _:
            pass


async def _failed(
    conn: asyncpg.Connection,
    envelope: Envelope[Payload],
    event: JobFailed,
    verdict: Apply | AttemptFailed,
    attempt: int | None,
    previous: dict[str, Any] | None,
) -> None:
    """Record a failure: an attempt's (the status stays; the scheduler decides what comes
    next) or the job's, said by the scheduler (the job is FAILED). Either adds a FAILED
    history entry."""
    final = not is_attempt_failure(event, envelope.source)
    record = failure_record(event, final=final, attempt=attempt, previous=previous)
    at = event.finished_at
    if isinstance(verdict, AttemptFailed):
        await repo.set_failure(conn, event.job_id, record)
    else:
        await repo.set_finished(conn, event.job_id, verdict.status, at, record)
    await repo.insert_history(conn, event.job_id, JobStatus.FAILED, at, failure_line(record))


_NOT_PLACED = (JobStatus.QUEUED, JobStatus.PENDING)


def _refused_on_arrival(event: JobFailed, source: str) -> bool:
    """The scheduler's ``job.failed`` for a job it refused before placing it anywhere."""
    return (
        source == SCHEDULER_SOURCE and event.failure_kind == "rejected" and not event.allocation_id
    )


async def _refused(
    conn: asyncpg.Connection, event: JobFailed, previous: dict[str, Any] | None
) -> None:
    """The job is FAILED with the scheduler's reason; no attempt of it ran."""
    record = failure_record(event, final=True, attempt=None, previous=previous)
    record["failed_attempts"] = failed_attempts(previous)
    at = event.finished_at
    await repo.set_finished(conn, event.job_id, JobStatus.FAILED, at, record)
    await repo.insert_history(conn, event.job_id, JobStatus.FAILED, at, failure_line(record))


async def _checkpoint(event: CheckpointSaved, conn: asyncpg.Connection) -> None:
    ref = event.checkpoint
    await repo.insert_checkpoint(
        conn,
        event.job_id,
        ref.uri,
        ref.manifest_uri,
        ref.step,
        ref.size_bytes,
        ref.sha256,
        event.allocation_id,
        event.saved_at,
    )


async def _model(
    envelope: Envelope[Payload], event: ModelRegistered, conn: asyncpg.Connection
) -> None:
    await repo.insert_model(
        conn,
        event.model_version_id,
        event.job_id,
        event.model_name,
        event.version,
        event.artifact_uri,
        event.artifact_sha256,
        finite_metrics(event.metrics),
        dump(event.lineage),
        envelope.time,
    )


async def _cost(event: CostRecorded, conn: asyncpg.Connection) -> None:
    await repo.upsert_cost(
        conn,
        event.allocation_id,
        event.job_id,
        event.gpu_flavor,
        event.gpus,
        event.started_at,
        event.ended_at,
        event.gpu_seconds,
        event.price_per_gpu_hour,
        event.cost,
        event.currency,
        event.revision,
    )


async def _known(conn: asyncpg.Connection, envelope: Envelope[Payload], job_id: str) -> bool:
    if await repo.job_exists(conn, job_id):
        return True
    _unknown(envelope, job_id)
    return False


async def _runner_report(
    envelope: Envelope[Payload], event: JobProgress | CheckpointSaved, conn: asyncpg.Connection
) -> None:
    """Apply a runner's ``job.progress`` or ``checkpoint.saved`` only for an allocation the
    scheduler granted this very job on the node that says it (``job_allocations``): any
    runner may say them for any job id, but only under its own node (``node_id``, which the
    bus vouches for: ``shared.events.trust``), so this keeps a forged report from writing
    another job's step, metrics or checkpoints, and a gang member from writing a peer's. An
    event from before the field existed names no node and is held to the rest. One of an
    allocation not granted (yet) waits for the grant like the other reports
    (``early_reports``: applied when it comes, forgotten when the job ends, refused beyond
    ``MAX_KEPT_PER_NODE`` from its node); one for a job that has ended is dropped."""
    row = await repo.lock_job(conn, event.job_id)
    if row is None:
        _unknown(envelope, event.job_id)
        return
    granted_to = await conn.fetchval(
        "SELECT node_id FROM job_allocations WHERE allocation_id = $1 AND job_id = $2",
        event.allocation_id,
        event.job_id,
    )
    if granted_to is not None and event.node_id not in (None, granted_to):
        log.warning(
            "ignoring %s (%s) for job %s: allocation %s is node %s's, not %s's",
            envelope.type,
            envelope.id,
            event.job_id,
            event.allocation_id,
            granted_to,
            event.node_id,
        )
    elif granted_to is not None:
        if isinstance(event, CheckpointSaved):
            await _checkpoint(event, conn)
        else:
            metrics = finite_metrics(event.metrics)
            await repo.merge_metrics(conn, event.job_id, event.step, metrics, envelope.time)
    elif JobStatus(row["status"]).is_terminal:
        log.warning(
            "ignoring %s (%s) for ended job %s: allocation %s was never granted to it",
            envelope.type,
            envelope.id,
            event.job_id,
            event.allocation_id,
        )
    else:
        log.info(
            "job %s: %s (%s) of allocation %s, not granted to it; kept until it is",
            event.job_id,
            envelope.type,
            envelope.id,
            event.allocation_id,
        )
        await early_reports.keep(conn, envelope, event.job_id, event.allocation_id)


def _unknown(envelope: Envelope[Payload], job_id: str) -> None:
    log.warning("ignoring %s (%s) for unknown job %s", envelope.type, envelope.id, job_id)
