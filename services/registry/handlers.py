"""Event handlers of the registry: one ``dispatch`` for every event it consumes.

Wired through ``RegistryHandlers.consumer`` (``shared.inbox.prepared_batches``): for
each fetched batch, ``prepare`` makes the copies its successes register, holding no
connection of the pool and no transaction, and then ``dispatch_batch`` applies the batch
inside the transaction of the inbox. A copy of a large model takes minutes: made in the
transaction, a few registering at once held every connection of the pool, so every HTTP
request and every other event of the registry waited for one and failed (503), and the
open transactions held back PostgreSQL's vacuum.
- ``allocation.granted``: the scheduler's grant is remembered (its job, node, attempt, epoch
  and spec digest). A runner may publish ``job.*`` events for any job id, so what a runner
  says is believed only of what the scheduler granted: a ``job.started`` only as its grant
  says (``domain.unlike_its_grant``; one whose grant is not recorded yet is retried,
  ``NotGranted``, and dead-lettered after the bus's last delivery, one that says otherwise
  is rejected), a ``checkpoint.saved`` or ``job.succeeded`` only of a run so started of that
  job at that epoch, from the node it started on (``believe_report``; retried while the run
  is not recorded), and a
  version is registered only from a checkpoint under the job's own prefix
  (``artifacts.source_key``).
- ``job.started``: the run is recorded (once per allocation).
- ``job.started`` also records what the job was given: its dataset versions (the access
  audit) and its parent model version (``job_inputs``). The parent is recorded already
  from the job's ``job.submitted`` or grant when one of those comes first, and marked ended
  by its ``job.succeeded``, the scheduler's ``job.failed`` or ``job.cancelled``: until then
  the version cannot be deleted, from the job's admission on (``models.delete_version``).
- ``checkpoint.saved``: the checkpoint is recorded (once per job and object).
- ``job.succeeded``: when the job's spec asks for it (``register_model: true``), a model
  version is registered: ``prepare`` reads what the success registers (``plan``) on a
  connection it gives back at once, and copies the checkpoint to a new key of the registry's
  own and verifies it (``models.copy_in``) holding none; the transaction reads ``plan``
  again and, with the copy made for that very team, model, job and checkpoint, numbers and
  stores the version and puts ``model.registered`` in the outbox (``models.record``), once
  per event. Where no such copy was made (the run's start came in the same batch, what is
  registered changed since), it raises ``CopyNotMade`` (a ``bus.NotYet``) rather than copy
  in the transaction: the event is handled again and copied first. A copy that goes unused
  (the batch failed, another delivery registered the job first) is freed by the storage
  collector. A job whose spec does not ask registers nothing (its checkpoints can still be
  registered by ``POST /v1/models/{team}/{name}/versions``). A checkpoint that is missing,
  outside the store, or changed since it was committed registers nothing (logged at ERROR,
  not retried), and so does a job whose team or model name is not a valid model name
  (``names``). A job registers at most one version on success: a second success (a
  redelivery under another event id, a fenced runner that finished too) is a logged no-op,
  and the unique job id makes a concurrent one fail and retry into that no-op. If the
  run's ``job.started`` is not recorded yet, the handler raises ``RunNotRecorded`` (a
  ``bus.NotYet``) so the event is redelivered after it, past ``ack_wait`` if need be (another
  replica that died may hold the start). A success without any checkpoint (reported or recorded)
  registers nothing: the job made no model, which is a normal outcome, not an error (logged,
  never dead-lettered). A job whose name differs only by case from a model of its team
  (``ResNet``, model ``resnet``) adds its version to that model: model names are unique in a
  team regardless of case, and the version is kept rather than refused.
- ``cost.recorded`` (billing's): the allocation's bill is kept for cost per model
  (``model_cost.record``: one row per allocation; billing's correction of it, an amended
  bill or one made the platform's, of a higher ``revision``, replaces it in any order).
- Reproducibility (``reproduction_repository``): every job's end (``job.succeeded``, the
  scheduler's ``job.failed``, ``job.cancelled``) records its outcome, and a reproduction's
  end decides its verdict against the original.
- Tracking (``tracking_repository``, ``metric_ingest``): ``job.started`` also puts the job in its experiment;
  ``job.succeeded``, the scheduler's ``job.failed`` (the job's end; a runner's is one
  attempt's) and ``job.cancelled`` end it; ``job.metrics`` points are stored in bulk, all of
  a fetched batch's at once, after its other events (``dispatch_batch``). A batch is
  believed only from the node its allocation started on (the bus vouches for the node it
  came from, ``shared.events.trust``): a batch of a run that started elsewhere, or of an
  allocation of another job, is rejected (dead-lettered); one whose ``job.started`` is not
  recorded yet is retried, like a success.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType

import asyncpg

from trainyard_platform.services.registry import (
    domain,
    job_inputs,
    metric_ingest,
    model_cost,
    models,
    names,
)
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry import reproduction_repository as reproductions
from trainyard_platform.services.registry import tracking_repository as tracking
from trainyard_platform.services.registry.artifacts import (
    ArtifactMismatch,
    CheckpointGone,
    SourceOutsideStore,
)
from trainyard_platform.services.registry.domain import (
    NoArtifact,
    Run,
    RunNotRecorded,
    spec_digest,
    unlike_its_grant,
)
from trainyard_platform.shared.bus import BatchHandler, Delivery, NotYet, Reject
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    CheckpointSaved,
    CostRecorded,
    JobCancelled,
    JobFailed,
    JobMetrics,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import SCHEDULER
from trainyard_platform.shared.inbox import TransactionalBatchHandler, prepared_batches
from trainyard_platform.shared.storage import ObjectStore

log = logging.getLogger(__name__)

SOURCE = "trainyard/registry"
CONSUMER = "registry"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class NotGranted(NotYet, LookupError):
    """A ``job.started`` of an allocation whose grant the registry has not recorded (yet):
    the grant may be committing in another replica, or held by one that died until its
    ``ack_wait`` runs out (``bus.NotYet``: delivered again past it), before the bus
    dead-letters it with this reason (a start never granted: forged)."""


class CopyNotMade(NotYet):
    """A success that registers a version, but no copy of its checkpoint was made for it
    before the transaction (``RegistryHandlers.prepare``): its start came in the same batch,
    or what it registers changed since the copy (another spelling of its model, another
    checkpoint). Never copied in the transaction: the event is handled again, and copied
    first (``bus.NotYet``)."""


@dataclass(frozen=True)
class Skip:
    """Why a success registers nothing (logged at ``level``)."""

    level: int
    reason: str


CopyKey = tuple[str, str, str, CheckpointRef]
"""What a registration's copy depends on: team, model, job and checkpoint."""


