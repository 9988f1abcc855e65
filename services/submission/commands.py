"""What users can do, each as one database transaction: the layer under the controllers.

Contract:
- Every operation on jobs takes the authenticated ``Caller`` and touches only the
  caller's team; a job of another team is ``NotFound``, exactly like a job that does not
  exist, so ids of other teams cannot be probed. Operators address any team's job by id,
  and list any team's jobs or every team's (``list_jobs``).
- Roles (``shared.identity.Role``): viewers read; members also submit and cancel their own
  jobs; admins cancel any job of their team (403 otherwise). Every write of an admin or an
  operator is recorded in the audit log in the same transaction (``shared.audit``).
- ``submit_job`` stores the job, its first history entry and the ``JobSubmitted`` event in
  one transaction: a job that got 201 is announced, and a job that is announced exists. For
  a caller whose writes are not audited (members) the three rows are one statement, a
  data-modifying CTE that is its own transaction (one round trip); a remembered caller's
  submissions that arrive while others are being written share one such statement and its
  commit (``group_commit``); an audited caller's submission is a transaction with the audit
  row.
- ``check_job`` (a dry run) makes ``submit_job``'s checks and stores nothing: no row, no
  event, no audit entry.
- An idempotency key this user used before answers with the job it stored (a replay: no
  second job, 200) when the request is the same as the one that stored it, compared by the
  fingerprint of the request as validated, defaults applied (``schemas.request_fingerprint``,
  kept with the job: a field left out or sent with its default value is the same request),
  never by what the server made of it (a budget's lowering, a resolved dataset version), so
  a retry is a replay whatever changed in between; a different request is ``Conflict``
  naming ``Idempotency-Key``. ``replay`` answers it before any admission, so one that would
  refuse or change a new job cannot refuse or change a retry (``replay_despite_flavor``:
  nor can a flavor retired since). A job stored before
  fingerprints were kept (none) is compared by its spec as stored; one stored with the
  earlier form of fingerprint (of the fields its body set) by that form
  (``Fingerprint.matches``).
- ``cancel_job`` announces ``JobCancelRequested`` once; the status turns CANCELLED only when
  the scheduler confirms with ``JobCancelled``. It is conditional
  (``shared.http_app.Preconditions``) on the job's ``job_tag``, the ``ETag`` of ``GET
  /v1/jobs/{id}``: with ``If-Match: <it>`` only while the job is where it was read in its
  life (412 otherwise, nothing asked).
- A job whose code is a bundle is accepted only when the caller's team uploaded that
  bundle (``PUT /v1/bundles/{sha256}``), otherwise 422 on ``code.sha256``; and only when
  its ``code.size_bytes`` is that bundle's size, otherwise 422 on ``code.size_bytes``
  naming both sizes (a runner reads no more than the spec's size: ``bundle_problem``).
  That check reads the object store (``reads_the_store``): ``submit_job`` and ``check_job``
  must not be given a ``held`` connection for such a job, which would be held through it.
- ``job_logs`` reads a job's log chunks from the object store, scoped like ``get_job``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from trainyard_platform.services.submission import identity, logs
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.domain import JobStatus
from trainyard_platform.services.submission.errors import Conflict, Forbidden, NotFound
from trainyard_platform.services.submission.governance import Lowered, lowered_reason
from trainyard_platform.services.submission.group_commit import GroupCommit
from trainyard_platform.services.submission.identity import Caller
from trainyard_platform.services.submission.known_callers import KnownCaller
from trainyard_platform.services.submission.objects import Objects
from trainyard_platform.services.submission.schemas import (
    BundleCode,
    Fingerprint,
    JobFilters,
    JobRequest,
    JobSummary,
    JobView,
    LogChunk,
    LogPage,
    parse_idempotency_key,
    parse_job_request,
    request_fingerprint,
)
from trainyard_platform.services.submission.views import (
    job_summary,
    job_view,
    submitted_job_json,
    submitted_job_view,
)
from trainyard_platform.shared import audit, outbox, paging
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    JobCancelRequested,
    JobSpec,
    JobSubmitted,
    dump,
)
from trainyard_platform.shared.http_app import Preconditions, entity_tag
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.telemetry import inject, recorded_trace_id

SOURCE = "trainyard/submission"


async def submit_job(
    pool: asyncpg.Pool,
    objects: Objects,
    caller: Caller,
    request: JobRequest,
    idempotency_key: str | None,
    reproduces: str | None = None,
    held: asyncpg.Connection | None = None,
    lowered: Lowered | None = None,
    fingerprint: Fingerprint | None = None,
) -> tuple[JobView, bool]:
    """Store and announce a job; return its view and whether it is new (False: the same
    idempotency key was used before, and the earlier job is returned). ``reproduces``: the
    id of the job this one reproduces (``reproduce``). ``held``: a connection of ``pool``
    the caller already holds (and gives back itself), used instead of taking another.
    ``lowered``: a spent budget lowered its class (``governance.admit``): its first history
    entry and its ``job.submitted`` say from what class. ``fingerprint``: of the request
    (``schemas.request_fingerprint``), given with an idempotency key."""
    job = await prepare(objects, caller, request, reproduces, lowered, fingerprint)
    job_id, spec, stored, now = job.job_id, job.spec, job.stored, job.submitted_at
    if not audit.must_record(caller.principal):
        return await _store_announced(_connection(pool, held), caller, job, idempotency_key)
    async with _connection(pool, held) as conn, conn.transaction():
        created = await repo.insert_job(
            conn,
            job_id,
            caller.team_id,
            caller.user_id,
            spec.name,
            stored,
            idempotency_key,
            now,
            trace_id=recorded_trace_id(),
            reason=job.reason,
            fingerprint=job.stored_fingerprint,
        )
        if not created:
            assert idempotency_key is not None  # only a repeated key can conflict
            replayed = await _replayed_job(conn, caller, idempotency_key, job)
            return await _read_view(conn, caller, replayed), False
        await outbox.enqueue(conn, Envelope.wrap(job.event, source=SOURCE, subject=job_id))
        if audit.must_record(caller.principal):
            await audit.record(conn, caller.principal, "submit job", job_id, {"name": spec.name})
    trace_id = recorded_trace_id()
    view = submitted_job_view(job_id, caller.team, caller.user, stored, now, trace_id, job.reason)
    return view, True


async def check_job(
    pool: asyncpg.Pool,
    objects: Objects,
    caller: Caller,
    request: JobRequest,
    idempotency_key: str | None,
    held: asyncpg.Connection | None = None,
    lowered: Lowered | None = None,
    fingerprint: Fingerprint | None = None,
) -> JobView:
    """What ``submit_job`` would answer for ``request``, with its checks, storing nothing (a
    dry run): ``prepare``'s (the role, the team, the bundle), and, for an idempotency key
    used before, the earlier job when the request is the same (as a replay answers) or the
    ``Conflict`` a replay raises. A new job's view is ``submitted_job_view``'s, under an id
    no job has."""
    job = await prepare(objects, caller, request, lowered=lowered, fingerprint=fingerprint)
    if idempotency_key is not None:
        async with _connection(pool, held) as conn:
            row = await repo.job_by_idempotency_key(
                conn, caller.team_id, caller.user_id, idempotency_key
            )
            if row is not None:
                replayed = await _replayed_job(conn, caller, idempotency_key, job)
                return await _read_view(conn, caller, replayed)
    trace_id = recorded_trace_id()
    return submitted_job_view(
        job.job_id, caller.team, caller.user, job.stored, job.submitted_at, trace_id, job.reason
    )


@dataclass(frozen=True)
class Prepared:
    """A job checked for its caller and ready to store (``prepare``)."""

    job_id: str
    spec: JobSpec
    stored: dict[str, Any]
    submitted_at: datetime
    lowered: Lowered | None = None
    """A spent budget lowered its class (``governance.admit``)."""
    fingerprint: Fingerprint | None = None
    """Of the request (``schemas.request_fingerprint``): its ``stored`` form is kept with
    the job, what a replay of its idempotency key is compared by. None without a key."""

    @property
    def stored_fingerprint(self) -> str | None:
        """What the job's row keeps of ``fingerprint`` (None without a key)."""
        return None if self.fingerprint is None else self.fingerprint.stored

    @property
    def reason(self) -> str:
        """Its first history entry's reason (``governance.lowered_reason``)."""
        return lowered_reason(self.lowered)

    @property
    def event(self) -> JobSubmitted:
        """Its ``job.submitted``: with the class asked for when a budget lowered it."""
        lowered_from = self.lowered.from_class if self.lowered else None
        return JobSubmitted(
            job_id=self.job_id,
            spec=self.spec,
            submitted_at=self.submitted_at,
            lowered_from=lowered_from,
        )


