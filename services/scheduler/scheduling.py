"""One scheduling pass in one transaction: snapshot in, the policy's decisions applied.

Contract of ``run_pass(conn, now, tuning)`` (inside the caller's transaction, under the
scheduling lock, so replicas never interleave and the snapshot's queries see one state):
- The snapshot is built from the repository's rows (``convert.build_snapshot``) and given to
  the pure policy (``policy.engine.schedule``).
- Each placement becomes one allocation per node (a gang shares one ``gang_id``), one lease
  per GPU (the partial unique index refuses a GPU leased twice, whatever the code does), and
  one ``AllocationGranted`` routed to each node; the job becomes ALLOCATED. A gang's members
  are in node id order (string order), which is its rank order: every grant of the gang
  carries the same ``gang`` list (node, allocation, the node's heartbeat address, GPUs, first
  rank = the GPUs of the members before it); a job on one node gets ``gang=[]``.
- Queued jobs backing off after a failure (``eligible_at`` ahead) are kept from the policy
  and told why (``convert.restart_note``).
- Each preemption puts a notice on the victim's live allocations and sends each node an
  ``AllocationRevoked(reason="preempted", grace_seconds=<preemption grace>)``; so does each
  running job a spent budget stops (``budget_holds.stops``: its detail starts
  ``budget_exhausted:``). The victim
  keeps its GPUs until its runner reports ``JobPreempted`` or the grace runs out
  (``leases.release_expired_notices``).
- Each waiting job's ``JobPending`` (reason, position, blocking, suggestion, estimated start)
  is published only when it is news (``convert.note_changed``), so a pass over thousands of
  waiting jobs publishes only what changed. With ``settled_notes`` a pass that placed jobs
  publishes no notes at all: its explanations describe the cluster half-way through its own
  placements (which node's holders they name depends on the order GPUs filled up), so the
  caller runs a follow-up pass on the settled state, whose notes the next passes repeat
  exactly -- otherwise every placement would re-publish thousands of unchanged waits.
Every event leaves through the outbox, so it is published exactly when the change commits.
Events about a job are said inside the job's own trace (``job_trace``): a pass triggered by
anything at all still continues the trace its submission started.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from opentelemetry import trace

from trainyard_platform.services.scheduler import allocation_repository as allocation_repo
from trainyard_platform.services.scheduler import budget_holds
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.convert import (
    Built,
    PendingNote,
    build_snapshot,
    note_changed,
    pending_notes,
)
from trainyard_platform.services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    Job,
    JobStatus,
)
from trainyard_platform.services.scheduler.inventory import InventoryMode
from trainyard_platform.services.scheduler.policy.engine import PolicyState
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Placement,
    PolicyConfig,
    Preemption,
)
from trainyard_platform.shared import outbox
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationRevoked,
    GangMember,
)
from trainyard_platform.shared.logs import job_scope
from trainyard_platform.shared.metrics import instrument
from trainyard_platform.shared.telemetry import extract, inject, tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

SOURCE = "trainyard/scheduler"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class PassResult:
    """A settled pass, as ``run_pass(keep=...)`` hands it over (``fast_path`` keeps it)."""

    built: Built
    state: PolicyState
    """The pass's state after its run."""
    decisions: Decisions
    """What the run decided."""
    published: Mapping[str, PendingNote]
    """The notes this pass published (newer than those in ``built.pending``'s rows)."""


@dataclass(frozen=True)
class Tuning:
    """The scheduler's tunables, read once from its settings."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The policy's own (``grace_s`` is the preemption grace)."""
    cancel_grace_s: float = 30.0
    """Time a runner gets to stop a job whose allocation is revoked for a cancel."""
    restart_backoff_s: float = 5.0
    """A job restarted after a failure waits ``restart_backoff_s * 2**(restarts-1)`` (0:
    not at all) before it may be placed again ..."""
    restart_backoff_max_s: float = 300.0
    """... but at most this long."""
    platform_retries: int = 3
    """Retries of a job after ``platform_error`` failures (apart from its ``max_restarts``),
    each backing off as a restart does."""
    cordon_after_platform_failures: int = 3
    """A node whose allocations end in ``platform_error`` this many times in a row is
    cordoned for ``cordon_seconds`` (``cordon``); 0: never."""
    cordon_seconds: float = 600.0
    max_waiting_jobs: int = 10_000
    """A team's jobs waiting at most; one more arriving is refused (``admission``); 0: no
    limit."""
    node_inventory: InventoryMode = InventoryMode.OPTIONAL
    """What a node the inventory does not declare gets (``inventory``)."""

    @property
    def preemption_grace_s(self) -> float:
        return self.policy.grace_s

    @property
    def half_life_s(self) -> float:
        return self.policy.half_life_s


