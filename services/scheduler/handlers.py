"""Event handlers of the scheduler: ``apply`` takes every batch of events it consumes.

``apply`` runs inside the transaction opened by ``shared.inbox.idempotent_batches`` (so a
redelivered event does nothing) for a whole batch of events, and after that transaction's
guard (``LeaderWork``: the scheduling lock, so replicas and passes never interleave, then the
leader check: a scheduler that is no longer the leader fails the transaction, and the events
are handed back for the new leader: ``NotLeader`` is a ``bus.NotNow``). Handlers therefore neither lock nor check leadership.

Events about allocations are fenced by allocation id and epoch; a stale or out-of-order
event is logged and ignored, never applied. One exception: the success of an allocation
released because its node was declared lost is a real result, and is kept
(``late_success``). An end report of an allocation that ended here already still says its
processes are gone: the GPUs kept leased while it stopped (``leases``) are freed, and so
are they when a node's heartbeat handled after they were held (the scheduler's clock, not
the runner's) does not list the allocation; either asks for a pass. Such a report, its runner's first after the release, also settles
the fair-share charge that release made: a ``platform_error`` takes it back off the team's
usage, as billing reverses that bill (``leases.refund_late_platform_failure``). An event
that can never apply is rejected to the
dead-letter stream. A change of supply or demand asks for a scheduling pass (``poke``),
which runs in its own transaction right after this one commits; a newly queued job is only
reported (``arrived``, when given: the leader decides it by the fast path or asks for a
pass), and a checkpoint or the cancel of a running job, which ask for no pass, are reported
as a change (``stale``). A submitted job that the
cluster's configuration can never run (``admission``) is refused on arrival: the scheduler says
its final ``job.failed`` (``failure_kind`` ``rejected``) and never queues it.

Events are applied in order, one by one, except runs of submissions and end reports
(``job.succeeded``, ``job.failed``, ``job.preempted``) of distinct jobs (``_run``), which
commute: each such run of two or more is read and written in a few statements
(``_apply_run``), since a busy cluster's arrivals and completions would otherwise cost most of
the scheduler's time in round trips to the database (it holds the scheduling lock all
along). A run is handled in one consumer span for up to ``shared.bus.link_limit()`` of its
events (``shared.bus.batch_span``, a trace of its own linked to each event's context:
OpenTelemetry's messaging conventions for a batch), and each event that carries a context
goes on in it without a span of its own: a job admitted keeps the context its submission came
with (the submission service's span), so its grant is a span of the submission's trace; what
an ending says (the ``allocation.released`` billing hangs from) carries its report's context
(``Delivery.continued``: the runner's span). The jobs admitted are inserted in one
statement, in order, and the endings applied, after those spans (so those statements are in
none of the jobs' traces; what is logged about a job names it). A submission that came
without a context, or that is refused (its ``job.failed`` said in the job's trace), is
handled in a span of its own (``Delivery.span``), whose trace the job keeps; so is an end
report without a context (what its ending says carries that span's context) and a lost
node's late success. A run ends at any other event, or at a second event about a job already
in it, so the state it leaves is the one applying its events one by one leaves (the outbox
rows of different jobs may be in another order; each job's own keep theirs). An event that
would start a run but is not followed by another of one (a batch of one, as at a low rate,
and each event of a failed batch handled again alone) is handled alone, in its span: a
submission whole (its ``INSERT`` is a query of its trace, and a failure of it is that span's
error), an end report's decision (its two reads and the writes are outside the span, as in a
run).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import asyncpg

from trainyard_platform.services.scheduler import admission, budget_holds, node_supply
from trainyard_platform.services.scheduler import allocation_repository as allocation_repo
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.domain import (
    Allocation,
    AllocationStatus,
    EndKind,
    Job,
    JobStatus,
    fence,
)
from trainyard_platform.services.scheduler.inventory import Claim, cap
from trainyard_platform.services.scheduler.late_success import accept_late_success
from trainyard_platform.services.scheduler.leases import (
    CANCEL_STOP_REASON,
    Ending,
    apply_endings,
    fence_revocation,
    plan_end,
    refund_late_platform_failure,
)
from trainyard_platform.services.scheduler.scheduling import Clock, Tuning, emit, utc_now
from trainyard_platform.shared import outbox
from trainyard_platform.shared.bus import Delivery, Reject, batch_span, link_chunks
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationRevoked,
    BudgetUpdated,
    CheckpointSaved,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.telemetry import inject

log = logging.getLogger(__name__)

EndReport = JobSucceeded | JobFailed | JobPreempted
_END_KINDS: dict[type[EndReport], EndKind] = {
    JobSucceeded: "succeeded",
    JobFailed: "failed",
    JobPreempted: "preempted",
}


def _run(deliveries: Sequence[Delivery], i: int) -> Sequence[Delivery]:
    """The run of submissions and end reports of distinct jobs that starts at
    ``deliveries[i]``: empty when that event is of another type."""
    seen: set[str] = set()
    end = i
    while end < len(deliveries):
        data = deliveries[end].envelope.data
        if not isinstance(data, JobSubmitted | EndReport) or data.job_id in seen:
            break
        seen.add(data.job_id)
        end += 1
    return deliveries[i:end]


@dataclass(frozen=True)
class _Known:
    """What ending a run's jobs reads: the jobs, and their live allocations, by job id."""

    jobs: Mapping[str, Job]
    live: Mapping[str, Sequence[Allocation]]