async def prepare(
    objects: Objects,
    caller: Caller,
    request: JobRequest,
    reproduces: str | None = None,
    lowered: Lowered | None = None,
    fingerprint: Fingerprint | None = None,
) -> Prepared:
    """What ``submit_job`` checks before it writes (the role, the team, the bundle), and
    the job's id, spec and time (``lowered``, ``fingerprint``: as ``submit_job``'s). Reads
    only (the bundle's size, which says its existence too); raises the refusal."""
    caller.require(Role.MEMBER, "submitting jobs")
    if request.team is not None and request.team != caller.team:
        raise Forbidden(f"you can submit jobs for your own team ({caller.team}) only")
    code = request.code
    if isinstance(code, BundleCode):
        stored = await objects.bundle_size(caller.team, code.sha256)
        problem = bundle_problem(caller.team, code, stored)
        if problem is not None:
            raise RequestInvalid([problem])
    spec = request.to_spec(user=caller.user, team=caller.team)
    if reproduces is not None:
        spec = spec.model_copy(update={"reproduces": reproduces})
    return Prepared(str(uuid.uuid4()), spec, dump(spec), datetime.now(UTC), lowered, fingerprint)


def reads_the_store(request: JobRequest) -> bool:
    """Whether ``prepare`` reads the object store for ``request`` (the size of the bundle it
    names): a caller holding a pooled connection gives it back first."""
    return isinstance(request.code, BundleCode)


