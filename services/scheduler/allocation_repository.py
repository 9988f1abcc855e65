"""The scheduler's SQL about allocations, their leases and notices, and fair-share usage:
one function per query, each taking a connection inside the caller's transaction (the
scheduling lock held). Tables are unqualified: the pool's ``search_path`` is the
``scheduler`` schema."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

import asyncpg

from trainyard_platform.services.scheduler.domain import Allocation, AllocationStatus, Outcome
from trainyard_platform.services.scheduler.repository import Row
from trainyard_platform.shared.events.payloads import CheckpointRef

# --- allocations and leases ------------------------------------------------------------

_ALLOCATION_COLUMNS = (
    "allocation_id, job_id, node_id, epoch, attempt, gpu_indices, status, granted_at, "
    "gang_id, gang_size, borrowed, notice_at"
)


async def next_epochs(conn: asyncpg.Connection, count: int) -> list[int]:
    """``count`` fresh fencing epochs, ascending."""
    rows = await conn.fetch(
        "SELECT nextval('allocation_epoch') AS epoch FROM generate_series(1, $1) ORDER BY 1",
        count,
    )
    return [r["epoch"] for r in rows]


async def insert_allocations(conn: asyncpg.Connection, allocations: Sequence[Allocation]) -> None:
    """Insert allocations and one live lease per GPU (the unique index may refuse them), in
    two statements however many there are."""
    await conn.execute(
        f"INSERT INTO allocations ({_ALLOCATION_COLUMNS}) "
        "SELECT a.id, a.job_id, a.node_id, a.epoch, a.attempt, a.gpus::integer[], a.status, "
        "a.granted_at, a.gang_id, a.gang_size, a.borrowed, NULL "
        "FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::integer[], "
        "$6::text[], $7::text[], $8::timestamptz[], $9::uuid[], $10::integer[], "
        "$11::boolean[]) AS a(id, job_id, node_id, epoch, attempt, gpus, status, granted_at, "
        "gang_id, gang_size, borrowed)",
        [uuid.UUID(a.allocation_id) for a in allocations],
        [a.job_id for a in allocations],
        [a.node_id for a in allocations],
        [a.epoch for a in allocations],
        [a.attempt for a in allocations],
        # One array per row: as array literals, since unnest() would flatten a 2-D array.
        ["{" + ",".join(map(str, a.gpu_indices)) + "}" for a in allocations],
        [a.status.value for a in allocations],
        [a.granted_at for a in allocations],
        [uuid.UUID(a.gang_id or a.allocation_id) for a in allocations],
        [a.gang_size for a in allocations],
        [a.borrowed for a in allocations],
    )
    leases = [(a.allocation_id, a.node_id, i) for a in allocations for i in a.gpu_indices]
    await conn.execute(
        "INSERT INTO gpu_leases (allocation_id, node_id, gpu_index) "
        "SELECT * FROM unnest($1::uuid[], $2::text[], $3::integer[])",
        [uuid.UUID(a) for a, _, _ in leases],
        [n for _, n, _ in leases],
        [i for _, _, i in leases],
    )


async def live_allocations(conn: asyncpg.Connection, job_id: str) -> list[Allocation]:
    """The job's live allocations: none, one, or one per node of its gang."""
    return (await live_allocations_of(conn, [job_id])).get(job_id, [])


async def live_allocations_of(
    conn: asyncpg.Connection, job_ids: Sequence[str]
) -> dict[str, list[Allocation]]:
    """Each of these jobs' live allocations, by job (jobs without one are left out)."""
    rows = await conn.fetch(
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations "
        "WHERE job_id = ANY($1::text[]) AND released_at IS NULL ORDER BY job_id, node_id "
        "FOR UPDATE",
        list(job_ids),
    )
    by_job: dict[str, list[Allocation]] = {}
    for row in rows:
        by_job.setdefault(row["job_id"], []).append(Allocation.from_row(row))
    return by_job


async def live_allocations_on(conn: asyncpg.Connection, node_id: str) -> list[Allocation]:
    rows = await conn.fetch(
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations "
        "WHERE node_id = $1 AND released_at IS NULL ORDER BY granted_at FOR UPDATE",
        node_id,
    )
    return [Allocation.from_row(r) for r in rows]


async def allocations_by_id(
    conn: asyncpg.Connection, allocation_ids: Sequence[uuid.UUID]
) -> list[tuple[Allocation, bool]]:
    """The allocations with these ids, each with whether it is still live."""
    rows = await conn.fetch(
        f"SELECT {_ALLOCATION_COLUMNS}, released_at IS NULL AS live FROM allocations "
        "WHERE allocation_id = ANY($1::uuid[])",
        list(allocation_ids),
    )
    return [(Allocation.from_row(r), r["live"]) for r in rows]