def _envelope(payload: Payload, subject: str, event_id: str | None = None) -> Envelope[Payload]:
    return Envelope.wrap(payload, source=SOURCE, subject=subject, event_id=event_id)


async def emit(
    conn: asyncpg.Connection, payload: Payload, subject: str, event_id: str | None = None
) -> None:
    """Enqueue ``payload`` in the outbox of the current transaction."""
    await outbox.enqueue_traced(conn, [traced(payload, subject, event_id)])


def traced(payload: Payload, subject: str, event_id: str | None = None) -> outbox.Traced:
    """``payload`` as an event to enqueue later, in the trace context current now."""
    return _envelope(payload, subject, event_id), inject()


def job_trace(
    job_id: str, carrier: Mapping[str, Any] | None, what: str
) -> AbstractContextManager[trace.Span | None]:
    """Run the block in a span of the job's own trace (from its submission), unless a span
    is active already (an event handler's, which carries the trace it came with); yields
    the span made (None when none was). One context manager, not a generator around one:
    a pass makes a grant span per job it places."""
    if not carrier or trace.get_current_span().get_span_context().is_valid:
        return nullcontext()
    return _tracer.start_as_current_span(
        f"scheduler {what}", context=extract(carrier), attributes={"trainyard.job_id": job_id}
    )


def queue_wait(job: Job, now: datetime) -> None:
    """Trace ``job``'s wait in its queue, from entering it to its grant at ``now``: a
    ``scheduler queue wait`` span in the job's own trace, with the last reason the job was
    told as its ``job.pending`` event (each earlier note is the event of its own ``scheduler
    pending`` span). Only for a job that was told a reason: one granted by the first pass
    after it arrived waited for that pass, not in the queue, and the gap between its
    ``job.submitted`` and its grant already shows that; a span for each would cost the
    scheduler about 40 us a decision (BENCHMARKS.md, "Tracing cost")."""
    if job.pending_reason is None or job.changed_at is None or not job.trace_context:
        return
    span = _tracer.start_span(
        "scheduler queue wait",
        context=extract(job.trace_context),
        attributes={
            "trainyard.job_id": job.job_id,
            "trainyard.queue": job.queue,
            "trainyard.queue.wait_s": max(0.0, (now - job.changed_at).total_seconds()),
        },
        start_time=_nanoseconds(job.changed_at),
    )
    if span.is_recording():
        pending: dict[str, str | int] = {"trainyard.pending.reason": job.pending_reason}
        if job.pending_position is not None:
            pending["trainyard.pending.position"] = job.pending_position
        span.add_event("job.pending", pending)
    span.end(end_time=_nanoseconds(now))


_queue_wait = instrument("trainyard.scheduler.queue.wait")


def record_queue_wait(job: Job, now: datetime, histogram: Any = _queue_wait) -> None:
    """Record on ``trainyard.scheduler.queue.wait`` how long ``job``, granted at ``now``,
    waited in its queue: since it entered it (``changed_at``: its submission or the end of
    its last attempt; its submission when unknown)."""
    entered = job.changed_at or job.submitted_at
    histogram.record(max(0.0, (now - entered).total_seconds()), {"queue": job.queue})


def _nanoseconds(moment: datetime) -> int:
    """``moment`` as OpenTelemetry's timestamps: integer nanoseconds since the epoch."""
    return int(moment.timestamp() * 1_000_000_000)


