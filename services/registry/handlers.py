"""Event handlers of the registry: one ``dispatch`` for every event it consumes.

Runs inside the transaction of ``shared.inbox.idempotent``.
- ``allocation.granted``: the scheduler's grant is remembered (its job, node, attempt, epoch
  and spec digest). A runner may publish ``job.*`` events for any job id, so what a runner
  says is believed only of what the scheduler granted: a ``job.started`` only as its grant
  says (``domain.unlike_its_grant``; one whose grant is not recorded yet is retried,
  ``NotGranted``, and dead-lettered after the bus's last delivery, one that says otherwise
  is rejected), a ``checkpoint.saved`` or ``job.succeeded`` only of a run so started of that
  job at that epoch (``believe_report``; retried while the run is not recorded), and a
  version is registered only from a checkpoint under the job's own prefix
  (``artifacts.source_key``).
- ``job.started``: the run is recorded (once per allocation).
- ``job.started`` also records what the job was given: its dataset versions (the access
  audit) and its parent model version (``job_inputs``).
- ``checkpoint.saved``: the checkpoint is recorded (once per job and object).
- ``job.succeeded``: when the job's spec asks for it (``register_model: true``), a model
  version is registered (``models.register``: the checkpoint is copied to the registry's own
  key and verified first) and ``model.registered`` goes to the outbox, both in this
  transaction. A job whose spec does not ask registers nothing (its checkpoints can still be
  registered by ``POST /v1/models/{team}/{name}/versions``). A checkpoint that is missing, outside the store, or
  changed since it was committed registers nothing (logged at ERROR, not retried), and so
  does a job whose team or model name is not a valid model name (``names``). A job
  registers at most one version on success: a second success
  (a redelivery under another event id, a fenced runner that finished too) is a logged
  no-op, and the unique job id makes a concurrent one fail and retry into that no-op. If the
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
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

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
from trainyard_platform.services.registry.artifacts import ArtifactMismatch, SourceOutsideStore
from trainyard_platform.services.registry.domain import (
    NoArtifact,
    Run,
    RunNotRecorded,
    spec_digest,
    unlike_its_grant,
)
from trainyard_platform.shared.bus import Delivery, NotYet, Reject
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointSaved,
    CostRecorded,
    JobCancelled,
    JobFailed,
    JobMetrics,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import SCHEDULER
from trainyard_platform.shared.storage import ObjectNotFound, ObjectStore

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


class RegistryHandlers:
    def __init__(self, store: ObjectStore | None = None, clock: Clock = utc_now) -> None:
        """``store``: where checkpoints are and registered copies go; without one (tests of
        other consumers) a success registers nothing."""
        self._store = store
        self._clock = clock

    async def dispatch_batch(
        self, deliveries: Sequence[Delivery], conn: asyncpg.Connection
    ) -> None:
        """Every first-time event of a fetched batch, in one transaction (``shared.inbox``)."""
        points: list[JobMetrics] = []
        for delivery in deliveries:
            with delivery.span(CONSUMER):
                if isinstance(delivery.envelope.data, JobMetrics):
                    await self.check_metrics(conn, delivery.envelope.data)
                    points.append(delivery.envelope.data)
                else:
                    await self.dispatch(delivery.envelope, conn)
        if points:
            await metric_ingest.ingest(conn, points)

    async def dispatch(self, envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        match envelope.data:
            case AllocationGranted() as grant:
                await repo.insert_grant(conn, grant, spec_digest(grant.spec), self._clock())
            case JobStarted() as started:
                await self.on_started(conn, started)
            case CheckpointSaved() as saved:
                await self.believe_report(conn, "checkpoint.saved", saved)
                await self.on_checkpoint(conn, saved)
            case JobSucceeded() as succeeded:
                await self.believe_report(conn, "job.succeeded", succeeded)
                await self.on_succeeded(conn, succeeded)
                await tracking.record_ended(
                    conn, succeeded.job_id, "succeeded", succeeded.finished_at
                )
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
                await reproductions.on_ended(
                    conn, failed.job_id, "failed", failed.finished_at, self._clock()
                )
            case JobCancelled() as cancelled:
                await tracking.record_ended(conn, cancelled.job_id, "cancelled", envelope.time)
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
        """Raise unless ``report`` is about a run of its job at its epoch (module docstring):
        ``RunNotRecorded`` (retried) while no run of its allocation is recorded, ``Reject``
        when the allocation's run is another job's or of another epoch."""
        run = await repo.run_identity(conn, report.allocation_id)
        if run is None:
            raise RunNotRecorded(
                f"job {report.job_id}: {what} of allocation {report.allocation_id}, whose "
                "job.started is not recorded (yet)"
            )
        if run != (report.job_id, report.epoch):
            raise Reject(
                f"{what} of job {report.job_id} at epoch {report.epoch}: allocation "
                f"{report.allocation_id} is job {run[0]}'s at epoch {run[1]}"
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

    async def on_succeeded(self, conn: asyncpg.Connection, succeeded: JobSucceeded) -> None:
        existing = await repo.version_of_job(conn, succeeded.job_id)
        if existing is not None:
            log.info(
                "job %s is registered already as %s/%s v%d; success of allocation %s ignored",
                succeeded.job_id,
                existing.team,
                existing.model_name,
                existing.version,
                succeeded.allocation_id,
            )
            return
        runs = await repo.runs_of_job(conn, succeeded.job_id)
        final = next((r for r in runs if r.allocation_id == succeeded.allocation_id), None)
        if final is None:
            # Retried, not rejected: the runner publishes job.started first, so it will come.
            raise RunNotRecorded(
                f"job {succeeded.job_id}: job.started of allocation {succeeded.allocation_id} "
                "is not recorded yet"
            )
        if not final.spec.register_model:
            log.info("job %s: its spec does not ask for a model version", succeeded.job_id)
            return
        try:
            artifact = domain.choose_artifact(
                succeeded.artifact, await repo.checkpoints_of_job(conn, succeeded.job_id)
            )
        except NoArtifact as exc:
            log.info("job %s: %s; no model version registered", succeeded.job_id, exc)
            return
        spec = final.spec
        if not (names.is_valid("team", spec.team) and names.is_valid("model", spec.name)):
            log.warning(
                "job %s: %r/%r is not a valid model name (names.py); no version registered",
                succeeded.job_id,
                spec.team,
                spec.name,
            )
            return
        # Model names are unique in a team regardless of case: a job named 'ResNet' in a
        # team with a model 'resnet' adds a version to 'resnet' (the one model a person
        # reads both names as), never a second model; refusing would lose the version, as
        # no one is there to answer. The version's model.registered names 'resnet'. (Should
        # another spelling's first version commit meanwhile, lock_model's NameTaken fails
        # this delivery and the redelivered event is registered there.)
        model = await repo.model_spelling(conn, spec.team, spec.name) or spec.name
        if model != spec.name:
            log.info(
                "job %s: model %r of team %r is spelled %r; the version is registered there",
                succeeded.job_id,
                spec.name,
                spec.team,
                model,
            )
        what = models.Registration(
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
        if self._store is None:
            log.warning("job %s: no object store configured; no version registered", what.job_id)
            return
        try:
            await models.register(conn, self._store, what, self._clock())
        except (SourceOutsideStore, ArtifactMismatch, ObjectNotFound) as exc:
            # Permanent: redelivery cannot make a changed or missing checkpoint right.
            log.error("job %s: %s; no model version registered", succeeded.job_id, exc)