def bundle_problem(team: str, code: BundleCode, stored_bytes: int | None) -> FieldError | None:
    """Why a job of ``team`` cannot run the bundle ``code`` names, whose stored size is
    ``stored_bytes`` (None: ``team`` has not uploaded it); None when it can. A runner
    downloads no more than ``code.size_bytes`` and refuses a larger bundle, and a bundle's
    sha256 fixes its size, so any other size is a mistake found now, before the job waits
    in the queue and takes GPUs."""
    if stored_bytes is None:
        return FieldError(
            field="code.sha256", message=f"no bundle with this sha256 was uploaded for team {team}"
        )
    if stored_bytes != code.size_bytes:
        return FieldError(
            field="code.size_bytes",
            message=f"the bundle with this sha256 is {stored_bytes} bytes, not the "
            f"{code.size_bytes} bytes given: give the size of the file uploaded",
        )
    return None


async def submit_prepared_if_known(
    writer: GroupCommit, known: KnownCaller, job: Prepared, idempotency_key: str | None
) -> tuple[JobView | bytes, bool] | None:
    """``submit_job`` for a job ``prepare``d for ``known.caller`` (a caller whose writes are
    not audited), in one statement that also checks the token, the caller and the team's
    screening are still what ``known`` remembers (``repository.insert_job_if_caller``),
    written by ``writer`` alone or with the submissions concurrent with it
    (``group_commit``). None when any of them changed: nothing was stored, and the caller
    must be checked again (``known_callers``). A new job's view comes as the JSON the API
    answers (``views.submitted_job_json``), a replayed one's as a ``JobView``."""
    caller = known.caller
    assert not audit.must_record(caller.principal)  # audited callers are never remembered
    envelope = Envelope.wrap(job.event, source=SOURCE, subject=job.job_id)
    event = (envelope.id, envelope.nats_subject, envelope.to_json(), inject())
    trace_id = recorded_trace_id()
    held, stored = await writer.write(
        (
            (known.token_hash, caller.token_id, caller.user_id, caller.team_id, str(caller.role)),
            (known.month, known.declared, known.retired, known.budgets),
            (
                job.job_id,
                job.spec.name,
                job.stored,
                idempotency_key,
                job.submitted_at,
                trace_id,
                job.reason,
                job.stored_fingerprint,
            ),
            event,
        )
    )
    if not held:
        return None
    if not stored:
        assert idempotency_key is not None  # only a repeated key can conflict
        async with writer.pool.acquire() as conn, conn.transaction():
            replayed = await _replayed_job(conn, caller, idempotency_key, job)
            return await _read_view(conn, caller, replayed), False
    view = submitted_job_json(
        job.job_id, caller.team, caller.user, job.stored, job.submitted_at, trace_id, job.reason
    )
    return view, True