async def ended_allocation(
    conn: asyncpg.Connection, allocation_id: str
) -> tuple[Allocation, Outcome, datetime] | None:
    """The released allocation with this id, its outcome and release time (locked for the
    transaction), or None (unknown, not a uuid, or still live)."""
    try:
        key = uuid.UUID(allocation_id)
    except ValueError:
        return None
    row = await conn.fetchrow(
        f"SELECT {_ALLOCATION_COLUMNS}, outcome, released_at FROM allocations "
        "WHERE allocation_id = $1 AND released_at IS NOT NULL FOR UPDATE",
        key,
    )
    if row is None:
        return None
    return Allocation.from_row(row), row["outcome"], row["released_at"]


async def amend_lost_release(
    conn: asyncpg.Connection, allocation_id: str, released_at: datetime
) -> bool:
    """A lost allocation's runner reported success after all: its outcome becomes
    ``succeeded`` and it ends at ``released_at`` (its GPU leases keep the time the scheduler
    freed them). False when it was not a lost allocation (any more)."""
    amended = await conn.fetchval(
        "UPDATE allocations SET outcome = 'succeeded', released_at = $2 "
        "WHERE allocation_id = $1 AND outcome = 'lost' RETURNING true",
        uuid.UUID(allocation_id),
        released_at,
    )
    return bool(amended)


async def mark_allocation_started(
    conn: asyncpg.Connection, allocation_id: str, started_at: datetime
) -> None:
    await conn.execute(
        "UPDATE allocations SET status = $2, started_at = $3 WHERE allocation_id = $1",
        uuid.UUID(allocation_id),
        AllocationStatus.RUNNING.value,
        started_at,
    )


async def release_allocations(
    conn: asyncpg.Connection,
    releases: Sequence[tuple[str, datetime, Outcome]],
    stopping: Collection[str] = (),
    now: datetime | None = None,
    unreported: Mapping[str, float] | None = None,
    ended: Mapping[str, datetime] | None = None,
) -> None:
    """End these allocations, each ``(allocation id, released at, outcome)``, and free their
    GPUs, except those of the allocations in ``stopping`` (their runner has not said their
    processes are gone): their leases stay live, stopping since ``now`` (required with
    ``stopping``), until ``free_stopped``, ``free_unlisted`` or ``free_stopping_on``.
    ``unreported``: the GPU-seconds charged to the team's usage as of ``now`` for each
    allocation whose runner has not reported its end (migration 0019; ``settle_unreported``).
    ``ended``: when an allocation ended, where that is later than the end of its bill (its
    release time, ``domain.release_time``): its GPUs' leases end then, when they were
    really given up, not at the end of the bill (the allocation's ``released_at``)."""
    if not releases:
        return
    unreported = unreported or {}
    ended = ended or {}
    if (stopping or unreported) and now is None:
        raise ValueError("now: required when some allocations are still stopping")
    await conn.execute(
        "WITH ended AS (SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], "
        "                                    $5::boolean[], $9::timestamptz[]) "
        "               AS e(allocation_id, released_at, outcome, stopping, ended_at)), "
        "     leases AS (UPDATE gpu_leases l SET "
        "                  released_at = CASE WHEN ended.stopping THEN NULL "
        "                                     ELSE ended.ended_at END, "
        "                  stopping_since = CASE WHEN ended.stopping THEN $6::timestamptz END "
        "                FROM ended "
        "                WHERE l.allocation_id = ended.allocation_id "
        "                  AND l.released_at IS NULL) "
        "UPDATE allocations a SET status = $4, released_at = ended.released_at, "
        "                         outcome = ended.outcome, "
        "                         unreported_charge = ended.charge, "
        "                         unreported_charge_at = CASE WHEN ended.charge IS NOT NULL "
        "                                                     THEN $6::timestamptz END "
        "FROM (SELECT e.*, c.charge FROM ended e "
        "      LEFT JOIN unnest($7::uuid[], $8::float8[]) AS c(allocation_id, charge) "
        "      USING (allocation_id)) AS ended "
        "WHERE a.allocation_id = ended.allocation_id",
        [uuid.UUID(allocation_id) for allocation_id, _, _ in releases],
        [released_at for _, released_at, _ in releases],
        [outcome for _, _, outcome in releases],
        AllocationStatus.RELEASED.value,
        [allocation_id in stopping for allocation_id, _, _ in releases],
        now,
        [uuid.UUID(allocation_id) for allocation_id in unreported],
        list(unreported.values()),
        [ended.get(allocation_id, released_at) for allocation_id, released_at, _ in releases],
    )