class SchedulerHandlers:
    """The scheduler's event handling; ``apply`` is the transactional batch handler."""

    def __init__(
        self,
        revoke_grace_seconds: float | None = None,
        clock: Clock = utc_now,
        *,
        consumer: str = "scheduler",
        tuning: Tuning | None = None,
        poke: Callable[[], None] = lambda: None,
        arrived: Callable[[str], None] | None = None,
        stale: Callable[[], None] = lambda: None,
    ) -> None:
        self._consumer = consumer
        self._arrived = arrived
        """Told each job queued (it asks for no pass then: the caller decides it); None:
        a queued job asks for a pass."""
        self._stale = stale
        """Told of a change a pass reads that asks for no pass (a checkpoint)."""
        self._tuning = tuning or Tuning()
        if revoke_grace_seconds is not None:
            self._tuning = replace(self._tuning, cancel_grace_s=revoke_grace_seconds)
        self._clock = clock
        self._poke = poke
        self._facts: dict[tuple[str, str], admission.Facts] | None = None
        """Admission facts by (team, flavor), kept for one batch (see ``_admission_facts``)."""
        self._queues: dict[str, str] | None = None
        """Each team's queue, kept for one batch (see ``_queue_for``)."""
        self._waiting: dict[str, int] | None = None
        """Each team's waiting jobs, counted for one batch (see ``_too_many_waiting``)."""

    @property
    def tuning(self) -> Tuning:
        return self._tuning

    async def apply(self, deliveries: Sequence[Delivery], conn: asyncpg.Connection) -> None:
        """Apply a batch of first-time deliveries in order (see the module docstring)."""
        self._facts = {}
        self._queues = {}
        self._waiting = {}
        try:
            await self._apply(deliveries, conn)
        finally:
            self._facts = None
            self._queues = None
            self._waiting = None

    async def _apply(self, deliveries: Sequence[Delivery], conn: asyncpg.Connection) -> None:
        now = self._clock()
        i = 0
        while i < len(deliveries):
            delivery, data = deliveries[i], deliveries[i].envelope.data
            run = _run(deliveries, i)
            if len(run) > 1:
                await self._apply_run(conn, run, now)
            elif isinstance(data, EndReport):
                await self.on_ended(conn, delivery, data, now)
            else:
                with delivery.span(self._consumer):
                    await self.dispatch(delivery.envelope, conn, now)
            i += max(1, len(run))

    async def _apply_run(
        self, conn: asyncpg.Connection, run: Sequence[Delivery], now: datetime
    ) -> None:
        """Apply a run of two or more submissions and end reports of distinct jobs
        (``_run``), each ``link_limit()`` of them in one ``batch_span``. Each event that
        carries a trace context goes on in it without a span of its own: a job admitted keeps
        its submission's context (its grant is a span of that trace), and what an ending says
        carries its report's (the runner's span); a submission that carries none, or that is
        refused, and an end report that carries none, is handled in a span of its own
        (``Delivery.span``: a refusal is said in the job's trace). The jobs admitted are
        inserted in one statement and the endings applied in a few, after the spans."""
        reports = [(d, data) for d in run if isinstance(data := d.envelope.data, EndReport)]
        known = await self._known(conn, reports)
        admitted: list[repo.NewJob] = []
        endings: list[Ending] = []
        moved = False
        for chunk in link_chunks(run):
            with batch_span(chunk, self._consumer):
                for delivery in chunk:
                    data = delivery.envelope.data
                    if isinstance(data, EndReport):
                        moved |= await self._end(conn, delivery, data, known, now, endings, True)
                    elif isinstance(data, JobSubmitted):
                        job = await self._admit_carried(conn, delivery, data, now)
                        if job is not None:
                            admitted.append(job)
        await self._queue(conn, admitted, now)
        await self._apply_endings(conn, endings, moved, now)

    async def _admit_carried(
        self, conn: asyncpg.Connection, delivery: Delivery, submitted: JobSubmitted, now: datetime
    ) -> repo.NewJob | None:
        """``_admit`` for a submission of a run: in the context it came with (see
        ``_apply_run``)."""
        # Kept with tracing off too: a no-op tracer still propagates it.
        carried = delivery.trace_headers()
        if not carried:  # its trace starts here, as one alone
            with delivery.span(self._consumer):
                return await self._admit(conn, submitted, now)
        if (refusal := await self._refusal(conn, submitted)) is None:
            return await self._new_job(conn, submitted, carried)
        with delivery.span(self._consumer):
            await self._refuse(conn, submitted.job_id, refusal, now)
        return None

    async def dispatch(
        self, envelope: Envelope[Payload], conn: asyncpg.Connection, now: datetime
    ) -> None:
        """Apply one event other than an end report."""
        match envelope.data:
            case RunnerHeartbeat() as heartbeat:
                await self.on_heartbeat(conn, heartbeat, now)
            case JobSubmitted() as submitted:
                await self.on_submitted(conn, submitted, now)
            case JobCancelRequested() as cancel:
                await self.on_cancel_requested(conn, cancel, now)
            case JobStarted() as started:
                await self.on_started(conn, started, now)
            case CheckpointSaved() as saved:
                await self.on_checkpoint(conn, saved)
            case BudgetUpdated() as state:
                await self.on_budget(conn, state)
            case _:
                pass

    async def on_budget(self, conn: asyncpg.Connection, state: BudgetUpdated) -> None:
        """Keep billing's state of a budget; when it changed, a pass looks again: a spent
        budget may now hold queued jobs of its team (or project), or a raised or deleted one
        release them (``budget_holds``)."""
        if await budget_holds.apply_state(conn, state):
            log.info(
                "budget of %s%s: %s of %s %s spent in %s%s (policy %s)",
                state.team,
                f"/{state.project}" if state.project else "",
                state.spent,
                state.amount,
                state.currency,
                state.month,
                ", exhausted" if state.exhausted and not state.deleted else "",
                state.policy,
            )
            self._poke()

    async def on_heartbeat(
        self, conn: asyncpg.Connection, heartbeat: RunnerHeartbeat, now: datetime
    ) -> None:
        """Record the node's heartbeat; a node whose claim, declaration or inventory mode
        changed gets its supply judged again (``inventory.cap``), and a changed supply is
        said (``node.supplied``: what billing counts of the node's GPUs, rather than its
        claim; ``node_supply``). A pass is asked for only when the judgement changes what a
        pass reads of the node (``repository.Judged.places_as``: a new node, one back, other
        GPUs, flavor or topology), not for a claim that differs and is capped the same; each
        field capped is logged as a warning naming the node when it starts being capped or
        the node's supply changes, not at every judgement. The runner is told to stop an
        ended allocation it still lists (``_fence_strays``), and the GPUs held for one it no
        longer lists are freed (``_free_unlisted``)."""
        if heartbeat.gpu_count < 0:
            raise Reject(f"gpu_count: must be >= 0, got {heartbeat.gpu_count}")
        report = (heartbeat.hostname, heartbeat.gpu_flavor, heartbeat.gpu_count)
        node_id, topology, address = heartbeat.node_id, heartbeat.topology, heartbeat.address
        mode = self._tuning.node_inventory
        if not await repo.touch_node(conn, node_id, *report, topology, now, address, mode):
            # Judged again (a new node, a lost one back, another claim, declaration or mode,
            # or a change of supply held back from being said).
            claim = Claim(heartbeat.gpu_flavor, heartbeat.gpu_count, topology)
            declared = await repo.declaration(conn, node_id)
            supply = cap(claim, declared, mode)
            revision = None if declared is None else declared.revision
            before = await repo.judged(conn, node_id)
            # Only a change of the node's own claim is said at most once a minute: anything
            # else (a new node, one back, another declaration or mode) is said at once.
            claim_only = before is not None and before.ready and before.by == (mode.value, revision)
            await repo.upsert_node(
                conn,
                node_id,
                *report,
                now,
                topology,
                address,
                supply=supply,
                mode=mode,
                revision=revision,
            )
            await node_supply.say_judged(conn, node_id, now, at_once=not claim_only)
            if before is not None and before.places_as(supply):
                warned, changed = before.capped, False  # a pass reads the node as before
            else:
                warned, changed = frozenset(), True
            for capped in supply.capped:
                if capped.field in warned:  # warned of when it started, or the supply changed
                    continue
                log.warning(
                    "node %s capped by the node inventory (%s): it %s",
                    node_id,
                    capped.field,
                    capped.message,
                )
            if changed:
                if self._facts:
                    self._facts.clear()  # the largest node of a flavor may have changed
                log.info(
                    "node %s ready: %d %s GPUs (topology %s)",
                    node_id,
                    supply.gpu_count,
                    supply.gpu_flavor,
                    supply.topology,
                )
                self._poke()
        await self._fence_strays(conn, heartbeat)
        await self._free_unlisted(conn, heartbeat, now)

    async def _free_unlisted(
        self, conn: asyncpg.Connection, heartbeat: RunnerHeartbeat, now: datetime
    ) -> None:
        """GPUs kept leased for an ended allocation while its runner stopped it are free
        once a heartbeat handled after they were held (``now``, the scheduler's clock; never
        the runner's ``sent_at``) does not list it (the runner finished stopping it without a
        report the scheduler heard, or restarted and killed what was left); a pass is asked
        for when any were."""
        freed = await allocation_repo.free_unlisted(
            conn, heartbeat.node_id, heartbeat.running_allocations, now
        )
        if freed:
            log.info(
                "node %s no longer runs an ended allocation: %d GPU(s) held for it are free",
                heartbeat.node_id,
                freed,
            )
            self._poke()

    async def _fence_strays(self, conn: asyncpg.Connection, heartbeat: RunnerHeartbeat) -> None:
        """A runner still running an allocation that ended here (e.g. its node was declared
        lost and the job moved on) is told to stop it, once."""
        ids: list[uuid.UUID] = []
        for raw in heartbeat.running_allocations:
            try:
                ids.append(uuid.UUID(raw))
            except ValueError:
                log.warning("node %s reports unknown allocation %r", heartbeat.node_id, raw)
        if not ids:
            return
        for allocation, live in await allocation_repo.allocations_by_id(conn, ids):
            if live and allocation.node_id == heartbeat.node_id:
                continue
            grace = self._tuning.cancel_grace_s
            revoke = fence_revocation(allocation, heartbeat.node_id, grace)
            await outbox.enqueue_traced(conn, [revoke])

    async def on_submitted(
        self, conn: asyncpg.Connection, submitted: JobSubmitted, now: datetime
    ) -> None:
        job = await self._admit(conn, submitted, now)
        if job is not None:
            await self._queue(conn, [job], now)

    async def _admit(
        self, conn: asyncpg.Connection, submitted: JobSubmitted, now: datetime
    ) -> repo.NewJob | None:
        """The job to queue for this submission (in the trace of its handling), or None when
        it is refused (its ``job.failed`` is said here)."""
        refusal = await self._refusal(conn, submitted)
        if refusal is not None:
            await self._refuse(conn, submitted.job_id, refusal, now)
            return None
        return await self._new_job(conn, submitted, inject() or None)

    async def _refusal(self, conn: asyncpg.Connection, submitted: JobSubmitted) -> str | None:
        """Why this submission is refused (its job can never run as configured), or None;
        ``Reject`` for one that can never be applied."""
        spec = submitted.spec
        if spec.gpus < 1:
            raise Reject(f"spec.gpus: a job needs at least 1 GPU, got {spec.gpus}")
        if spec.max_restarts < 0:
            raise Reject(f"spec.max_restarts: must be >= 0, got {spec.max_restarts}")
        refusal = admission.refusal(spec, await self._admission_facts(conn, spec))
        if refusal is None:
            refusal = await self._too_many_waiting(conn, spec.team)
        if refusal is not None and await repo.job_for_update(conn, submitted.job_id) is None:
            return refusal
        return None

    async def _too_many_waiting(self, conn: asyncpg.Connection, team: str) -> str | None:
        """Why a new job of ``team`` is refused when the team has ``max_waiting_jobs`` waiting
        already, or None, counting it as waiting. The count is read once per team in a batch
        (the batch holds the scheduling lock: no pass grants meanwhile) and grows with each
        job the batch admits."""
        most = self._tuning.max_waiting_jobs
        if most <= 0:
            return None
        if self._waiting is None:
            waiting = await repo.waiting_jobs(conn, team, most)
        elif team in self._waiting:
            waiting = self._waiting[team]
        else:
            waiting = self._waiting[team] = await repo.waiting_jobs(conn, team, most)
        if waiting >= most:
            return admission.too_many_waiting(team, most)
        if self._waiting is not None:
            self._waiting[team] = waiting + 1
        return None

    async def _refuse(
        self, conn: asyncpg.Connection, job_id: str, refusal: str, now: datetime
    ) -> None:
        """The job ends here, without entering the tables: its ``job.failed`` is said."""
        await emit(conn, admission.refused(job_id, refusal, now), job_id, f"refused:{job_id}")
        log.info("job %s refused: %s", job_id, refusal)

    async def _new_job(
        self, conn: asyncpg.Connection, submitted: JobSubmitted, context: dict[str, str] | None
    ) -> repo.NewJob:
        queue = await self._queue_for(conn, submitted.spec.team)
        return repo.NewJob(
            submitted.job_id,
            submitted.spec,
            submitted.submitted_at,
            queue,
            context,
            submitted.lowered_from,
        )

    async def _queue(
        self, conn: asyncpg.Connection, jobs: Sequence[repo.NewJob], now: datetime
    ) -> None:
        """Insert a run of admitted jobs (distinct ids) in one statement; each new one is
        reported (``arrived``) or asks for a pass."""
        if not jobs:
            return
        inserted = await repo.insert_jobs(conn, jobs, now)
        for job in jobs:
            if job.job_id not in inserted:
                log.info(
                    "job %s already known; duplicate submission ignored",
                    job.job_id,
                    extra={"job_id": job.job_id},
                )
            elif self._arrived is not None:
                self._arrived(job.job_id)
            else:
                self._poke()

    async def _admission_facts(self, conn: asyncpg.Connection, spec: JobSpec) -> admission.Facts:
        """``admission.load_facts``, read once per team and flavor in a batch: within its
        transaction only a node's heartbeat changes them (admin changes wait for the
        scheduling lock the batch holds), and a new or changed node clears them."""
        if self._facts is None:
            return await admission.load_facts(conn, spec)
        key = (spec.team, spec.gpu_flavor)
        if key not in self._facts:
            self._facts[key] = await admission.load_facts(conn, spec)
        return self._facts[key]

    async def _queue_for(self, conn: asyncpg.Connection, team: str) -> str:
        """``repo.queue_for_team``, read once per team in a batch: a team's queue changes only
        by an admin call, which waits for the scheduling lock the batch holds (one query, and
        one database span, less per submitted job)."""
        if self._queues is None:
            return await repo.queue_for_team(conn, team)
        if team not in self._queues:
            self._queues[team] = await repo.queue_for_team(conn, team)
        return self._queues[team]

    async def on_cancel_requested(
        self, conn: asyncpg.Connection, cancel: JobCancelRequested, now: datetime
    ) -> None:
        job = await repo.job_for_update(conn, cancel.job_id)
        if job is None:
            log.warning("cancel for unknown job %s ignored", cancel.job_id)
            return
        if job.status.is_terminal or job.status is JobStatus.CANCELLING:
            log.info("cancel for %s job %s ignored", job.status.value, job.job_id)
            return
        if job.status is JobStatus.QUEUED:
            await repo.set_job_status(
                conn, [job.job_id], job.status.check(JobStatus.CANCELLED), now, cancel.reason
            )
            await emit(conn, JobCancelled(job_id=job.job_id, reason=cancel.reason), job.job_id)
            self._poke()  # positions behind it moved up
            return
        allocations = await allocation_repo.live_allocations(conn, job.job_id)
        if not allocations:  # pragma: no cover - a job holding GPUs always has one
            raise RuntimeError(f"job {job.job_id} is {job.status.value} without an allocation")
        self._stale()  # a pass reads it as leaving: never a victim, its GPUs free soon
        await repo.set_job_status(
            conn, [job.job_id], job.status.check(JobStatus.CANCELLING), now, cancel.reason
        )
        for allocation in allocations:
            revoke = AllocationRevoked(
                allocation_id=allocation.allocation_id,
                job_id=job.job_id,
                node_id=allocation.node_id,
                epoch=allocation.epoch,
                reason=CANCEL_STOP_REASON,  # the runner reports it (leases)
                grace_seconds=self._tuning.cancel_grace_s,
            )
            await emit(conn, revoke, allocation.node_id)

    async def on_started(
        self, conn: asyncpg.Connection, started: JobStarted, now: datetime
    ) -> None:
        job = await repo.job_for_update(conn, started.job_id)
        allocations = await allocation_repo.live_allocations(conn, started.job_id)
        stale = fence(
            [a.live for a in allocations], started.allocation_id, started.epoch, started.node_id
        )
        if job is None or stale:
            log.info("JobStarted for %s ignored: %s", started.job_id, stale or "unknown job")
            return
        (allocation,) = [a for a in allocations if a.allocation_id == started.allocation_id]
        if allocation.status is not AllocationStatus.GRANTED:
            log.info("JobStarted for %s ignored: already %s", job.job_id, allocation.status.value)
            return
        allocation.status.check(AllocationStatus.RUNNING)
        await allocation_repo.mark_allocation_started(
            conn, allocation.allocation_id, started.started_at
        )
        if job.status is JobStatus.ALLOCATED:
            await repo.set_job_status(conn, [job.job_id], job.status.check(JobStatus.RUNNING), now)

    async def on_checkpoint(self, conn: asyncpg.Connection, saved: CheckpointSaved) -> None:
        """Remember when the job last saved a complete checkpoint (victims are chosen to lose
        the least work), and which one its next attempt resumes from (the newest by step:
        ``allocation.granted``'s ``resume``). Only a report from the node of the job's live
        allocation at its epoch counts (``fence``): no other node names a job's checkpoint."""
        allocations = await allocation_repo.live_allocations(conn, saved.job_id)
        stale = fence(
            [a.live for a in allocations], saved.allocation_id, saved.epoch, saved.node_id
        )
        if stale:
            log.info("checkpoint of %s ignored: %s", saved.job_id, stale)
            return
        self._stale()  # victims are chosen by their last checkpoint
        await allocation_repo.record_checkpoint(conn, saved.allocation_id, saved.saved_at)
        await allocation_repo.record_resume_point(
            conn, saved.job_id, saved.checkpoint, saved.saved_at
        )

    async def on_ended(
        self, conn: asyncpg.Connection, delivery: Delivery, report: EndReport, now: datetime
    ) -> None:
        """End the allocations a runner reports ended, the report handled in its own span."""
        endings: list[Ending] = []
        known = await self._known(conn, [(delivery, report)])
        moved = await self._end(conn, delivery, report, known, now, endings, False)
        await self._apply_endings(conn, endings, moved, now)

    async def _known(
        self, conn: asyncpg.Connection, reports: Sequence[tuple[Delivery, EndReport]]
    ) -> _Known:
        """What ending the jobs of ``reports`` reads, in two statements."""
        if not reports:
            return _Known({}, {})
        job_ids = [report.job_id for _, report in reports]
        jobs = await repo.jobs_by_id(conn, job_ids)
        return _Known(jobs, await allocation_repo.live_allocations_of(conn, job_ids))

    async def _end(
        self,
        conn: asyncpg.Connection,
        delivery: Delivery,
        report: EndReport,
        known: _Known,
        now: datetime,
        endings: list[Ending],
        in_run: bool,
    ) -> bool:
        """Plan the end ``report`` says into ``endings``, unless it is stale or about an
        unknown job (logged, ignored); True when it was a lost node's late success, kept
        (the job moved on by itself), or the end of an allocation that ended here already
        whose GPUs were held while it stopped (``_free_stopped``: they are free now). In a run (``in_run``) a report that carries a context
        is handled in it (``Delivery.continued``); a late success, rare and worth seeing, is
        handled in a span of its own, as is every report outside a run."""
        job = known.jobs.get(report.job_id)
        allocations = known.live.get(report.job_id, [])
        stale = fence(
            [a.live for a in allocations], report.allocation_id, report.epoch, report.node_id
        )
        kind = _END_KINDS[type(report)]
        late = job is not None and stale is not None and isinstance(report, JobSucceeded)
        own_span = not in_run or late or delivery.carried is None
        with delivery.span(self._consumer) if own_span else delivery.continued():
            freed = False
            if stale:
                # The end of an allocation that ended here already: its processes are gone,
                # so the GPUs kept leased while it stopped are free (leases).
                freed = await self._free_stopped(conn, report, now)
            if job is not None and stale:
                # Its runner's first word after the release: a platform failure, which
                # billing reverses the bill of, takes the release's charge off the usage.
                await self._refund(conn, job, report, now)
            if job is not None and stale and isinstance(report, JobSucceeded):
                # Perhaps a lost node's real result: kept, not fenced (late_success).
                tuning = self._tuning
                kept = await accept_late_success(conn, job, allocations, report, now, tuning)
                return kept or freed
            if job is None or stale:
                log.info("job %s %s ignored: %s", report.job_id, kind, stale or "unknown job")
                return freed
            failed = report if isinstance(report, JobFailed) else None
            preempted = report if isinstance(report, JobPreempted) else None
            endings.append(
                plan_end(
                    job,
                    allocations,
                    kind,
                    report.finished_at,
                    now,
                    self._tuning,
                    reporter=report.allocation_id,
                    failed=failed,
                    preempted=preempted,
                )
            )
            return False

    async def _refund(
        self, conn: asyncpg.Connection, job: Job, report: EndReport, now: datetime
    ) -> None:
        """Settle the charge of the released allocation ``report`` names
        (``leases.refund_late_platform_failure``), logging what it took back."""
        team = job.spec.team
        half_life_s = self._tuning.half_life_s
        refund = await refund_late_platform_failure(conn, team, report, now, half_life_s)
        if refund > 0:
            log.info(
                "allocation %s of job %s failed through the platform after its release: "
                "%.0f GPU-second(s) taken off team %s's fair-share usage",
                report.allocation_id,
                report.job_id,
                refund,
                team,
            )

    async def _free_stopped(
        self, conn: asyncpg.Connection, report: EndReport, now: datetime
    ) -> bool:
        """Free the GPUs held for the ended allocation ``report`` names while it stopped
        (``allocation_repository.free_stopped``); True when any were."""
        freed = await allocation_repo.free_stopped(
            conn, report.allocation_id, report.node_id, report.epoch, now
        )
        if freed:
            log.info(
                "allocation %s of job %s stopped on node %s: its %d GPU(s) are free",
                report.allocation_id,
                report.job_id,
                report.node_id,
                freed,
            )
        return freed > 0

    async def _apply_endings(
        self, conn: asyncpg.Connection, endings: Sequence[Ending], moved: bool, now: datetime
    ) -> None:
        """Write the ``endings`` planned, in a few statements; a pass is asked for when any
        job moved on."""
        if endings:
            await apply_endings(conn, endings, now, self._tuning)
        if endings or moved:
            self._poke()