@asynccontextmanager
async def _connection(
    pool: asyncpg.Pool, held: asyncpg.Connection | None
) -> AsyncIterator[asyncpg.Connection]:
    """``held`` as it is (its holder gives it back), else one of ``pool`` for the block."""
    if held is not None:
        yield held
        return
    async with pool.acquire() as conn:
        yield conn


async def _store_announced(
    connection: AbstractAsyncContextManager[asyncpg.Connection],
    caller: Caller,
    job: Prepared,
    idempotency_key: str | None,
) -> tuple[JobView, bool]:
    """``submit_job`` for a caller whose writes are not audited: the job, its first history
    entry and its event in one statement, one round trip."""
    job_id, spec, stored, now = job.job_id, job.spec, job.stored, job.submitted_at
    envelope = Envelope.wrap(job.event, source=SOURCE, subject=job_id)
    event = (envelope.id, envelope.nats_subject, envelope.to_json(), inject())
    trace_id = recorded_trace_id()
    async with connection as conn:
        created = await repo.insert_job_announced(
            conn,
            job_id,
            caller.team_id,
            caller.user_id,
            spec.name,
            stored,
            idempotency_key,
            now,
            trace_id,
            event,
            job.reason,
            job.stored_fingerprint,
        )
        if not created:
            assert idempotency_key is not None  # only a repeated key can conflict
            async with conn.transaction():
                replayed = await _replayed_job(conn, caller, idempotency_key, job)
                return await _read_view(conn, caller, replayed), False
        outbox.enqueued_by(conn)
    view = submitted_job_view(job_id, caller.team, caller.user, stored, now, trace_id, job.reason)
    return view, True


async def replay(
    pool: asyncpg.Pool,
    caller: Caller,
    idempotency_key: str,
    fingerprint: Fingerprint,
    held: asyncpg.Connection | None = None,
) -> JobView | None:
    """The view of the job this user stored with ``idempotency_key`` when the request that
    stored it had this ``fingerprint`` (a replay, answered before any admission); raises
    ``Conflict`` when it had another. None when the key is unused, or its job was stored
    before fingerprints were kept (its spec is compared once the request is admitted, as
    ``submit_job`` does). ``held``: as ``submit_job``'s."""
    caller.require(Role.MEMBER, "submitting jobs")
    async with _connection(pool, held) as conn, conn.transaction():
        row = await repo.job_by_idempotency_key(
            conn, caller.team_id, caller.user_id, idempotency_key
        )
        if row is None or row["request_fingerprint"] is None:
            return None
        if not fingerprint.matches(row["request_fingerprint"]):
            raise _used_for_another(str(row["id"]))
        return await _read_view(conn, caller, str(row["id"]))


async def replay_despite_flavor(
    pool: asyncpg.Pool,
    caller: Caller,
    idempotency_key: str | None,
    body: bytes,
    refused: RequestInvalid,
    held: asyncpg.Connection | None = None,
    reproduces: str | None = None,
) -> JobView | None:
    """``replay`` for a request ``body`` refused (``refused``) only for its ``gpu_flavor``:
    a flavor retired since the key's job was admitted with it, which a retry is not a new
    job of. None for anything else, the refusal standing: no key, another fault, another
    request under the key. ``reproduces``: as ``schemas.request_fingerprint``'s."""
    if idempotency_key is None or {e.field for e in refused.errors} != {"gpu_flavor"}:
        return None
    try:
        request = parse_job_request(body, None)
        key = parse_idempotency_key(idempotency_key)
        assert key is not None  # one was given
        fingerprint = request_fingerprint(request, reproduces, team=caller.team)
        return await replay(pool, caller, key, fingerprint, held)
    except (RequestInvalid, Conflict):
        return None