async def run_pass(
    conn: asyncpg.Connection,
    now: datetime,
    tuning: Tuning | None = None,
    settled_notes: bool = False,
    keep: Callable[[PassResult], None] | None = None,
) -> Decisions:
    """One scheduling pass inside the caller's transaction (see the module docstring)."""
    tuning = tuning or Tuning()
    await repo.lock_scheduler(conn)
    built = build_snapshot(
        await repo.load_snapshot_rows(conn), now, tuning.half_life_s, tuning.policy.ageing_s
    )
    state = PolicyState(built.snapshot, tuning.policy)
    decisions = state.run()  # = schedule(built.snapshot, tuning.policy)
    await _grant(conn, built, decisions.placements, now)
    for preemption in decisions.preemptions:
        await _give_notice(conn, built, preemption, now, tuning.preemption_grace_s)
    victims = [p.job_id for p in decisions.preemptions]
    stopped = budget_holds.stops(built.running, built.holds, victims)
    for job_id, reason in stopped:
        await _notice(conn, built, job_id, reason, now, tuning.preemption_grace_s)
    published = 0
    if not (settled_notes and decisions.placements):
        news = await _publish_pending(conn, built, decisions, now)
        published = len(news)
        settled = not decisions.placements and not decisions.preemptions and not stopped
        if keep is not None and settled:
            # The settled state: a pass over it now would decide exactly this again.
            keep(PassResult(built, state, decisions, dict(news)))
    if decisions.placements or decisions.preemptions:
        log.info(
            "pass placed %s; preempted %s; %d waiting, %d pending notes published",
            _first(
                f"{p.job_id}->{','.join(f'{n}{list(g)}' for n, g in sorted(p.gpus.items()))}"
                for p in decisions.placements
            )
            or "nothing",
            _first(f"{p.job_id} for {p.for_job_id}" for p in decisions.preemptions) or "none",
            len(decisions.explanations)
            + len(built.held_back)
            + len(built.backing_off)
            + len(built.budget_held),
            published,
        )
    return decisions


def _first(items: Iterable[str], shown: int = 10) -> str:
    """A log-sized list: the first ``shown`` items and how many more (a pass on a big cluster
    can place thousands; each placement is also in its job's trace and events)."""
    listed = list(items)
    more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
    return ", ".join(listed[:shown]) + more


async def _grant(
    conn: asyncpg.Connection, built: Built, placements: Sequence[Placement], now: datetime
) -> None:
    """Apply a pass's placements together: a few statements however many there are."""
    if not placements:
        return
    jobs = await repo.jobs_by_id(conn, [p.job_id for p in placements])
    resumes = await allocation_repo.resume_points(conn, list(jobs))
    members = [(p, sorted(p.gpus.items())) for p in placements]
    epochs = iter(await allocation_repo.next_epochs(conn, sum(len(m) for _, m in members)))
    counts = {n.node_id: n.gpu_count for n in built.snapshot.nodes}
    allocations: list[Allocation] = []
    events: list[outbox.Traced] = []
    for placement, nodes in members:
        job = jobs[placement.job_id]
        job.status.check(JobStatus.ALLOCATED)
        gang_id = str(uuid.uuid4())
        gang: list[Allocation] = []
        for node_id, indices in nodes:
            count = counts.get(node_id, 0)
            if not indices or any(not 0 <= i < count for i in indices):
                # The policy must only hand out GPUs the node has; the lease index can't see it.
                raise ValueError(f"placement {placement} is outside the {count} GPUs of {node_id}")
            gang.append(
                Allocation(
                    allocation_id=str(uuid.uuid4()),
                    job_id=job.job_id,
                    node_id=node_id,
                    epoch=next(epochs),
                    attempt=job.attempt,
                    gpu_indices=tuple(indices),
                    status=AllocationStatus.GRANTED,
                    granted_at=now,
                    gang_id=gang_id,
                    gang_size=len(nodes),
                    borrowed=placement.borrowed,
                )
            )
        allocations.extend(gang)
        rendezvous = gang_members(gang, built.addresses)
        queue_wait(job, now)
        record_queue_wait(job, now)
        with job_trace(job.job_id, job.trace_context, "grant"):
            for allocation in gang:
                granted = AllocationGranted(
                    allocation_id=allocation.allocation_id,
                    job_id=job.job_id,
                    node_id=allocation.node_id,
                    gpu_indices=list(allocation.gpu_indices),
                    epoch=allocation.epoch,
                    attempt=allocation.attempt,
                    granted_at=now,
                    spec=job.spec,
                    gang=rendezvous,
                    queue=job.queue or None,
                    resume=resumes.get(job.job_id),
                )
                events.append(outbox.traced(_envelope(granted, allocation.node_id)))
    await allocation_repo.insert_allocations(conn, allocations)
    await repo.set_job_status(conn, list(jobs), JobStatus.ALLOCATED, now)
    await outbox.enqueue_traced(conn, events)