# --- Charges of allocations released before their runner reported (migration 0019) ------


async def settle_unreported(
    conn: asyncpg.Connection, job_id: str, allocation_id: str, node_id: str, epoch: int
) -> tuple[float, datetime] | None:
    """The first end report of ``allocation_id``'s own runner (``job_id``, ``node_id`` and
    ``epoch`` as granted) heard after its release: clear the charge its release left open and return it,
    ``(GPU-seconds, charged at)``; None when none is open (never charged, settled already, or
    the report does not name the allocation as granted). Once only: the row is updated."""
    try:
        key = uuid.UUID(allocation_id)
    except ValueError:
        return None
    row = await conn.fetchrow(
        "UPDATE allocations a SET unreported_charge = NULL, unreported_charge_at = NULL "
        "FROM (SELECT unreported_charge, unreported_charge_at FROM allocations "
        "      WHERE allocation_id = $1 FOR UPDATE) AS old "
        "WHERE a.allocation_id = $1 AND a.node_id = $2 AND a.epoch = $3 AND a.job_id = $4 "
        "  AND a.released_at IS NOT NULL AND old.unreported_charge IS NOT NULL "
        "RETURNING old.unreported_charge, old.unreported_charge_at",
        key,
        node_id,
        epoch,
        job_id,
    )
    if row is None:
        return None
    return float(row["unreported_charge"]), row["unreported_charge_at"]


# --- GPUs still being stopped on (migration 0018) --------------------------------------


async def free_stopped(
    conn: asyncpg.Connection, allocation_id: str, node_id: str, epoch: int, now: datetime
) -> int:
    """The runner of ``node_id`` reported the end of ``allocation_id`` at ``epoch``: the GPUs
    its leases still held while it stopped are free as of ``now``. Returns how many were
    freed (0: none held, or the report does not name that allocation as it was granted)."""
    try:
        key = uuid.UUID(allocation_id)
    except ValueError:
        return 0
    freed: int = await conn.fetchval(
        "WITH freed AS (UPDATE gpu_leases l SET released_at = $4 FROM allocations a "
        "               WHERE l.allocation_id = $1 AND a.allocation_id = $1 "
        "                 AND l.node_id = $2 AND a.epoch = $3 "
        "                 AND l.released_at IS NULL AND l.stopping_since IS NOT NULL "
        "               RETURNING 1) "
        "SELECT count(*) FROM freed",
        key,
        node_id,
        epoch,
        now,
    )
    return freed


FREE_UNLISTED = (
    "WITH freed AS (UPDATE gpu_leases SET released_at = $3 "
    "               WHERE node_id = $1 AND released_at IS NULL "
    "                 AND stopping_since IS NOT NULL AND stopping_since < $3 "
    "                 AND allocation_id <> ALL($2::uuid[]) RETURNING 1) "
    "SELECT count(*) FROM freed"
)
"""``free_unlisted``'s statement, run at every heartbeat: a node's stopping leases are among
its live ones, which the partial unique index ``gpu_leases_one_live_per_gpu`` finds without
reading the node's past leases."""


async def free_unlisted(
    conn: asyncpg.Connection, node_id: str, running: Sequence[str], now: datetime
) -> int:
    """A heartbeat of ``node_id`` handled at ``now`` (the scheduler's clock) lists
    ``running`` (allocation ids, as the runner wrote them): the GPUs held for an ended
    allocation it does not list, held since before ``now`` (strictly: not in the batch that
    held them), are free as of ``now``. Returns how many were freed.

    Ordered by the scheduler's own clock alone: the heartbeat's ``sent_at`` (the runner's
    clock) plays no part, so a runner's clock ahead frees nothing early and one behind
    keeps nothing longer. A heartbeat lists every allocation its runner holds, from the
    grant's acceptance until its end is reported (``runner.agent.running_allocations``), so
    one that does not list the allocation, even one sent before the hold and handled after
    it, was sent by a runner that did not hold it: it had ended it, or had not yet taken its
    grant, and then the revocation behind that grant in its node's stream stops the launch
    before the job runs (a gang that succeeded revokes none of its other members: the first
    heartbeat that lists one has it fenced, ``handlers._fence_strays``), and a newer grant
    on those GPUs waits for that launch and stops the older epoch's job, if it started,
    before its own runs (``runner.agent``)."""
    listed: list[uuid.UUID] = []
    for raw in running:
        try:
            listed.append(uuid.UUID(raw))
        except ValueError:
            continue  # no allocation of ours: it keeps nothing held
    freed: int = await conn.fetchval(
        FREE_UNLISTED,
        node_id,
        listed,
        now,
    )
    return freed


