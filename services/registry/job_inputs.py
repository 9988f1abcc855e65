"""What a job was given: its dataset versions (the access audit) and the model version it
fine-tunes from, recorded when its ``job.started`` arrives (``handlers.on_started``).

Contract:
- Each of the spec's ``datasets`` (``team/name[:version]``; submission resolved the version
  at admission, the latest is taken otherwise) is recorded once per job in
  ``dataset_access``, with the job's team and the allocation that first started.
- The spec's ``parent_model`` (``team/name:version`` or ``@alias``, an alias resolved now)
  is recorded once per job in ``job_parents`` (``record_parent``) from the first of its
  ``job.submitted`` (admitted, waiting), grant or start that the registry hears: the first
  answer stays. With ``parent_model_version_id`` (the version submission admitted) it is
  that version, found by its id, and only if it is the one ``parent_model`` names: a model
  deleted and made again under its name since the admission never takes its place.
  Without it (a publisher that does not say), the version is looked up by name.
  ``ended`` marks it ended when the job ends (succeeded, failed for good,
  cancelled); until then its parent version cannot be deleted (``models.delete_version``).
  A parent deleted before the registry heard of the job (between submission's check and
  its ``job.submitted``) is recorded as its tombstone (the edge stays true: the job was
  admitted as its child; without the admitted id, by name, only while its model is not
  deleted), and, unless the job has ended already, the registry puts a
  ``job.cancel_requested`` for it in its outbox (said on submission's behalf,
  ``trust``), whose reason names the deleted version: the scheduler cancels the job, queued
  or running, and the job's status says why, rather than the job failing when it fetches
  a parent that is gone. Logged at WARNING. Deliveries need not
  come in order: a job that ended before any event naming its parent was handled (its end
  is kept in ``jobs_ended_unheard`` when none of its starts was handled, which records the
  parent; ``retention`` deletes it after the event stream's horizon) has that parent
  recorded ended, keeping nothing. The
  two take turns per job (a transaction-scoped advisory lock), so neither misses the other.
- Only what the job's team may read is recorded: a dataset or a model neither its own nor
  granted to it (``dataset_repository.readable``, ``model_grants.readable``), or anything that does not exist is logged at WARNING and skipped
  (submission refuses such a job at admission; one that got past it is not given a lineage
  edge it had no right to). Nothing here raises for a bad reference: redelivery would not
  make it right.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

import asyncpg

from trainyard_platform.services.registry import dataset_repository as datasets
from trainyard_platform.services.registry import model_grants, references
from trainyard_platform.services.registry import model_repository as models_repo
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry.domain import ModelVersion
from trainyard_platform.shared import outbox
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested, JobSpec, JobStarted
from trainyard_platform.shared.events.trust import REGISTRY

log = logging.getLogger(__name__)

CANCELLED_BY = "registry"
"""``user`` of the cancel request the registry says for a job whose parent is gone."""


async def record(conn: asyncpg.Connection, started: JobStarted, now: datetime) -> None:
    spec = started.spec
    for text in spec.datasets:
        try:
            ref = references.parse(text, alias_allowed=False)
        except ValueError as exc:
            log.warning("job %s: dataset %s; not recorded", started.job_id, exc)
            continue
        found = await datasets.version(conn, ref.team, ref.name, ref.version)
        if found is None or not await datasets.readable(conn, spec.team, ref.team, ref.name):
            log.warning(
                "job %s of team %s: dataset %s does not exist or is not readable by the team; "
                "not recorded",
                started.job_id,
                spec.team,
                text,
            )
            continue
        await datasets.record_access(
            conn, started.job_id, found, spec.team, started.allocation_id, now
        )
    await record_parent(conn, started.job_id, spec, now)


async def record_parent(
    conn: asyncpg.Connection, job_id: str, spec: JobSpec, now: datetime
) -> None:
    """Record the version ``spec`` names as ``parent_model`` as ``job_id``'s parent, unless
    one is recorded already (module docstring); nothing for a spec that names none."""
    if spec.parent_model is None:
        return
    await _turn(conn, job_id)
    if await conn.fetchval("SELECT 1 FROM job_parents WHERE job_id = $1", job_id):
        return  # the first answer stays; an alias is not resolved again
    team, text = spec.team, spec.parent_model
    try:
        ref = references.parse(text, alias_allowed=True)
    except ValueError as exc:
        log.warning("job %s: parent model %s; not recorded", job_id, exc)
        return
    admitted = spec.parent_model_version_id
    parent = (
        await _by_name(conn, team, ref)
        if admitted is None
        else await _admitted(conn, team, ref, admitted)
    )
    if parent is None:
        log.warning(
            "job %s of team %s: parent model %s%s does not exist, is not readable by the team "
            "or is not the version admitted; not recorded",
            job_id,
            team,
            text,
            "" if admitted is None else f" (version id {admitted})",
        )
        return
    ended_at = await conn.fetchval(
        "SELECT ended_at FROM jobs_ended_unheard WHERE job_id = $1", job_id
    )
    if parent.deleted_at is not None and ended_at is None:
        await _cancel_orphan(conn, job_id, spec, parent)
    await conn.execute(
        """INSERT INTO job_parents (job_id, parent_version_id, recorded_at, ended_at)
           VALUES ($1, $2, $3, $4) ON CONFLICT (job_id) DO NOTHING""",
        job_id,
        uuid.UUID(parent.id),
        now,
        ended_at,
    )


async def _cancel_orphan(
    conn: asyncpg.Connection, job_id: str, spec: JobSpec, parent: ModelVersion
) -> None:
    """Ask the scheduler to cancel ``job_id``, whose parent version was deleted between its
    admission and the registry hearing of it: it cannot fine-tune from a version whose
    artifact is gone, and waiting for its own fetch to fail explains nothing."""
    named = f"{parent.team}/{parent.model_name}:{parent.version}"
    reason = (
        f"its parent model version {named} was deleted after the job was admitted, before "
        "the registry heard of the job, so there is nothing to fine-tune from; submit it "
        "again naming a version that exists"
    )
    log.warning("job %s of team %s: %s; cancelling it", job_id, spec.team, reason)
    request = JobCancelRequested(job_id=job_id, team=spec.team, user=CANCELLED_BY, reason=reason)
    await outbox.enqueue(conn, Envelope.wrap(request, source=REGISTRY, subject=job_id))


async def _admitted(
    conn: asyncpg.Connection, team: str, ref: references.Reference, version_id: str
) -> ModelVersion | None:
    """The version submission admitted (``version_id``), if it is the one ``ref`` names
    and ``team`` may read it: found by its id, so a model deleted and made again under its
    name since is never taken for it."""
    found = await repo.version_by_id(conn, version_id)
    if found is None or (found.team, found.model_name) != (ref.team, ref.name):
        return None
    if ref.version is not None and found.version != ref.version:
        return None
    if not await model_grants.version_readable(conn, team, found.team, version_id):
        return None
    return found


async def _by_name(
    conn: asyncpg.Connection, team: str, ref: references.Reference
) -> ModelVersion | None:
    """The version ``ref`` names now (an alias resolved now), if ``team`` may read it: for
    a spec that does not carry the id submission admitted."""
    number = ref.version
    if ref.alias is not None:
        model = await models_repo.model(conn, ref.team, ref.name)
        number = None if model is None else model.aliases.get(ref.alias)
    if number is None or not await model_grants.readable(conn, team, ref.team, ref.name):
        return None
    return await repo.model_version(conn, ref.team, ref.name, number)


async def ended(conn: asyncpg.Connection, job_id: str, at: datetime) -> None:
    """``job_id`` ended (succeeded, failed for good, or cancelled): its parent version, if it
    named one, is no longer kept for it. When no parent is recorded for it yet, its end is
    kept for the one a late event records (module contract)."""
    await _turn(conn, job_id)
    await conn.execute(
        "UPDATE job_parents SET ended_at = $2 WHERE job_id = $1 AND ended_at IS NULL", job_id, at
    )
    await conn.execute(
        # Only for a job none of whose starts was handled here (tracked_jobs): a start
        # records the parent, if the job names one, so such a job's end needs no keeping.
        """INSERT INTO jobs_ended_unheard (job_id, ended_at)
           SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM job_parents WHERE job_id = $1)
             AND NOT EXISTS (SELECT 1 FROM tracked_jobs WHERE job_id = $1)
           ON CONFLICT (job_id) DO NOTHING""",
        job_id,
        at,
    )


async def _turn(conn: asyncpg.Connection, job_id: str) -> None:
    """Wait for any other transaction recording ``job_id``'s parent or end to commit: each
    reads what the other writes (read committed sees it once committed)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('registry.job_parents:' || $1, 0))",
        job_id,
    )