def gang_members(gang: Sequence[Allocation], addresses: Mapping[str, str]) -> list[GangMember]:
    """The rendezvous list of a gang's allocations, in their order (node id order: rank
    order); empty for a job on one node."""
    if len(gang) < 2:
        return []
    members: list[GangMember] = []
    first_rank = 0
    for allocation in gang:
        gpus = len(allocation.gpu_indices)
        members.append(
            GangMember(
                node_id=allocation.node_id,
                allocation_id=allocation.allocation_id,
                address=addresses.get(allocation.node_id, "127.0.0.1"),
                gpus=gpus,
                first_rank=first_rank,
            )
        )
        first_rank += gpus
    return members


async def _give_notice(
    conn: asyncpg.Connection, built: Built, preemption: Preemption, now: datetime, grace: float
) -> None:
    await _notice(conn, built, preemption.job_id, preemption.reason, now, grace)


async def _notice(
    conn: asyncpg.Connection, built: Built, job_id: str, reason: str, now: datetime, grace: float
) -> None:
    """A preemption notice to ``job_id``'s live allocations (the policy's victim, or a job
    its budget stops): ``AllocationRevoked(reason="preempted", detail=reason)``."""
    members = built.running.get(job_id, ())
    fresh = [m for m in members if m["notice_at"] is None]
    if not fresh:
        return  # the policy never picks a job under notice; nothing to say twice
    await allocation_repo.set_notice(conn, [str(m["allocation_id"]) for m in fresh], now, reason)
    contexts = await repo.trace_contexts(conn, [job_id])
    with job_trace(job_id, contexts.get(job_id), "preempt"):
        for m in fresh:
            revoke = AllocationRevoked(
                allocation_id=str(m["allocation_id"]),
                job_id=job_id,
                node_id=m["node_id"],
                epoch=m["epoch"],
                reason="preempted",
                grace_seconds=grace,
                detail=reason,
            )
            await emit(conn, revoke, m["node_id"], event_id=f"preempt:{m['allocation_id']}")
    # A pass is about many jobs (and may run while a handler of another job's event does):
    # this line names the victim.
    with job_scope(job_id):
        log.info("preemption notice to %s: %s", job_id, reason)


def _pending_attributes(note: PendingNote) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "trainyard.pending.reason": note.reason,
        "trainyard.pending.position": note.position,
    }
    if note.blocking:
        attributes["trainyard.pending.blocking"] = note.blocking
    return attributes


async def _publish_pending(
    conn: asyncpg.Connection, built: Built, decisions: Decisions, now: datetime
) -> list[tuple[str, PendingNote]]:
    news: list[tuple[str, PendingNote]] = []
    for job_id, note in sorted(pending_notes(decisions, built).items()):
        row = built.pending.get(job_id)
        if row is not None and note_changed(PendingNote.from_row(row), note, now):
            news.append((job_id, note))
    await publish_notes(conn, news)
    return news


async def publish_notes(conn: asyncpg.Connection, news: Sequence[tuple[str, PendingNote]]) -> None:
    """Publish these notes of waiting jobs (``JobPending``, in each job's trace) and remember
    them as the last published."""
    if news:
        await repo.set_pending(conn, news)
        contexts = await repo.trace_contexts(conn, [job_id for job_id, _ in news])
        events = []
        for job_id, note in news:
            with job_trace(job_id, contexts.get(job_id), "pending") as span:
                if span is not None and span.is_recording():
                    # The reason is the span's event too, so the trace says why the job waits.
                    span.add_event("job.pending", _pending_attributes(note))
                events.append(outbox.traced(_envelope(note.to_event(job_id), job_id)))
        await outbox.enqueue_traced(conn, events)
