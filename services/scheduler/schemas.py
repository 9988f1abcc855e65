"""HTTP schemas of the scheduler's queue view (never published as events), and the converter
from rows to it.

``GET /v1/queue`` shows nodes (free and used GPUs), live allocations, and per queue: its
quota use and borrowing per flavor, its running jobs, and its pending jobs in order with
position, reason, blocking, suggestion and estimated start (as last published); per cohort,
the size of its shared pool of lendable quota and how much of it is in use. It holds no
user data beyond job ids, team and node names, but it shows the whole cluster across teams:
it is an operator endpoint and must not be exposed publicly. It shows each queue's first
``PENDING_SHOWN`` waiting jobs and how many wait: a backlog of any size keeps its answer
bounded; ``GET /v1/queue/{name}/pending`` pages through all of them (``shared.paging``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.services.scheduler.convert import queues_from_rows, stopping_holder
from trainyard_platform.services.scheduler.policy.quota import QuotaBook

Row = Mapping[str, Any]
PENDING_SHOWN = 100
"""Waiting jobs ``GET /v1/queue`` shows per queue (the head of its line)."""


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class CordonView(_Schema):
    reason: str
    by: str
    """Who cordoned it: the operator, or ``scheduler`` for an automatic cordon."""
    since: datetime
    until: datetime | None
    """When an automatic cordon ends by itself; None: until an operator uncordons."""


class NodeCordonView(_Schema):
    """What ``POST /v1/admin/nodes/{node_id}/cordon`` and ``.../uncordon`` answer."""

    node_id: str
    cordon: CordonView | None
    """None: the node takes new work."""


class NodeClaimView(_Schema):
    """What a node's latest heartbeat claims (``NodeView.reported``)."""

    gpu_flavor: str
    gpu_count: int
    topology: str


class NodeView(_Schema):
    node_id: str
    hostname: str
    gpu_flavor: str
    """Empty for a node the node inventory does not declare while it is required: it has no
    flavor until an operator declares it (what it claims is in ``reported``)."""
    topology: str
    status: str
    gpu_count: int
    free_gpus: list[int]
    """Indices free for new work (none on a LOST or cordoned node)."""
    used_gpus: dict[int, str]
    """GPU index -> id of the job leasing it; for a GPU still leased to an ended allocation
    while its runner stops the job, ``<job id> (stopping: its GPUs are being freed)``."""
    last_heartbeat: datetime
    cordon: CordonView | None = None
    """Set while the node is cordoned: no new allocation is placed on it."""
    retired_at: datetime | None = None
    """When an operator retired the node (listed only on request); None: it is not."""
    capped: list[str] = Field(default_factory=list)
    """What the node inventory did not grant of its latest heartbeat's claim (``undeclared``,
    ``gpu_flavor``, ``gpu_count``, ``topology``; ``inventory``): ``gpu_count`` and
    ``gpu_flavor`` above are what it is placed on. Empty: it got what it claims."""
    reported: NodeClaimView | None = None
    """What its latest heartbeat claims, when the node inventory capped it; None: it got
    what it claims."""


class AllocationView(_Schema):
    allocation_id: str
    job_id: str
    team: str
    queue: str
    node_id: str
    gpu_indices: list[int]
    epoch: int
    attempt: int
    status: str
    job_status: str
    gang_id: str
    granted_at: datetime
    started_at: datetime | None
    notice_at: datetime | None
    """When a preemption notice was sent (its GPUs are revoked after the grace)."""


class QuotaUsage(_Schema):
    flavor: str
    nominal: int | None
    """None for an implicit queue (no limit but the cluster)."""
    borrowing_limit: int | None
    lending_limit: int | None
    used: int
    """GPUs of the flavor its jobs hold now."""
    borrowed: int
    """Of ``used``, how many are beyond its nominal quota (lent by its cohort)."""


class RunningJobView(_Schema):
    job_id: str
    gpu_flavor: str
    gpus: int
    priority: str
    status: str
    nodes: dict[str, list[int]]
    granted_at: datetime
    started_at: datetime | None
    borrowed: bool
    last_checkpoint_at: datetime | None
    notice_at: datetime | None
    notice_reason: str | None