async def free_stopping_on(conn: asyncpg.Connection, node_ids: Sequence[str], now: datetime) -> int:
    """These nodes were declared lost: the GPUs held on them for ended allocations are free
    as of ``now`` (the node is no longer placed on; its runner, if it comes back, stops
    what it still runs before it runs a new grant there). Returns how many were freed."""
    freed: int = await conn.fetchval(
        "WITH freed AS (UPDATE gpu_leases SET released_at = $2 "
        "               WHERE node_id = ANY($1::text[]) AND released_at IS NULL "
        "                 AND stopping_since IS NOT NULL RETURNING 1) "
        "SELECT count(*) FROM freed",
        list(node_ids),
        now,
    )
    return freed


async def set_notice(
    conn: asyncpg.Connection, allocation_ids: Sequence[str], at: datetime, reason: str
) -> None:
    """A preemption notice on these live allocations (a notice already given stands)."""
    await conn.execute(
        "UPDATE allocations SET notice_at = $2, notice_reason = $3 "
        "WHERE allocation_id = ANY($1::uuid[]) AND released_at IS NULL AND notice_at IS NULL",
        [uuid.UUID(a) for a in allocation_ids],
        at,
        reason,
    )


async def jobs_with_expired_notice(conn: asyncpg.Connection, cutoff: datetime) -> list[str]:
    """Jobs holding a live allocation whose preemption notice was given at or before
    ``cutoff`` (their grace is over)."""
    rows = await conn.fetch(
        "SELECT DISTINCT job_id FROM allocations "
        "WHERE released_at IS NULL AND notice_at IS NOT NULL AND notice_at <= $1 ORDER BY job_id",
        cutoff,
    )
    return [r["job_id"] for r in rows]


async def record_checkpoint(
    conn: asyncpg.Connection, allocation_id: str, saved_at: datetime
) -> None:
    """The job's latest complete checkpoint, on every live allocation of its gang."""
    await conn.execute(
        "UPDATE allocations SET last_checkpoint_at = GREATEST(last_checkpoint_at, $2) "
        "WHERE released_at IS NULL AND gang_id = "
        "(SELECT gang_id FROM allocations WHERE allocation_id = $1)",
        uuid.UUID(allocation_id),
        saved_at,
    )


async def record_resume_point(
    conn: asyncpg.Connection, job_id: str, ref: CheckpointRef, saved_at: datetime
) -> None:
    """Keep ``ref`` as the checkpoint ``job_id`` resumes from unless the one kept is of a
    later step (one of the same step is replaced: the later report is the later attempt's)."""
    await conn.execute(
        "INSERT INTO resume_checkpoints "
        "(job_id, uri, manifest_uri, step, size_bytes, sha256, saved_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO UPDATE SET "
        "uri = EXCLUDED.uri, manifest_uri = EXCLUDED.manifest_uri, step = EXCLUDED.step, "
        "size_bytes = EXCLUDED.size_bytes, sha256 = EXCLUDED.sha256, "
        "saved_at = EXCLUDED.saved_at WHERE resume_checkpoints.step <= EXCLUDED.step",
        job_id,
        ref.uri,
        ref.manifest_uri,
        ref.step,
        ref.size_bytes,
        ref.sha256,
        saved_at,
    )


async def resume_points(
    conn: asyncpg.Connection, job_ids: Sequence[str]
) -> dict[str, CheckpointRef]:
    """The checkpoint each of ``job_ids`` resumes from (``record_resume_point``); a job
    without one is absent."""
    rows = await conn.fetch(
        "SELECT job_id, uri, manifest_uri, step, size_bytes, sha256 FROM resume_checkpoints "
        "WHERE job_id = ANY($1::text[])",
        list(job_ids),
    )
    return {
        r["job_id"]: CheckpointRef(
            uri=r["uri"],
            manifest_uri=r["manifest_uri"],
            step=r["step"],
            size_bytes=r["size_bytes"],
            sha256=r["sha256"],
        )
        for r in rows
    }


# --- fair-share usage ------------------------------------------------------------------


async def usage_for_update(conn: asyncpg.Connection, team: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        "SELECT gpu_seconds, as_of FROM usage WHERE team = $1 FOR UPDATE", team
    )
    return row


async def set_usage(
    conn: asyncpg.Connection, team: str, gpu_seconds: float, as_of: datetime
) -> None:
    await conn.execute(
        "INSERT INTO usage (team, gpu_seconds, as_of) VALUES ($1, $2, $3) "
        "ON CONFLICT (team) DO UPDATE SET gpu_seconds = EXCLUDED.gpu_seconds, "
        "as_of = EXCLUDED.as_of",
        team,
        max(0.0, gpu_seconds),
        as_of,
    )