def _used_for_another(job_id: str) -> Conflict:
    """The refusal of a request under a key this user used for another request, which
    made ``job_id``: the header named, with the job, so the client sees what it met."""
    reason = f"already used for a different request, which submitted job {job_id}"
    return Conflict(  # the detail holds the field's message: a client says it once
        f"this Idempotency-Key was {reason}: a retry sends that request unchanged; a new "
        "job needs a new key",
        field="Idempotency-Key",
        message=reason,
    )


async def _replayed_job(conn: asyncpg.Connection, caller: Caller, key: str, job: Prepared) -> str:
    """The id of the job stored with ``key``, which ``job`` (prepared under the same key)
    replays: compared by the requests' fingerprints, or for a job stored without one by
    the specs as stored. Raises ``Conflict`` when they differ."""
    row = await repo.job_by_idempotency_key(conn, caller.team_id, caller.user_id, key)
    assert row is not None  # the insert conflicted on exactly this row
    stored = row["request_fingerprint"]
    if stored is None:
        same = row["spec"] == job.stored
    else:
        same = job.fingerprint is not None and job.fingerprint.matches(stored)
    if not same:
        raise _used_for_another(str(row["id"]))
    return str(row["id"])


NO_CONDITIONS = Preconditions()
"""A write that sets no condition (``If-Match`` or ``If-None-Match``)."""


async def get_job(pool: asyncpg.Pool, caller: Caller, job_id: str) -> JobView:
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        return await _read_view(conn, caller, job_id)


JOBS = paging.Cursor("GET /v1/jobs", paging.instant, paging.text)
"""A page's position in a list of jobs: the last job's submission and id. Every list of
jobs (a team's, every team's) is in that one order, so a position is all a cursor needs."""


async def list_jobs(
    pool: asyncpg.Pool,
    caller: Caller,
    status: JobStatus | None,
    limit: int,
    after: str | None = None,
    filters: JobFilters | None = None,
    team: str | None = None,
    all_teams: bool = False,
) -> tuple[list[JobSummary], str | None]:
    """A page of the team's jobs, newest first: at most ``limit``, those listed after the
    cursor ``after`` (from an earlier page; none: from the newest). Returns the page and the
    cursor of the next one (None: this page is the last). A cursor is a position, not a
    snapshot: jobs submitted since never appear on later pages, none is listed twice.

    ``team`` (default: the caller's) lists another team's, for operators
    (``identity.team_in_reach``: another team is ``NotFound`` to anyone else, as one that
    does not exist); ``all_teams`` every team's, for operators only (``Denied`` to anyone
    else), and not with ``team`` (``RequestInvalid`` naming ``all_teams``)."""
    if all_teams and team is not None:
        raise RequestInvalid.one("all_teams", "give team or all_teams, not both")
    if all_teams:
        caller.require(Role.OPERATOR, "listing every team's jobs")
    position = JOBS.read(after)
    async with pool.acquire() as conn:
        team_id = None if all_teams else await identity.team_in_reach(conn, caller, team)
        rows = await repo.jobs_for_team(
            conn, team_id, status, limit + 1, position, (filters or JobFilters()).query()
        )
    page, more = paging.split(rows, limit)
    cursor = JOBS.write(page[-1]["submitted_at"], page[-1]["id"]) if more else None
    return [job_summary(row) for row in page], cursor


def job_tag(view: JobView) -> str:
    """The ETag of a job: of where it is in its life (status, attempt, whether its cancel
    was asked), not of what it reports as it runs (step, metrics, checkpoints, cost)."""
    return entity_tag(
        {"status": view.status, "attempt": view.attempt, "cancel_requested": view.cancel_requested}
    )


