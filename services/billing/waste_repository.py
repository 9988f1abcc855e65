"""Billing's SQL for waste: recording the facts from events, and reading them for a report.

Every ``record_*`` runs in the consumer's transaction and is idempotent (a redelivered
event changes nothing). The readers return ``services.billing.waste`` facts; tables are
unqualified (the pool's ``search_path`` is the ``billing`` schema).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal

import asyncpg

from trainyard_platform.services.billing import waste_rollups as rollups
from trainyard_platform.services.billing.waste import Allocation, JobEnd, JobWaits, Owner, Piece
from trainyard_platform.services.billing.waste_rollups import allocation_of
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointSaved,
    JobFailed,
    JobPreempted,
    JobSubmitted,
    JobSucceeded,
    NodeSupplied,
    RunnerHeartbeat,
)

HEARTBEAT_GAP = timedelta(minutes=2)
"""Two heartbeats of a node further apart than this say nothing about the time between
them (the node was gone, or billing's facts of it were): no unallocated time is counted."""


async def record_job(conn: asyncpg.Connection, job: JobSubmitted, now: datetime) -> None:
    """Remember the submitted job (it waits from its submission), unless the scheduler's
    refusal of it was handled first (``forget_job``); ``ended`` when its end was handled
    first (``record_end``)."""
    spec = job.spec
    await conn.execute(
        """INSERT INTO waste_jobs (job_id, team, project, user_name, gpu_flavor, gpus,
                                   priority, submitted_at, recorded_at, ended)
           SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9,
                  EXISTS (SELECT 1 FROM waste_job_ends WHERE job_id = $1)
           WHERE NOT EXISTS (SELECT 1 FROM waste_refused_jobs WHERE job_id = $1)
           ON CONFLICT (job_id) DO NOTHING""",
        job.job_id,
        spec.team,
        spec.project,
        spec.user,
        spec.gpu_flavor,
        spec.gpus,
        spec.priority,
        job.submitted_at,
        now,
    )


async def forget_job(conn: asyncpg.Connection, job_id: str, now: datetime) -> None:
    """A job the scheduler refused on arrival: it never waited for GPUs. Remembered as
    refused, so that its submission, whichever comes first, does not record it."""
    await conn.execute(
        "INSERT INTO waste_refused_jobs (job_id, recorded_at) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING",
        job_id,
        now,
    )
    job = await conn.fetchrow(
        "DELETE FROM waste_jobs WHERE job_id = $1 RETURNING gpu_flavor, submitted_at", job_id
    )
    if job is not None:  # heartbeats handled meanwhile may have found it waiting
        await recheck_waiting(conn, job["gpu_flavor"], job["submitted_at"])


async def record_grant(conn: asyncpg.Connection, grant: AllocationGranted, now: datetime) -> None:
    await conn.execute(
        """INSERT INTO waste_grants (allocation_id, job_id, priority, recorded_at)
           VALUES ($1, $2, $3, $4) ON CONFLICT (allocation_id) DO NOTHING""",
        grant.allocation_id,
        grant.job_id,
        grant.spec.priority,
        now,
    )


async def record_checkpoint(conn: asyncpg.Connection, saved: CheckpointSaved) -> None:
    """Keep the checkpoint with the allocation and epoch it claims: it counts only for its
    job's own allocation at that epoch (``waste_rollups.LAST_CHECKPOINT``). One whose node
    (``node_id``, the sender's: ``shared.events.trust``) is not the node the allocation was
    announced on is a gang peer's word about it, and is not kept."""
    await conn.execute(
        "INSERT INTO waste_checkpoints (job_id, allocation_id, saved_at, epoch) "
        "SELECT $1, $2, $3, $4 WHERE $5::text IS NULL OR NOT EXISTS ("
        "SELECT 1 FROM announced_allocations WHERE allocation_id = $2 AND node_id <> $5) "
        "ON CONFLICT DO NOTHING",
        saved.job_id,
        saved.allocation_id,
        saved.saved_at,
        saved.epoch,
        saved.node_id,
    )
    await rollups.refresh_job(conn, saved.job_id)  # its allocations' lost work


def _measured(metrics: Mapping[str, float], name: str) -> Decimal | None:
    """The runner's measurement ``name``, or None (unmeasured) when it is missing or no
    finite number: a NaN kept would make every later rollup of the allocation fail, its
    release among them, and so leave the allocation unbilled."""
    value = metrics.get(name)
    return None if value is None or not math.isfinite(value) else Decimal(str(value))


async def record_run_report(
    conn: asyncpg.Connection, report: JobSucceeded | JobFailed | JobPreempted, now: datetime
) -> None:
    """What the runner measured of the allocation, from its end report's metrics, and a
    failure's ``failure_kind``, kept with the job, node and epoch the report claims: only
    the allocation's own report is read (``waste_rollups.OWN_REPORT``), the first of them
    counts, and one claiming another node, epoch or job keeps none out."""
    await conn.execute(
        """INSERT INTO waste_run_reports (allocation_id, job_id, node_id, epoch,
                                          gpu_utilization_mean, data_wait_fraction_mean,
                                          finished_at, recorded_at, failure_kind, outcome)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING""",
        report.allocation_id,
        report.job_id,
        report.node_id,
        report.epoch,
        _measured(report.metrics, "gpu_utilization_mean"),
        _measured(report.metrics, "data_wait_fraction_mean"),
        report.finished_at,
        now,
        report.failure_kind if isinstance(report, JobFailed) else None,
        _OUTCOME[type(report)],
    )
    await rollups.refresh(conn, [report.allocation_id])  # its idle and input-bound time


_OUTCOME = {JobSucceeded: "succeeded", JobFailed: "failed", JobPreempted: "preempted"}


async def own_success(conn: asyncpg.Connection, grant: AllocationGranted) -> datetime | None:
    """When the allocation's own runner said it succeeded (``finished_at`` of a success
    recorded before its grant, of its job, node and epoch), or None."""
    finished: datetime | None = await conn.fetchval(
        "SELECT finished_at FROM waste_run_reports WHERE allocation_id = $1 AND job_id = $2 "
        "AND node_id = $3 AND epoch = $4 AND outcome = 'succeeded'",
        grant.allocation_id,
        grant.job_id,
        grant.node_id,
        grant.epoch,
    )
    return finished


async def record_end(
    conn: asyncpg.Connection, job_id: str, outcome: str, ended_at: datetime, now: datetime
) -> None:
    """How the job ended: the first end said, except that a success replaces any other.
    The job is marked ``ended`` (billing's ``0020``: no longer among its flavor's open
    jobs that ``_WAITING_AT`` looks through)."""
    await conn.execute(
        """INSERT INTO waste_job_ends (job_id, outcome, ended_at, recorded_at)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (job_id) DO UPDATE
               SET outcome = EXCLUDED.outcome, ended_at = EXCLUDED.ended_at,
                   recorded_at = EXCLUDED.recorded_at
               WHERE EXCLUDED.outcome = 'succeeded' AND waste_job_ends.outcome <> 'succeeded'""",
        job_id,
        outcome,
        ended_at,
        now,
    )
    job = await conn.fetchrow(
        "UPDATE waste_jobs SET ended = true WHERE job_id = $1 RETURNING gpu_flavor, submitted_at",
        job_id,
    )
    if job is not None:  # heartbeats handled meanwhile may have found it waiting
        # Not before its submission (it waited at none of those), whatever time its end
        # says: a runner says its own ``finished_at``.
        await recheck_waiting(conn, job["gpu_flavor"], max(ended_at, job["submitted_at"]))


_HOLDS_NONE_AT = """NOT EXISTS (SELECT 1 FROM announced_allocations a
                       LEFT JOIN usage_ledger u USING (allocation_id)
                       WHERE a.job_id = j.job_id AND a.granted_at <= {at}
                         AND (u.ended_at IS NULL OR u.ended_at > {at}))"""

_WAITING_AT = f"""(EXISTS (
    SELECT 1 FROM waste_jobs j
    WHERE j.gpu_flavor = {{flavor}} AND NOT j.ended AND j.submitted_at <= {{at}}
      AND NOT EXISTS (SELECT 1 FROM waste_job_ends e
                      WHERE e.job_id = j.job_id AND e.ended_at <= {{at}})
      AND {_HOLDS_NONE_AT})
  OR EXISTS (
    SELECT 1 FROM waste_job_ends e JOIN waste_jobs j USING (job_id)
    WHERE e.ended_at > {{at}} AND j.gpu_flavor = {{flavor}} AND j.submitted_at <= {{at}}
      AND {_HOLDS_NONE_AT}))"""
"""Whether a job of the flavor ``{flavor}`` was waiting for GPUs at the instant ``{at}``
(SQL expressions): submitted, not ended, and holding no allocation then. Found from the
flavor's open jobs (``ended`` only narrows the search: their end is still checked) and
those that ended after the instant, never from every job the flavor ever had (billing's
``0020``)."""

_WAITING = f"SELECT {_WAITING_AT.format(flavor='$1', at='$2')}"
"""``_WAITING_AT`` of flavor ``$1`` at ``$2``."""


_HELD = """
SELECT allocation_id, gpus FROM (
    SELECT a.allocation_id, a.gpus FROM announced_allocations a
    WHERE a.node_id = $1 AND NOT a.released AND a.granted_at < $3
      AND NOT EXISTS (SELECT 1 FROM usage_ledger u WHERE u.allocation_id = a.allocation_id)
    UNION
    SELECT a.allocation_id, a.gpus FROM usage_ledger u
    JOIN announced_allocations a USING (allocation_id)
    WHERE u.node_id = $1 AND u.ended_at > $2 AND a.node_id = $1 AND a.granted_at < $3
    UNION
    SELECT a.allocation_id, a.gpus FROM announced_allocations a
    WHERE a.allocation_id = ANY($4::text[]) AND a.node_id = $1
) held
"""
"""The allocations (id, GPUs) holding GPUs of the node at any time in ``[$2, $3)``: those
billing's records (the scheduler's grants and releases) put on it, and those of its
allocations ``$4`` (what the heartbeats at either end of the interval say the node runs)
whatever the records say. Each allocation granted on it before the interval ends and not
released before it starts holds its GPUs for the whole interval, so a grant or release
inside it counts nothing free rather than too much; one the node still runs after its release (a job still stopping: a
lost node back after a short network cut, a revoke by force, a gang member fenced) holds
them until the node stops naming it. Each allocation counts once. Read at every
heartbeat, so from the node's open allocations (not billed yet; ``released`` only narrows
the search, billing's ``0016``), those whose bill ends after the interval starts and those
named, never from every allocation the node ever had."""


async def record_supply(conn: asyncpg.Connection, supplied: NodeSupplied) -> None:
    """Keep what the scheduler places on the node, unless billing holds a later judgement:
    one of a higher ``sequence`` (the same one is the same supply, said again), or, between
    two without one (a scheduler from before it), of a later ``judged_at``; one with a
    sequence is later than any without."""
    await conn.execute(
        """INSERT INTO waste_node_supply (node_id, gpu_flavor, gpu_count, judged_at, sequence)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (node_id) DO UPDATE
               SET gpu_flavor = EXCLUDED.gpu_flavor, gpu_count = EXCLUDED.gpu_count,
                   judged_at = EXCLUDED.judged_at, sequence = EXCLUDED.sequence
               WHERE CASE WHEN EXCLUDED.sequence IS NULL
                          THEN waste_node_supply.sequence IS NULL
                               AND EXCLUDED.judged_at > waste_node_supply.judged_at
                          ELSE EXCLUDED.sequence >= coalesce(waste_node_supply.sequence, 0)
                     END""",
        supplied.node_id,
        supplied.gpu_flavor,
        supplied.gpu_count,
        supplied.judged_at,
        supplied.sequence,
    )


async def record_heartbeat(conn: asyncpg.Connection, beat: RunnerHeartbeat) -> bool:
    """Remember the node's heartbeat; when the previous one is at most ``HEARTBEAT_GAP``
    earlier, some of its GPUs were held by none of the allocations billing's records put on
    it between the two, nor by one of its allocations either heartbeat names (``_HELD``),
    and a job of its flavor was waiting, record the interval between them as unallocated
    (True).

    The node's GPUs and flavor are what the scheduler places on (``record_supply``: its
    claim capped by the node inventory), never more GPUs than the heartbeat says, and which
    of them are held is the platform's word (its grants and releases), never the node's: a
    node's own word, on its GPUs or on what it runs, would let it inflate the platform's
    unallocated GPUs. The node's word may only count less: an allocation of the node it
    names holds its GPUs even after its release (its job is still stopping: it is neither
    billed then nor free), and an interval whose heartbeats name an allocation billing has
    not seen granted counts nothing (how many GPUs it holds is not known yet).
    Before billing has heard the scheduler's word on the node, or for a node with no
    flavor, nothing is counted."""
    previous = await conn.fetchrow(
        "SELECT gpu_flavor, gpu_count, sent_at, running_allocations FROM waste_nodes "
        "WHERE node_id = $1 FOR UPDATE",
        beat.node_id,
    )
    await conn.execute(
        """INSERT INTO waste_nodes (node_id, gpu_flavor, gpu_count, sent_at, running_allocations)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (node_id) DO UPDATE
               SET gpu_flavor = EXCLUDED.gpu_flavor, gpu_count = EXCLUDED.gpu_count,
                   sent_at = EXCLUDED.sent_at,
                   running_allocations = EXCLUDED.running_allocations
               WHERE EXCLUDED.sent_at > waste_nodes.sent_at""",
        beat.node_id,
        beat.gpu_flavor,
        beat.gpu_count,
        beat.sent_at,
        beat.running_allocations,
    )
    if previous is None or not timedelta(0) < beat.sent_at - previous["sent_at"] <= HEARTBEAT_GAP:
        return False
    # What the node ran at either end of the interval holds its GPUs throughout it.
    running = sorted({*previous["running_allocations"], *beat.running_allocations})
    named = await conn.fetchval(
        "SELECT count(*) FROM announced_allocations WHERE allocation_id = ANY($1::text[])",
        running,
    )
    if named < len(running):
        return False  # an allocation billing has not seen granted yet: how many GPUs is unknown
    supply = await conn.fetchrow(
        "SELECT gpu_flavor, gpu_count FROM waste_node_supply WHERE node_id = $1", beat.node_id
    )
    if supply is None or not supply["gpu_flavor"]:
        return False  # the scheduler has not said what it places on the node, or it places nothing
    flavor = supply["gpu_flavor"]
    gpus = min(beat.gpu_count, supply["gpu_count"])
    held = await conn.fetch(_HELD, beat.node_id, previous["sent_at"], beat.sent_at, running)
    free = gpus - sum(h["gpus"] for h in held)
    if free <= 0:
        return False
    await _lock_waiting(conn, flavor)  # then read: a grant or end committed is seen
    if not await conn.fetchval(_WAITING, flavor, beat.sent_at):
        return False
    await conn.execute(
        """INSERT INTO waste_unallocated (node_id, gpu_flavor, free_gpus, started_at, ended_at,
                                          held)
           VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING""",
        beat.node_id,
        flavor,
        free,
        previous["sent_at"],
        beat.sent_at,
        sorted(h["allocation_id"] for h in held),
    )
    return True


async def hold(
    conn: asyncpg.Connection,
    allocation_id: str,
    node_id: str,
    gpus: int,
    start: datetime,
    end: datetime | None,
) -> None:
    """The allocation held ``gpus`` of ``node_id`` over ``[start, end)`` (``end`` None: from
    ``start`` on), as billing learns only now: a grant handled after heartbeats of its node
    (another subject: any order), a bill amended to a later end. Each unallocated interval
    of the node that overlaps it and did not count it held (``held``) counts it now, as
    ``record_heartbeat`` would have: its free GPUs less these, the interval gone when none
    is left. So GPUs billed to a job are never counted free at the same time, whichever
    fact came first, or when both are handled at once (the node's row is locked, as a
    heartbeat locks it). Intervals recorded before billing kept ``held`` (NULL) stay as they
    were."""
    if gpus <= 0:
        return
    # The node's heartbeat lock (``record_heartbeat``): a heartbeat of the node handled at
    # once in another replica either commits its interval first, which the statements
    # below then see, or waits and then reads this allocation held. Holds of the node wait
    # for each other too, so none takes GPUs out of an interval another left too few.
    await conn.execute("SELECT 1 FROM waste_nodes WHERE node_id = $1 FOR UPDATE", node_id)
    # An interval is at most HEARTBEAT_GAP long: one that ends after ``start`` starts after
    # ``start - HEARTBEAT_GAP``, which finds the node's few by its key.
    overlapping = (
        "node_id = $1 AND started_at > $4 AND ended_at > $5 "
        "AND ($6::timestamptz IS NULL OR started_at < $6) "
        "AND held IS NOT NULL AND NOT ($2 = ANY(held))"
    )
    args = (node_id, allocation_id, gpus, start - HEARTBEAT_GAP, start, end)
    await conn.execute(
        f"DELETE FROM waste_unallocated WHERE {overlapping} AND free_gpus <= $3", *args
    )
    await conn.execute(
        "UPDATE waste_unallocated SET free_gpus = free_gpus - $3, "
        f"held = array_append(held, $2) WHERE {overlapping}",
        *args,
    )


async def _lock_waiting(conn: asyncpg.Connection, flavor: str) -> None:
    """Take the flavor's waiting lock (transaction scope): a heartbeat of any node of the
    flavor takes it before it reads whether a job waits (``_WAITING``) and records its
    interval, and ``recheck_waiting`` before it judges the intervals again. So a grant, a
    job's end or a refusal handled at once with a heartbeat of another node of its flavor
    (in another replica) either commits first, and the heartbeat's read sees it, or waits
    for the heartbeat's commit, and its recheck sees the interval. Without it each read the
    database without the other's change: the heartbeat found the job waiting, the recheck
    found no interval to take back, and GPUs counted free while that job waited were
    counted though it held its grant (the figure erred high). Heartbeats of one node wait
    for each other on its row (``record_heartbeat``), not on this. Where one event takes
    both, it takes the node's row lock first (a heartbeat, a grant's ``hold``), so two
    events each in its own transaction never deadlock on them."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('billing:waiting:' || $1, 0))", flavor
    )


async def recheck_waiting(conn: asyncpg.Connection, flavor: str, since: datetime) -> None:
    """Judge again whether a job of ``flavor`` was waiting at each heartbeat from ``since``
    on that found one (``_WAITING_AT``), now that billing knows more: a grant, a job's end or
    a refusal handled after those heartbeats (another subject: any order), or at once with
    them in another replica (``_lock_waiting``). An unallocated interval whose heartbeat no
    job was waiting at is gone. (The other way, a job billing learns of later, no interval
    is made: what a heartbeat did not record is not known.)"""
    await _lock_waiting(conn, flavor)
    await conn.execute(
        "DELETE FROM waste_unallocated w WHERE w.ended_at >= $2 AND w.gpu_flavor = $1 "
        f"AND NOT {_WAITING_AT.format(flavor='$1', at='w.ended_at')}",
        flavor,
        since,
    )


# --- reading --------------------------------------------------------------------------------

_ALLOCATIONS = f"""
SELECT a.allocation_id, a.job_id, a.team, a.project, a.user_name, a.queue, a.gpu_flavor,
       a.gpus, a.granted_at, a.attempt, u.ended_at, u.outcome,
       coalesce(g.priority, j.priority) AS priority,
       r.gpu_utilization_mean, r.data_wait_fraction_mean,
       {rollups.FAILURE_KIND} AS failure_kind, {rollups.LAST_CHECKPOINT} AS last_checkpoint
FROM announced_allocations a
LEFT JOIN usage_ledger u USING (allocation_id)
LEFT JOIN waste_grants g USING (allocation_id)
LEFT JOIN waste_jobs j ON j.job_id = a.job_id
LEFT JOIN waste_run_reports r ON {rollups.OWN_REPORT}
"""


_UNMEASURED = """
SELECT a.allocation_id, a.job_id, a.team, a.project, a.user_name, a.queue, a.gpu_flavor,
       a.gpus, a.granted_at, a.attempt, u.ended_at, u.outcome,
       coalesce(g.priority, j.priority) AS priority, NULL::numeric AS gpu_utilization_mean,
       NULL::numeric AS data_wait_fraction_mean, NULL::text AS failure_kind,
       NULL::timestamptz AS last_checkpoint
FROM announced_allocations a
LEFT JOIN usage_ledger u USING (allocation_id)
LEFT JOIN waste_grants g USING (allocation_id)
LEFT JOIN waste_jobs j ON j.job_id = a.job_id
"""
"""``_ALLOCATIONS`` without what the runner measured and the checkpoints."""


_OPEN_JOBS = """SELECT j.job_id FROM waste_jobs j LEFT JOIN waste_job_ends e USING (job_id)
                WHERE j.submitted_at < $1 AND (e.ended_at IS NULL OR e.ended_at > $2)"""
"""Jobs submitted before the range's end that had not ended by its start: their waits may
fall in the range."""


async def facts(
    conn: asyncpg.Connection,
    start: datetime,
    end: datetime,
    team: str | None,
    measured: bool = True,
) -> tuple[list[Allocation], list[JobWaits]]:
    """The allocations granted before ``end`` and not released before ``start`` (of
    ``team``), and every job (of any team) whose waits may fall in ``[start, end)``, with
    all its allocations; in two queries. ``measured=False``: without what the runner
    measured and the checkpoints (the waits and holding need neither)."""
    rows = await conn.fetch(
        f"SELECT j.*, e.ended_at FROM waste_jobs j LEFT JOIN waste_job_ends e USING (job_id) "
        f"WHERE j.job_id IN ({_OPEN_JOBS})",
        end,
        start,
    )
    everything = [
        allocation_of(r)
        for r in await conn.fetch(
            f"{_ALLOCATIONS if measured else _UNMEASURED} WHERE a.job_id IN ({_OPEN_JOBS}) "
            "OR (a.granted_at < $1 AND (u.ended_at IS NULL OR u.ended_at > $2))",
            end,
            start,
        )
    ]
    held = [
        a
        for a in everything
        if a.granted_at < end
        and (a.ended_at is None or a.ended_at > start)
        and (team is None or a.owner.team == team)
    ]
    by_job: dict[str, list[Allocation]] = {}
    for a in everything:
        by_job.setdefault(a.owner.job or "", []).append(a)
    jobs = [
        JobWaits(
            owner=Owner(
                r["team"], r["project"], r["user_name"], None, r["gpu_flavor"], r["job_id"]
            ),
            gpus=r["gpus"],
            priority=r["priority"],
            submitted_at=r["submitted_at"],
            allocations=by_job.get(r["job_id"], []),
            ended_at=r["ended_at"],
        )
        for r in rows
    ]
    return held, jobs


async def unallocated(conn: asyncpg.Connection, start: datetime, end: datetime) -> list[Piece]:
    """Intervals of free GPUs while a job of their flavor waited, overlapping the range;
    owned by no team (``Owner`` with only the flavor)."""
    rows = await conn.fetch(
        "SELECT * FROM waste_unallocated WHERE started_at < $1 AND ended_at > $2", end, start
    )
    return [
        Piece(
            "unallocated_gpus",
            Owner(None, None, None, None, r["gpu_flavor"], None),
            r["gpu_flavor"],
            r["free_gpus"],
            r["started_at"],
            r["ended_at"],
        )
        for r in rows
    ]


async def job_ends(
    conn: asyncpg.Connection, start: datetime, end: datetime, team: str | None
) -> list[JobEnd]:
    """Jobs that ended in ``[start, end)`` (of ``team``), with their owner and last queue."""
    rows = await conn.fetch(
        """SELECT e.job_id, e.outcome, e.ended_at,
                  coalesce(j.team, l.team) AS team, coalesce(j.project, l.project) AS project,
                  coalesce(j.user_name, l.user_name) AS user_name,
                  coalesce(j.gpu_flavor, l.gpu_flavor) AS gpu_flavor, l.queue
           FROM waste_job_ends e
           LEFT JOIN waste_jobs j USING (job_id)
           LEFT JOIN LATERAL (SELECT a.team, a.project, a.user_name, a.gpu_flavor, a.queue
                              FROM announced_allocations a WHERE a.job_id = e.job_id
                              ORDER BY a.granted_at DESC LIMIT 1) l ON true
           WHERE e.ended_at >= $1 AND e.ended_at < $2""",
        start,
        end,
    )
    out = []
    for r in rows:
        if r["team"] is None or (team is not None and r["team"] != team):
            continue
        owner = Owner(
            r["team"], r["project"], r["user_name"], r["queue"], r["gpu_flavor"], r["job_id"]
        )
        out.append(JobEnd(owner, r["outcome"], r["ended_at"]))
    return out
