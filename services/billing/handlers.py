"""Event handlers of billing: one ``dispatch`` for every event it consumes.

Runs inside the transaction of ``shared.inbox.idempotent``. An ``AllocationGranted`` is
remembered as announced, with the attribution its release does not repeat (project, queue,
attempt, epoch). An ``AllocationReleased`` becomes the allocation's bill (one
``usage_ledger`` row), a ``charge`` in the append-only ``ledger_entries`` (with its rollups)
and one ``CostRecorded`` (through the outbox), all in the same transaction; the bill's key
on allocation id makes a repeated release a logged no-op, except the one release that amends
a bill: a lost node's allocation whose runner reported success later is billed for the time
it really ran (``Usage.amended_by``: the bill amended once, a ``reversal`` of the previous
charge and a new ``charge`` in the ledger, and a ``CostRecorded`` with the amended total,
event id ``cost:<allocation>:amended``). A release that cannot be priced (unknown flavor, end
before start), or that billing cannot believe, is rejected to the dead-letter stream with the
reason: billing meters only allocations the scheduler announced, and only as announced (the
release's job, node, team, user, flavor, GPUs and start must be its grant's). The grant comes
first on the stream, but billing's replicas apply batches concurrently, so a release may be
handled while its grant commits in another replica: a release of an allocation not
announced (yet) is retried (``NotAnnounced``, a ``bus.NotYet``: a grant held by a replica
that died comes back after ``ack_wait``, and the release is retried past that), and
dead-lettered with the reason only after the bus's last delivery. The CPUs and memory the grant
said the allocation holds are billed over the same interval as its GPUs, in the same
entries (``services.billing.prices``), at 0 where the flavor has no price for them.

An attempt that failed through the platform (the runner's ``JobFailed`` with
``failure_kind`` ``platform_error``) is charged to the platform, whichever of the report and
the release comes first: a release after the report makes a bill with no charge
(``charged_to`` ``platform``); a report after the release reverses the team's charges
(``on_platform_failure``). Both lock the announced allocation's row first, so concurrent
replicas see each other's. A release that says so itself (``platform_failure``: the
scheduler released the attempt for a member's platform failure) makes a bill with no charge
whatever its runner reports: so every member of a gang is the platform's, not only the one
whose runner reported the failure (the others' runners were only fenced).

A runner's end report and checkpoint count only as their allocation's own (its job, node
and epoch: ``not_its_own``, ``waste_rollups.OWN_REPORT``), as the scheduler fences them:
another changes no waste figure, no job's end and no bill.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import asyncpg

from trainyard_platform.services.billing import budget_watch, waste_rollups
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing import ledger_repository as ledger
from trainyard_platform.services.billing import repository as repo
from trainyard_platform.services.billing import waste_repository as waste
from trainyard_platform.services.billing.domain import UnknownFlavor, Usage
from trainyard_platform.services.billing.ledger import Attribution, LedgerEntry
from trainyard_platform.shared import outbox
from trainyard_platform.shared.bus import NotYet, Reject
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    CheckpointSaved,
    FlavorDeclared,
    FlavorRetired,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSubmitted,
    JobSucceeded,
    NodeSupplied,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import RUNNER, SCHEDULER

log = logging.getLogger(__name__)

SOURCE = "trainyard/billing"
SUBJECTS = [
    nats_subject(AllocationGranted),
    nats_subject(AllocationReleased),
    nats_subject(FlavorDeclared),
    nats_subject(FlavorRetired),
    nats_subject(JobSubmitted),
    nats_subject(CheckpointSaved),
    nats_subject(JobSucceeded),
    nats_subject(JobFailed),
    nats_subject(JobCancelled),
    nats_subject(JobPreempted),
    nats_subject(RunnerHeartbeat),
    nats_subject(NodeSupplied),
]
"""What billing's consumer reads: grants (what was announced), releases (what to meter),
the scheduler's flavor catalogue (which flavors a price may be set for), and the facts of
waste and success (``services.billing.waste``): submissions, checkpoints, jobs' ends and
node heartbeats, with what the scheduler places on each node (``node.supplied``: the GPUs
counted of a node are those, not its heartbeat's claim)."""

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class BillingHandlers:
    def __init__(self, clock: Clock = utc_now) -> None:
        self._clock = clock

    async def dispatch(self, envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        match envelope.data:
            case AllocationGranted() as grant:
                if await repo.insert_announced(conn, grant, envelope.id, self._clock()):
                    # Heartbeats of its node handled before it counted its GPUs free. First:
                    # the node's lock before its flavor's, as a heartbeat takes them.
                    gpus = len(grant.gpu_indices)
                    await waste.hold(
                        conn, grant.allocation_id, grant.node_id, gpus, grant.granted_at, None
                    )
                    await self._success_before_grant(conn, grant)
                    # ... and may have found its job waiting.
                    await waste.recheck_waiting(conn, grant.spec.gpu_flavor, grant.granted_at)
                await waste.record_grant(conn, grant, self._clock())
            case AllocationReleased() as released:
                await self.on_released(conn, released, envelope.id)
            case FlavorDeclared() as declared:
                await catalogue.apply_flavor(
                    conn,
                    declared.name,
                    declared.description,
                    declared.revision,
                    False,
                    declared.declared_at,
                )
            case FlavorRetired() as retired:
                await catalogue.apply_flavor(
                    conn, retired.name, "", retired.revision, True, retired.retired_at
                )
            case JobSubmitted() as submitted:
                await waste.record_job(conn, submitted, self._clock())
            case CheckpointSaved() as saved:
                await waste.record_checkpoint(conn, saved)
            case JobSucceeded() as succeeded:
                await waste.record_run_report(conn, succeeded, self._clock())
                announced = await repo.announced(conn, succeeded.allocation_id)
                # One of an allocation not announced yet (its grant may be committing in
                # another replica) is judged when the grant comes (_success_before_grant).
                if announced is not None and await self._ends_job(
                    conn, succeeded, announced, envelope.source
                ):
                    await waste.record_end(
                        conn, succeeded.job_id, "succeeded", succeeded.finished_at, self._clock()
                    )
            case JobFailed() | JobPreempted() as report if envelope.source == RUNNER:
                # One attempt's end: what the runner measured of it (a failure's or a
                # preemption's said by the scheduler carries no measurement), and whether
                # it failed through the platform (then the platform pays for it).
                await waste.record_run_report(conn, report, self._clock())
                if isinstance(report, JobFailed) and report.through_platform:
                    await self.on_platform_failure(conn, report.allocation_id, envelope.id)
            case JobFailed() as failed if envelope.source == SCHEDULER:
                # The scheduler's word on a job that failed for good; a runner's report is
                # only about one attempt. A job refused on arrival never queued: forgotten
                # (no wait, no end in the success rate), whether its submission came first.
                if failed.failure_kind == "rejected":
                    await waste.forget_job(conn, failed.job_id, self._clock())
                else:
                    await waste.record_end(
                        conn, failed.job_id, "failed", failed.finished_at, self._clock()
                    )
            case JobCancelled() as cancelled:
                await waste.record_end(
                    conn, cancelled.job_id, "cancelled", envelope.time, self._clock()
                )
            case RunnerHeartbeat() as beat:
                await waste.record_heartbeat(conn, beat)
            case NodeSupplied() as supplied:
                await waste.record_supply(conn, supplied)
            case _:
                pass

    async def _ends_job(
        self, conn: asyncpg.Connection, succeeded: JobSucceeded, grant: repo.Row, source: str
    ) -> bool:
        """Whether ``succeeded`` says its job succeeded: only as its allocation's own report
        (``not_its_own``), and a runner's only while the scheduler has not released that
        allocation otherwise (it fenced that report; a lost node's success it keeps, it says
        again itself)."""
        problem = not_its_own(succeeded, grant)
        if problem is not None:
            log.warning("job %s: %s; not its end", succeeded.job_id, problem)
            return False
        return source != RUNNER or await self._not_released_otherwise(conn, succeeded)

    async def _not_released_otherwise(
        self, conn: asyncpg.Connection, succeeded: JobSucceeded | AllocationGranted
    ) -> bool:
        outcome = await conn.fetchval(
            "SELECT outcome FROM usage_ledger WHERE allocation_id = $1", succeeded.allocation_id
        )
        if outcome in (None, "succeeded"):
            return True
        log.info(
            "job %s: the runner's success of allocation %s came after the scheduler released "
            "it %s; not the job's end",
            succeeded.job_id,
            succeeded.allocation_id,
            outcome,
        )
        return False

    async def _success_before_grant(
        self, conn: asyncpg.Connection, grant: AllocationGranted
    ) -> None:
        """A success of the allocation's own runner that was recorded before its grant ends
        its job now (as ``_ends_job`` would have judged it)."""
        finished = await waste.own_success(conn, grant)
        if finished is not None and await self._not_released_otherwise(conn, grant):
            await waste.record_end(conn, grant.job_id, "succeeded", finished, self._clock())

    async def on_released(
        self, conn: asyncpg.Connection, released: AllocationReleased, event_id: str
    ) -> None:
        grant = await repo.announced(conn, released.allocation_id)
        problem = unannounced(released, grant)
        if grant is None:
            # Retried, not rejected at once: billing's replicas apply batches concurrently,
            # so the grant before it on the stream may be committing in another one. Still
            # unannounced after the bus's deliveries, it is dead-lettered with the reason.
            raise NotAnnounced(problem or "unannounced")
        if problem is not None:
            raise Reject(problem)
        await catalogue.hold_prices(conn, released.gpu_flavor)  # unchanged until committed
        book = await catalogue.schedule(conn)
        try:
            segments = book.segments(
                released.gpu_flavor,
                released.gpus,
                released.granted_at,
                released.released_at,
                cpus=grant["cpus"],
                memory_gib=grant["memory_gib"],
            )
        except (UnknownFlavor, ValueError) as exc:
            raise Reject(str(exc)) from exc
        usage = Usage.from_segments(released, segments, grant["cpus"], grant["memory_gib"])
        # The scheduler's word that the attempt failed through the platform covers every
        # member of a gang; the allocation's own runner's report covers it alone.
        if released.platform_failure or await repo.platform_failed(conn, usage.allocation_id):
            usage = replace(usage, charged_to="platform")
        now = self._clock()
        if not await repo.insert_usage(conn, usage, event_id, now):
            await self._amend(conn, released, event_id)
            return
        if usage.charged_to == "platform":  # the team pays nothing: no charge
            await waste_rollups.refresh(conn, [usage.allocation_id])
            await _recorded(conn, usage, f"cost:{usage.allocation_id}")
            # It accrued to the team's budgets while it ran: one said spent by that is
            # said not spent now that it is the platform's.
            scopes = [(usage.team, None), (usage.team, grant["project"])]
            await budget_watch.recheck(conn, scopes, now)
            log.info(
                "job %s allocation %s failed through the platform: %s GPU-s of %s charged "
                "to the platform",
                usage.job_id,
                usage.allocation_id,
                usage.gpu_seconds,
                usage.gpu_flavor,
            )
            return
        charges = LedgerEntry.charges(usage, Attribution.from_announced(grant), revision=0)
        await ledger.append(conn, charges, event_id, now)
        await waste_rollups.refresh(conn, [usage.allocation_id])
        await _recorded(conn, usage, f"cost:{usage.allocation_id}")
        await budget_watch.after_charges(conn, charges, now)
        log.info(
            "job %s allocation %s: %s GPU-s of %s = %s %s",
            usage.job_id,
            usage.allocation_id,
            usage.gpu_seconds,
            usage.gpu_flavor,
            usage.cost,
            usage.currency,
        )

    async def _amend(
        self, conn: asyncpg.Connection, released: AllocationReleased, event_id: str
    ) -> None:
        """A release of an allocation billed already: amend its bill if it says the
        allocation ran longer (``Usage.amended_by``), else nothing."""
        row = await conn.fetchrow(
            "SELECT * FROM usage_ledger WHERE allocation_id = $1 FOR UPDATE",
            released.allocation_id,
        )
        billed = Usage.from_row(row) if row is not None else None
        amended = billed.amended_by(released) if billed is not None else None
        if billed is None or amended is None or billed.charged_to == "platform":
            log.info("allocation %s already billed; ignored", released.allocation_id)
            return
        now = self._clock()
        previous = await ledger.latest_charges(conn, amended.allocation_id)
        if not previous:  # a bill always has its charge (the migration made the old ones')
            raise RuntimeError(f"allocation {amended.allocation_id}: a bill without a charge")
        # The longer interval is priced by the book, like a first bill: time after a price
        # change is billed at the new price.
        await catalogue.hold_prices(conn, amended.gpu_flavor)  # unchanged until committed
        book = await catalogue.schedule(conn)
        try:
            segments = book.segments(
                amended.gpu_flavor,
                amended.gpus,
                amended.started_at,
                amended.ended_at,
                cpus=amended.cpus,
                memory_gib=amended.memory_gib,
            )
        except (UnknownFlavor, ValueError) as exc:
            raise Reject(str(exc)) from exc
        amended = amended.repriced(segments)
        last = previous[-1]
        attribution = Attribution(last.project, last.queue, last.attempt, last.epoch)
        corrected = LedgerEntry.charges(amended, attribution, revision=last.revision + 1)
        reversals = [p.reversal() for p in previous]
        await ledger.append(conn, [*reversals, *corrected], event_id, now)
        await conn.execute(
            "UPDATE usage_ledger SET ended_at = $2, outcome = $3, gpu_seconds = $4, cost = $5, "
            "event_id = $6, recorded_at = $7 WHERE allocation_id = $1",
            amended.allocation_id,
            amended.ended_at,
            amended.outcome,
            amended.gpu_seconds,
            amended.cost,
            event_id,
            now,
        )
        await waste_rollups.refresh(conn, [amended.allocation_id])
        # Billed longer: heartbeats of its node after its first end counted its GPUs free.
        await waste.hold(
            conn,
            amended.allocation_id,
            amended.node_id,
            amended.gpus,
            billed.ended_at,
            amended.ended_at,
        )
        log.info(
            "allocation %s of job %s ran until %s after all (%s, not lost): bill amended "
            "from %s to %s %s",
            amended.allocation_id,
            amended.job_id,
            amended.ended_at.isoformat(),
            amended.outcome,
            billed.cost,
            amended.cost,
            amended.currency,
        )
        await _recorded(conn, amended, f"cost:{amended.allocation_id}:amended", last.revision + 1)
        await budget_watch.after_charges(conn, [*reversals, *corrected], now)

    async def on_platform_failure(
        self, conn: asyncpg.Connection, allocation_id: str, event_id: str
    ) -> None:
        """The runner said the allocation's attempt failed through the platform: a bill its
        team was charged already (its release came first) is charged to the platform
        instead, once: a ``reversal`` of each charge of its current revision, and a
        ``CostRecorded`` of 0 (event id ``cost:<allocation>:platform``). Before its
        release, nothing: the release reads the report (``on_released``)."""
        if await repo.announced(conn, allocation_id) is None:  # locked: see its release
            return
        row = await conn.fetchrow(
            "SELECT * FROM usage_ledger WHERE allocation_id = $1 FOR UPDATE", allocation_id
        )
        if row is None or row["charged_to"] == "platform":
            return
        if not await repo.platform_failed(conn, allocation_id):
            return  # the allocation's first report said otherwise, or was another job's
        now = self._clock()
        charges = await ledger.latest_charges(conn, allocation_id)
        reversals = [c.reversal() for c in charges]
        await ledger.append(conn, reversals, event_id, now)
        await conn.execute(
            "UPDATE usage_ledger SET charged_to = 'platform' WHERE allocation_id = $1",
            allocation_id,
        )
        usage = replace(Usage.from_row(row), charged_to="platform")
        # Said after the bill it corrects (revision 0, or the amendment's), so consumers
        # keep this one whichever arrives last.
        revision = max((c.revision for c in charges), default=0) + 1
        await _recorded(conn, usage, f"cost:{allocation_id}:platform", revision)
        await budget_watch.after_charges(conn, reversals, now)
        log.info(
            "allocation %s of job %s failed through the platform: its %s %s charged to the "
            "platform, not team %s",
            allocation_id,
            usage.job_id,
            usage.cost,
            usage.currency,
            usage.team,
        )


class NotAnnounced(NotYet):
    """A release of an allocation billing has not seen granted (yet): the bus delivers it
    again (``TRAINYARD_NATS_MAX_DELIVER`` times, then twice more ``ack_wait`` apart: the grant
    may be in the hands of a replica that died, ``bus.NotYet``) before it dead-letters it
    with this reason."""


async def _recorded(
    conn: asyncpg.Connection, usage: Usage, event_id: str, revision: int = 0
) -> None:
    """Say ``usage`` (a new or corrected bill) with a fixed id: whatever happens upstream,
    one allocation gives one ``CostRecorded``, and one more for each correction of its bill
    (amended, made the platform's), each of a higher ``revision`` than the one before, so
    its consumers keep the latest whatever order they receive them in."""
    recorded: Payload = usage.to_event(revision)
    envelope = Envelope.wrap(recorded, source=SOURCE, subject=usage.job_id, event_id=event_id)
    await outbox.enqueue(conn, envelope)


def not_its_own(report: JobSucceeded | JobFailed | JobPreempted, grant: repo.Row) -> str | None:
    """Why ``report`` is not its allocation's own (``grant``: the allocation as announced):
    about another job, from another node, or at another epoch; or None."""
    differs = [
        f"{field} {said!r} (granted: {announced!r})"
        for field, announced, said in (
            ("job_id", grant["job_id"], report.job_id),
            ("node_id", grant["node_id"], report.node_id),
            ("epoch", grant["epoch"], report.epoch),
        )
        if announced != said
    ]
    if differs:
        return f"{report.TYPE} of allocation {report.allocation_id} says {', '.join(differs)}"
    return None


def unannounced(released: AllocationReleased, grant: repo.Row | None) -> str | None:
    """Why ``released`` does not release the allocation the scheduler announced, or None."""
    if grant is None:
        return (
            f"allocation {released.allocation_id} was never announced "
            "(billing saw no allocation.granted for it)"
        )
    differs = [
        field
        for field, announced, said in (
            ("job_id", grant["job_id"], released.job_id),
            ("node_id", grant["node_id"], released.node_id),
            ("team", grant["team"], released.team),
            ("user", grant["user_name"], released.user),
            ("gpu_flavor", grant["gpu_flavor"], released.gpu_flavor),
            ("gpus", grant["gpus"], released.gpus),
            ("granted_at", grant["granted_at"], released.granted_at),
        )
        if announced != said
    ]
    if differs:
        return (
            f"allocation {released.allocation_id}: the release's {', '.join(differs)} "
            "differ from its grant"
        )
    return None