async def cancel_job(
    pool: asyncpg.Pool, caller: Caller, job_id: str, conditions: Preconditions = NO_CONDITIONS
) -> JobView:
    """Ask the scheduler to cancel the job (once; asking again changes nothing), when
    ``conditions`` hold for it as it is (``job_tag``), judged with its row locked after the
    404, 403 and 409 a request without them would get (RFC 9110, section 13.2.1)."""
    caller.require(Role.MEMBER, "cancelling jobs")
    async with pool.acquire() as conn, conn.transaction():
        team_id = await _team_of_job(conn, caller, job_id)
        row = await repo.lock_job_for_team(conn, team_id, job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        if row["user_id"] != caller.user_id and not caller.is_admin:
            raise Forbidden("members cancel their own jobs only; ask an admin of your team")
        status = JobStatus(row["status"])
        if status.is_terminal:
            raise Conflict(
                f"job {job_id} has already ended ({status})",
                field="job_id",
                message=f"the job has already ended ({status}): there is nothing to cancel",
            )
        conditions.check(f"job {job_id}", job_tag(await _read_view(conn, caller, job_id)))
        if row["cancel_requested_at"] is None:
            await repo.set_cancel_requested(conn, team_id, job_id, datetime.now(UTC))
            event = JobCancelRequested(job_id=job_id, team=caller.team, user=caller.user)
            await outbox.enqueue(conn, Envelope.wrap(event, source=SOURCE, subject=job_id))
            if audit.must_record(caller.principal):
                await audit.record(conn, caller.principal, "cancel job", job_id)
        return await _read_view(conn, caller, job_id)


LOGS = paging.Cursor("GET /v1/jobs/{id}/logs", logs.Cursor.parse, max_chars=logs.MAX_CURSOR_CHARS)
"""Where a reader of one job's logs is (``of`` the job): ``logs.Cursor``'s positions."""


async def job_logs(
    pool: asyncpg.Pool,
    objects: Objects,
    caller: Caller,
    job_id: str,
    after: str | None,
    limit: int,
    max_bytes: int,
) -> LogPage:
    """The job's log chunks after the cursor ``after`` (see ``logs``): at most ``limit``
    chunks and, past the first, at most ``max_bytes`` of output."""
    key = LOGS.read(after, of=job_id)
    cursor = key[0] if key else logs.Cursor()
    # The job first: a terminal status read here is never newer than the listing below.
    async with pool.acquire() as conn:
        job = await repo.job_for_team(conn, await _team_of_job(conn, caller, job_id), job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    started = job["started_at"] is not None or job["attempt"] is not None
    index = logs.LogIndex.from_keys(await objects.log_keys(job_id))
    chunks: list[LogChunk] = []
    returned: list[logs.ChunkRef] = []
    size = 0
    for ref in logs.page(index, cursor, limit):
        data = await objects.read_log(job_id, ref.key)
        if data is None or (returned and size + len(data) > max_bytes):
            break
        size += len(data)
        returned.append(ref)
        text = data.decode("utf-8", errors="replace")
        chunks.append(LogChunk(stream=ref.stream, seq=ref.seq, text=text))
    cursor = cursor.advance(returned)
    return LogPage(
        chunks=chunks,
        cursor=LOGS.write(cursor.part(), of=job_id) if cursor.positions else "",
        streams_complete=index.complete(cursor, started),
        job_terminal=JobStatus(job["status"]).is_terminal,
    )


async def job_logs_head(pool: asyncpg.Pool, caller: Caller, job_id: str, after: str | None) -> None:
    """What ``job_logs`` answers before it reads any log (a ``HEAD``): ``RequestInvalid``
    for a cursor not of this job's logs, ``NotFound`` for a job the caller may not address.
    No log is listed or read."""
    LOGS.read(after, of=job_id)
    async with pool.acquire() as conn:
        job = await repo.job_for_team(conn, await _team_of_job(conn, caller, job_id), job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")


async def _team_of_job(conn: asyncpg.Connection, caller: Caller, job_id: str) -> int:
    """The team whose jobs the caller may address by id: its own, or for an operator the
    job's own team (any)."""
    if caller.principal.is_operator:
        found = await repo.team_of_job(conn, job_id)
        if found is not None:
            return found
    return caller.team_id


async def _read_view(conn: asyncpg.Connection, caller: Caller, job_id: str) -> JobView:
    job = await repo.job_for_team(conn, await _team_of_job(conn, caller, job_id), job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job_view(
        job,
        history=await repo.history(conn, job_id),
        checkpoints=await repo.checkpoints(conn, job_id),
        model=await repo.latest_model(conn, job_id),
        costs=await repo.costs(conn, job_id),
        allocations=await repo.allocation_count(conn, job_id),
    )