def copy_key(what: models.Registration) -> CopyKey:
    return (what.team, what.model, what.job_id, what.checkpoint)


@dataclass(frozen=True)
class Made:
    """A copy ``prepare`` made for a registration (``key``), or the error that refused it."""

    key: CopyKey
    copy: models.Copy | Exception


Copies = Mapping[str, Made]
"""By event id."""
NO_COPIES: Copies = MappingProxyType({})


def _made(copies: Copies) -> list[models.Copy]:
    return [m.copy for m in copies.values() if isinstance(m.copy, models.Copy)]


def _is_success(delivery: Delivery) -> bool:
    """What ``prepare`` works on: the rest of a batch (metric batches above all) costs no
    read before its transaction."""
    return isinstance(delivery.envelope.data, JobSucceeded)


class RegistryHandlers:
    def __init__(self, store: ObjectStore | None = None, clock: Clock = utc_now) -> None:
        """``store``: where checkpoints are and registered copies go; without one (tests of
        other consumers) a success registers nothing."""
        self._store = store
        self._clock = clock

    def consumer(self, pool: asyncpg.Pool) -> BatchHandler:
        """The registry's handler of fetched batches for ``Bus.consume_batches``: ``prepare``
        without a transaction, then ``dispatch_batch`` in the inbox's
        (``shared.inbox.prepared_batches``). With a store, ``dispatch_batch`` wired any other
        way has no copies and registers no version (``CopyNotMade``). When the transaction
        raised (rolled back), the batch's copies are deleted after it, holding no connection
        (``models.Unrecorded``); the batch's error is then raised."""

        async def handle(deliveries: Sequence[Delivery]) -> None:
            made: list[models.Unrecorded] = []

            async def prepare(wanted: Sequence[Delivery]) -> TransactionalBatchHandler:
                copies = await self.prepare(pool, wanted)
                unrecorded = models.Unrecorded(self._store, _made(copies))
                made.append(unrecorded)

                async def finish(fresh: Sequence[Delivery], conn: asyncpg.Connection) -> None:
                    with unrecorded.inside():
                        await self.dispatch_batch(fresh, conn, copies)

                return finish

            try:
                await prepared_batches(pool, CONSUMER, prepare, wants=_is_success)(deliveries)
            except Exception:
                for unrecorded in made:
                    await unrecorded.free()
                raise

        return handle

    async def prepare(self, pool: asyncpg.Pool, deliveries: Sequence[Delivery]) -> Copies:
        """The copies the successes among ``deliveries`` register, made holding no
        connection (module docstring), by event id. A success that registers nothing as
        committed now (or cannot be judged yet) gets none; a copy that failed for good
        (``SourceOutsideStore``, ``ArtifactMismatch``, ``CheckpointGone``) is kept as that
        error. Any other error (the store unreachable) is raised."""
        successes = [
            (d.envelope.id, d.envelope.data)
            for d in deliveries
            if isinstance(d.envelope.data, JobSucceeded)
        ]
        if self._store is None or not successes:
            return {}
        plans: dict[str, models.Registration] = {}
        async with pool.acquire() as conn:
            for event_id, succeeded in successes:
                try:
                    await self.believe_report(conn, "job.succeeded", succeeded)
                    plan = await self.plan(conn, succeeded)
                except (NotYet, Reject):
                    continue  # the transaction decides, and says why
                if not isinstance(plan, Skip):
                    plans[event_id] = plan
        copies: dict[str, Made] = {}
        for event_id, plan in plans.items():
            try:
                made: models.Copy | Exception = await models.copy_in(self._store, plan)
            except (SourceOutsideStore, ArtifactMismatch, CheckpointGone) as exc:
                made = exc
            copies[event_id] = Made(copy_key(plan), made)
        return copies

    async def dispatch_batch(
        self, deliveries: Sequence[Delivery], conn: asyncpg.Connection, copies: Copies = NO_COPIES
    ) -> None:
        """Every first-time event of a fetched batch, in one transaction (``shared.inbox``);
        ``copies``: what ``prepare`` made for them."""
        points: list[JobMetrics] = []
        for delivery in deliveries:
            with delivery.span(CONSUMER):
                if isinstance(delivery.envelope.data, JobMetrics):
                    await self.check_metrics(conn, delivery.envelope.data)
                    points.append(delivery.envelope.data)
                else:
                    await self.dispatch(delivery.envelope, conn, copies)
        if points:
            await metric_ingest.ingest(conn, points)

    async def dispatch(
        self, envelope: Envelope[Payload], conn: asyncpg.Connection, copies: Copies = NO_COPIES
    ) -> None:
        match envelope.data:
            case JobSubmitted() as submitted:
                # From admission on, the version it fine-tunes from is kept for it.
                await job_inputs.record_parent(
                    conn, submitted.job_id, submitted.spec, self._clock()
                )
            case AllocationGranted() as grant:
                await repo.insert_grant(conn, grant, spec_digest(grant.spec), self._clock())
                await job_inputs.record_parent(conn, grant.job_id, grant.spec, self._clock())
            case JobStarted() as started:
                await self.on_started(conn, started)
            case CheckpointSaved() as saved:
                await self.believe_report(conn, "checkpoint.saved", saved)
                await self.on_checkpoint(conn, saved)
            case JobSucceeded() as succeeded:
                await self.believe_report(conn, "job.succeeded", succeeded)
                await self.on_succeeded(conn, envelope.id, succeeded, copies)
                await tracking.record_ended(
                    conn, succeeded.job_id, "succeeded", succeeded.finished_at
                )
                await job_inputs.ended(conn, succeeded.job_id, succeeded.finished_at)
                await reproductions.on_ended(
                    conn,
                    succeeded.job_id,
                    "succeeded",
                    succeeded.finished_at,
                    self._clock(),
                    metrics=succeeded.metrics,
                    artifact=succeeded.artifact,
                )
            case JobFailed() as failed if envelope.source == SCHEDULER:
                await tracking.record_ended(conn, failed.job_id, "failed", failed.finished_at)
                await job_inputs.ended(conn, failed.job_id, failed.finished_at)
                await reproductions.on_ended(
                    conn, failed.job_id, "failed", failed.finished_at, self._clock()
                )
            case JobCancelled() as cancelled:
                await tracking.record_ended(conn, cancelled.job_id, "cancelled", envelope.time)
                await job_inputs.ended(conn, cancelled.job_id, envelope.time)
                await reproductions.on_ended(
                    conn, cancelled.job_id, "cancelled", envelope.time, self._clock()
                )
            case JobMetrics() as batch:
                await self.check_metrics(conn, batch)
                await metric_ingest.ingest(conn, [batch])
            case CostRecorded() as cost:
                await model_cost.record(conn, envelope.id, cost, self._clock())
            case _:
                pass

    async def check_metrics(self, conn: asyncpg.Connection, batch: JobMetrics) -> None:
        """Raise unless ``batch`` comes from the node its run started on (module docstring)."""
        run = await tracking.run_of(conn, batch.allocation_id)
        if run is None:
            raise RunNotRecorded(
                f"job {batch.job_id}: job.started of allocation {batch.allocation_id} is not "
                "recorded yet"
            )
        if run != (batch.job_id, batch.node_id):
            raise Reject(
                f"job.metrics of job {batch.job_id} from node {batch.node_id}: allocation "
                f"{batch.allocation_id} is job {run[0]}'s on node {run[1]}"
            )

    async def believe_report(
        self, conn: asyncpg.Connection, what: str, report: CheckpointSaved | JobSucceeded
    ) -> None:
        """Raise unless ``report`` is about a run of its job at its epoch, from the node it
        ran on (module docstring): ``RunNotRecorded`` (retried) while no run of its
        allocation is recorded, ``Reject`` when the allocation's run is another job's, of
        another epoch, or another node's (a gang peer's: the node a report names is the one
        that sent it, ``shared.events.trust``)."""
        run = await repo.run_identity(conn, report.allocation_id)
        if run is None:
            raise RunNotRecorded(
                f"job {report.job_id}: {what} of allocation {report.allocation_id}, whose "
                "job.started is not recorded (yet)"
            )
        node = report.node_id if report.node_id is not None else run[2]
        if run != (report.job_id, report.epoch, node):
            raise Reject(
                f"{what} of job {report.job_id} at epoch {report.epoch} from node {node}: "
                f"allocation {report.allocation_id} is job {run[0]}'s at epoch {run[1]} on "
                f"node {run[2]}"
            )

    async def on_started(self, conn: asyncpg.Connection, started: JobStarted) -> None:
        grant = await repo.grant_of(conn, started.allocation_id)
        if grant is None:
            raise NotGranted(
                f"job.started of allocation {started.allocation_id} for job {started.job_id}: "
                "the scheduler's grant of it is not recorded (yet)"
            )
        problem = unlike_its_grant(started, grant)
        if problem is not None:
            raise Reject(problem)
        await tracking.record_started(conn, started, self._clock())
        await job_inputs.record(conn, started, self._clock())
        if not await repo.insert_run(conn, Run.from_event(started), self._clock()):
            log.info("run %s of job %s recorded already", started.allocation_id, started.job_id)

    async def on_checkpoint(self, conn: asyncpg.Connection, saved: CheckpointSaved) -> None:
        if not await repo.insert_checkpoint(conn, saved):
            log.info("checkpoint %s of job %s recorded already", saved.checkpoint.uri, saved.job_id)

    async def on_succeeded(
        self, conn: asyncpg.Connection, event_id: str, succeeded: JobSucceeded, copies: Copies
    ) -> None:
        """Register ``succeeded``'s version with the copy ``prepare`` made for it (module
        docstring); ``CopyNotMade`` when none fits what is to be registered now."""
        plan = await self.plan(conn, succeeded)
        if isinstance(plan, Skip):
            log.log(plan.level, "job %s: %s", succeeded.job_id, plan.reason)
            return
        if self._store is None:
            log.warning("job %s: no object store configured; no version registered", plan.job_id)
            return
        made = copies.get(event_id)
        if made is None or made.key != copy_key(plan):
            raise CopyNotMade(
                f"job {succeeded.job_id}: what to register changed since its checkpoint was "
                "copied, or it was not copied (its start came in the same batch); copied again "
                "when redelivered"
            )
        if isinstance(made.copy, Exception):
            # Permanent: redelivery cannot make a changed or missing checkpoint right.
            log.error("job %s: %s; no model version registered", succeeded.job_id, made.copy)
            return
        if plan.model != plan.final.spec.name:
            log.info(
                "job %s: model %r of team %r is spelled %r; the version is registered there",
                plan.job_id,
                plan.final.spec.name,
                plan.team,
                plan.model,
            )
        await models.record(conn, self._store, plan, self._clock(), made.copy)

    async def plan(
        self, conn: asyncpg.Connection, succeeded: JobSucceeded
    ) -> models.Registration | Skip:
        """What ``succeeded`` registers, as committed now, or why it registers nothing;
        ``RunNotRecorded`` while its run's start is not recorded. Reads only."""
        existing = await repo.version_of_job(conn, succeeded.job_id)
        if existing is not None:
            return Skip(
                logging.INFO,
                f"registered already as {existing.team}/{existing.model_name} "
                f"v{existing.version}; success of allocation {succeeded.allocation_id} ignored",
            )
        runs = await repo.runs_of_job(conn, succeeded.job_id)
        final = next((r for r in runs if r.allocation_id == succeeded.allocation_id), None)
        if final is None:
            # Retried, not rejected: the runner publishes job.started first, so it will come.
            raise RunNotRecorded(
                f"job {succeeded.job_id}: job.started of allocation {succeeded.allocation_id} "
                "is not recorded yet"
            )
        if not final.spec.register_model:
            return Skip(logging.INFO, "its spec does not ask for a model version")
        try:
            artifact = domain.choose_artifact(
                succeeded.artifact, await repo.checkpoints_of_job(conn, succeeded.job_id)
            )
        except NoArtifact as exc:
            return Skip(logging.INFO, f"{exc}; no model version registered")
        spec = final.spec
        if not (names.is_valid("team", spec.team) and names.is_valid("model", spec.name)):
            return Skip(
                logging.WARNING,
                f"{spec.team!r}/{spec.name!r} is not a valid model name (names.py); no "
                "version registered",
            )
        # Model names are unique in a team regardless of case: a job named 'ResNet' in a
        # team with a model 'resnet' adds a version to 'resnet' (the one model a person
        # reads both names as), never a second model; refusing would lose the version, as
        # no one is there to answer. The version's model.registered names 'resnet'. (Should
        # another spelling's first version commit meanwhile, lock_model's NameTaken fails
        # this delivery and the redelivered event is registered there.)
        model = await repo.model_spelling(conn, spec.team, spec.name) or spec.name
        return models.Registration(
            team=spec.team,
            model=model,
            project=spec.project,
            job_id=succeeded.job_id,
            final=final,
            runs=runs,
            checkpoint=artifact,
            metrics=dict(succeeded.metrics),
            origin="job_success",
            created_by=spec.user,
        )