class PendingJobView(_Schema):
    job_id: str
    gpu_flavor: str
    gpus: int
    priority: str
    attempt: int
    position: int | None
    """1-based place among the waiting jobs of its queue (None until the first pass)."""
    reason: str | None
    blocking: str | None
    suggestion: str | None
    estimated_start: datetime | None
    submitted_at: datetime
    eligible_at: datetime | None = None
    """Backing off after a failure: no pass places it before this time (None: no back-off)."""


class QueueStateView(_Schema):
    name: str
    team: str
    cohort: str | None
    weight: float
    implicit: bool
    quotas: list[QuotaUsage]
    running: list[RunningJobView]
    pending: list[PendingJobView]
    """The first ``PENDING_SHOWN`` waiting jobs, in queue order (every one:
    ``GET /v1/queue/{name}/pending``, a page at a time)."""
    waiting: int
    """How many jobs wait in the queue in all (``pending`` shows the first of them)."""


class CohortPoolView(_Schema):
    flavor: str
    size: int
    """The nominal quota its queues lend while they do not use it (the shared pool)."""
    used: int
    """How much of the pool is in use, by its owners or by borrowers."""


class CohortStateView(_Schema):
    name: str
    queues: list[str]
    pools: list[CohortPoolView]


class QueueView(_Schema):
    nodes: list[NodeView]
    allocations: list[AllocationView]
    """Live allocations (granted or running)."""
    queues: list[QueueStateView]
    cohorts: list[CohortStateView]


def queue_view(
    nodes: Sequence[Row],
    allocations: Sequence[Row],
    pending: Sequence[Row],
    queues: Sequence[Row],
    quotas: Sequence[Row],
    stopping: Sequence[Row] = (),
) -> QueueView:
    """The operators' view; ``stopping``: GPUs still leased to ended allocations while
    their runners stop them (``repository.stopping_leases``), used, not free."""
    used: dict[str, dict[int, str]] = {}
    for a in allocations:
        for index in a["gpu_indices"]:
            used.setdefault(a["node_id"], {})[index] = a["job_id"]
    for lease in stopping:
        used.setdefault(lease["node_id"], {})[lease["gpu_index"]] = stopping_holder(lease["job_id"])
    totals: dict[str, int] = {}
    for n in nodes:
        if n["status"] == "READY":
            totals[n["gpu_flavor"]] = totals.get(n["gpu_flavor"], 0) + n["gpu_count"]
    book = QuotaBook(queues_from_rows(queues, quotas, totals))
    for a in allocations:
        book.add(a["queue"], a["gpu_flavor"], len(a["gpu_indices"]))
    return QueueView(
        nodes=[_node(n, used.get(n["node_id"], {})) for n in nodes],
        allocations=[_allocation(a) for a in allocations],
        queues=[_queue(q, quotas, allocations, pending, book) for q in queues],
        cohorts=_cohorts(queues, quotas, book),
    )


def cordon_view(row: Row) -> CordonView | None:
    """The node row's cordon (columns ``cordoned_at``, ``cordon_reason``, ``cordoned_by``,
    ``cordoned_until``), or None when it is not cordoned."""
    if row.get("cordoned_at") is None:
        return None
    return CordonView(
        reason=row["cordon_reason"],
        by=row["cordoned_by"],
        since=row["cordoned_at"],
        until=row["cordoned_until"],
    )


def _node(row: Row, used: dict[int, str]) -> NodeView:
    cordon = cordon_view(row)
    ready = row["status"] == "READY" and cordon is None
    capped = list(row.get("capped") or [])
    return NodeView(
        node_id=row["node_id"],
        hostname=row["hostname"],
        gpu_flavor=row["gpu_flavor"],
        topology=row["topology"],
        status=row["status"],
        gpu_count=row["gpu_count"],
        free_gpus=[i for i in range(row["gpu_count"]) if i not in used] if ready else [],
        used_gpus=dict(sorted(used.items())),
        last_heartbeat=row["last_heartbeat"],
        cordon=cordon,
        retired_at=row.get("retired_at"),
        capped=capped,
        reported=NodeClaimView(
            gpu_flavor=row["reported_flavor"],
            gpu_count=row["reported_gpu_count"],
            topology=row["reported_topology"],
        )
        if capped
        else None,
    )


