"""A runner's report that comes before the event it follows waits for it, instead of being
lost.

The job view judges a runner's report (``job.started``, ``job.succeeded``, ``job.failed``,
``job.preempted``) against what it has heard of the allocation: a report about an
allocation whose grant it has not recorded is ignored, and so is a ``job.succeeded`` of an
allocation that has not started (SCHEDULED -> SUCCEEDED is not a move). In ordinary
operation the stream keeps a grant ahead of its reports, and a runner's reports in the order
it said them. Not always after NATS lost its store: the scheduler's outbox replays its grants
into the new stream while runners publish into it (a grant being handled across the loss, a
report being retried across it), and nothing orders the two, nor a retried report against
the same allocation's reports said again after the replayed grant. A report ignored then was
lost for good: the inbox had recorded its id, and saying it again carries the same
``Nats-Msg-Id``, which JetStream drops as a duplicate. A job stayed SCHEDULED (a success
before its start: RUNNING) while the scheduler had it SUCCEEDED.

A ``job.progress`` waits the same way (``handlers``): it is applied only for an allocation
granted to its very job, since any runner may say one about any job id.

Contract (inside the handler's transaction, the job's row locked):
- ``awaited(event, source, status, holds)`` names the allocation a report must wait for, or
  None: a report from anyone but the scheduler (whose events follow its grants in its
  outbox's order) about an allocation of a job that is not terminal, when the allocation's
  grant is not recorded (``granted``) or, for a ``job.succeeded``, when the job is SCHEDULED
  on that very allocation (its ``job.started`` has not come).
- ``keep`` stores such a report (the whole event); ``take`` hands back, in arrival order,
  and deletes the reports kept for an allocation. The handler takes them right after it
  applied the allocation's grant or start and judges each as if it had come then (one that
  still has to wait is kept again).
- At most ``MAX_KEPT_PER_NODE`` progress reports, and as many others, from one node wait
  for one job (counted apart: a runner says a progress report every second, and those must
  not crowd out the job's start, checkpoints and end while a grant waits): a report beyond
  them is refused for good (``Reject``: dead-lettered with the reason, where an operator
  can redrive it), so a runner that reports allocations that will never be granted cannot
  grow the table without bound. The node is the one the report names (``node_id``), which
  the bus vouches for (``shared.events.trust``: a runner's user publishes its reports only
  on its own node's subjects); one from before the field existed counts with the others
  that name none. Counted per job alone, any runner node, with its own credentials, could
  fill another team's job's room with reports of allocations never to be granted, and the
  job's own early reports were refused until it ended; a node now fills only its own share,
  and the node the job is granted on always has its own. A job's kept reports are so at
  most ``2 * MAX_KEPT_PER_NODE`` for each node that has a runner's NATS user, and as many
  naming none. In a real loss a job's reports waiting at once are a few per allocation.
- A job's kept reports are deleted when the job ends (nothing moves it any more), by the
  statement that writes its terminal status (``repository.set_finished``, the only write of
  one in this service), so every path to an end forgets them, not only the events that end
  a job today. The table holds only reports of jobs still under way (one whose grant never
  comes, e.g. aged out of the stream, stays until then).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from trainyard_platform.services.submission.domain import (
    SCHEDULER_SOURCE,
    JobStatus,
    LifecycleEvent,
)
from trainyard_platform.shared.bus import Reject
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    JobFailed,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.events.trust import speaker_of

REPORTS = (JobStarted, JobSucceeded, JobFailed, JobPreempted)
"""A runner's reports on one of its allocations that move a job's status."""

MAX_KEPT_PER_NODE = 32
"""Most reports of one kind (progress, or the others) kept waiting for one job from one node
(see the module docstring)."""


@dataclass(frozen=True)
class Awaited:
    """What a report waits for: ``what`` happens to ``allocation_id`` (kept under it)."""

    allocation_id: str
    what: str


async def awaited(
    conn: asyncpg.Connection,
    event: LifecycleEvent,
    source: str,
    status: JobStatus,
    holds: str | None,
) -> Awaited | None:
    """What ``event`` (sent by ``source``, about a job in ``status`` holding the allocation
    ``holds``) must wait for, or None when it is judged now."""
    if not isinstance(event, REPORTS) or source == SCHEDULER_SOURCE or status.is_terminal:
        return None
    allocation_id = event.allocation_id
    if not allocation_id:
        return None
    if not await granted(conn, allocation_id):
        return Awaited(allocation_id, "grant")
    if isinstance(event, JobSucceeded) and status is JobStatus.SCHEDULED and holds == allocation_id:
        return Awaited(allocation_id, "start")
    return None


async def granted(conn: asyncpg.Connection, allocation_id: str) -> bool:
    """Whether the view has recorded ``allocation_id``'s grant."""
    return bool(
        await conn.fetchval(
            "SELECT true FROM job_allocations WHERE allocation_id = $1", allocation_id
        )
    )


async def keep(
    conn: asyncpg.Connection, envelope: Envelope[Payload], job_id: str, allocation_id: str
) -> None:
    """Store ``envelope`` until ``take(allocation_id)``; ``Reject`` when ``job_id`` already
    has ``MAX_KEPT_PER_NODE`` reports of its kind from the node that says it
    (``trust.speaker_of``) waiting (the caller holds the job's row lock, so the count cannot
    race). Progress reports and the others are counted apart: a runner says a
    ``job.progress`` every second, so a grant that waited half a minute (held by a replica
    that died, given back after ``ack_wait``) filled the job's room with them, and the
    reports after, its start, checkpoints and end among them, were refused. Nodes are
    counted apart so that no node can take another's room (module docstring)."""
    progress = isinstance(envelope.data, JobProgress)
    node = speaker_of(envelope.data)
    waiting = await conn.fetchval(
        "SELECT count(*) FROM early_reports "
        "WHERE job_id = $1 AND progress = $2 AND node_id IS NOT DISTINCT FROM $3",
        job_id,
        progress,
        node,
    )
    if waiting >= MAX_KEPT_PER_NODE:
        kind = "progress reports" if progress else "reports other than progress"
        raise Reject(
            f"allocation_id: {allocation_id!r} of job {job_id!r} is not granted, and "
            f"{waiting} {kind} of this job from node {node!r} already wait for grants (at "
            f"most {MAX_KEPT_PER_NODE} per node); refused, not kept"
        )
    await conn.execute(
        "INSERT INTO early_reports (allocation_id, job_id, event, progress, node_id) "
        "VALUES ($1, $2, $3, $4, $5)",
        allocation_id,
        job_id,
        envelope.to_json(),
        progress,
        node,
    )


async def take(conn: asyncpg.Connection, allocation_id: str) -> list[Envelope[Payload]]:
    """Delete and return the reports kept for ``allocation_id``, in the order they came."""
    rows = await conn.fetch(
        "DELETE FROM early_reports WHERE allocation_id = $1 RETURNING seq, event", allocation_id
    )
    return [parse_envelope(bytes(r["event"])) for r in sorted(rows, key=lambda r: r["seq"])]