def _allocation(a: Row) -> AllocationView:
    return AllocationView(
        allocation_id=str(a["allocation_id"]),
        job_id=a["job_id"],
        team=a["team"],
        queue=a["queue"],
        node_id=a["node_id"],
        gpu_indices=list(a["gpu_indices"]),
        epoch=a["epoch"],
        attempt=a["attempt"],
        status=a["status"],
        job_status=a["job_status"],
        gang_id=str(a["gang_id"]),
        granted_at=a["granted_at"],
        started_at=a["started_at"],
        notice_at=a["notice_at"],
    )


def _queue(
    q: Row,
    quotas: Sequence[Row],
    allocations: Sequence[Row],
    pending: Sequence[Row],
    book: QuotaBook,
) -> QueueStateView:
    name = q["name"]
    mine = [p for p in pending if p["queue"] == name]
    own = {r["flavor"]: r for r in quotas if r["queue"] == name}
    members = [a for a in allocations if a["queue"] == name]
    flavors = sorted(set(own) | {a["gpu_flavor"] for a in members})
    usage = []
    for flavor in flavors:
        quota = own.get(flavor)
        usage.append(
            QuotaUsage(
                flavor=flavor,
                nominal=None if q["implicit"] else (quota["nominal"] if quota else 0),
                borrowing_limit=quota["borrowing_limit"] if quota else None,
                lending_limit=quota["lending_limit"] if quota else None,
                used=book.used(name, flavor),
                borrowed=0 if q["implicit"] else book.borrowed(name, flavor),
            )
        )
    return QueueStateView(
        name=name,
        team=q["team"],
        cohort=q["cohort"],
        weight=q["weight"],
        implicit=q["implicit"],
        quotas=usage,
        running=_running(members),
        pending=[pending_view(p) for p in mine],
        waiting=mine[0]["waiting"] if mine else 0,
    )


def _running(members: Sequence[Row]) -> list[RunningJobView]:
    by_job: dict[str, list[Row]] = {}
    for a in members:
        by_job.setdefault(a["job_id"], []).append(a)
    views = []
    for job_id, gang in by_job.items():
        first = gang[0]
        checkpoints = [a["last_checkpoint_at"] for a in gang if a["last_checkpoint_at"]]
        started = [a["started_at"] for a in gang if a["started_at"]]
        views.append(
            RunningJobView(
                job_id=job_id,
                gpu_flavor=first["gpu_flavor"],
                gpus=sum(len(a["gpu_indices"]) for a in gang),
                priority=first["priority_class"],
                status=first["job_status"],
                nodes={a["node_id"]: list(a["gpu_indices"]) for a in gang},
                granted_at=min(a["granted_at"] for a in gang),
                started_at=min(started) if started else None,
                borrowed=any(a["borrowed"] for a in gang),
                last_checkpoint_at=max(checkpoints) if checkpoints else None,
                notice_at=first["notice_at"],
                notice_reason=first["notice_reason"],
            )
        )
    return views


def pending_view(p: Row) -> PendingJobView:
    return PendingJobView(
        job_id=p["job_id"],
        gpu_flavor=p["gpu_flavor"],
        gpus=p["gpus"],
        priority=p["priority_class"],
        attempt=p["attempt"],
        position=p["pending_position"],
        reason=p["pending_reason"],
        blocking=p["pending_blocking"],
        suggestion=p["pending_suggestion"],
        estimated_start=p["pending_estimated_start"],
        submitted_at=p["submitted_at"],
        eligible_at=p.get("eligible_at"),
    )


def _cohorts(
    queues: Sequence[Row], quotas: Sequence[Row], book: QuotaBook
) -> list[CohortStateView]:
    members: dict[str, list[str]] = {}
    for q in queues:
        if q["cohort"] is not None:
            members.setdefault(q["cohort"], []).append(q["name"])
    views = []
    for cohort, names in sorted(members.items()):
        flavors = sorted({r["flavor"] for r in quotas if r["queue"] in names})
        pools = []
        for flavor in flavors:
            size, used = book.pool(cohort, flavor)
            pools.append(CohortPoolView(flavor=flavor, size=size, used=used))
        views.append(CohortStateView(name=cohort, queues=sorted(names), pools=pools))
    return views
