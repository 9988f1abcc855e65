"""HTTP schemas of the scheduler's operator API (never published as events), and the
converters from rows to them.

The queue view holds no user data beyond job ids, team names and node names, but it shows
the whole cluster across teams: it is an operator endpoint and must not be exposed publicly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class NodeView(_Schema):
    node_id: str
    hostname: str
    gpu_flavor: str
    status: str
    gpu_count: int
    free_gpus: list[int]
    """Indices free for new work (none on a LOST node)."""
    used_gpus: dict[int, str]
    """GPU index -> id of the job leasing it."""
    last_heartbeat: datetime


class AllocationView(_Schema):
    allocation_id: str
    job_id: str
    team: str
    node_id: str
    gpu_indices: list[int]
    epoch: int
    attempt: int
    status: str
    job_status: str
    granted_at: datetime
    started_at: datetime | None


class PendingView(_Schema):
    job_id: str
    team: str
    gpu_flavor: str
    gpus: int
    attempt: int
    position: int | None
    """1-based place among the waiting jobs of its flavor."""
    reason: str | None
    submitted_at: datetime


class QueueView(_Schema):
    nodes: list[NodeView]
    allocations: list[AllocationView]
    """Live allocations (granted or running)."""
    pending: list[PendingView]
    """Queued jobs in queue order."""


def queue_view(
    nodes: Sequence[Mapping[str, Any]],
    allocations: Sequence[Mapping[str, Any]],
    pending: Sequence[Mapping[str, Any]],
) -> QueueView:
    used: dict[str, dict[int, str]] = {}
    for a in allocations:
        for index in a["gpu_indices"]:
            used.setdefault(a["node_id"], {})[index] = a["job_id"]
    return QueueView(
        nodes=[_node(n, used.get(n["node_id"], {})) for n in nodes],
        allocations=[
            AllocationView(
                allocation_id=str(a["allocation_id"]),
                job_id=a["job_id"],
                team=a["team"],
                node_id=a["node_id"],
                gpu_indices=list(a["gpu_indices"]),
                epoch=a["epoch"],
                attempt=a["attempt"],
                status=a["status"],
                job_status=a["job_status"],
                granted_at=a["granted_at"],
                started_at=a["started_at"],
            )
            for a in allocations
        ],
        pending=[
            PendingView(
                job_id=p["job_id"],
                team=p["team"],
                gpu_flavor=p["gpu_flavor"],
                gpus=p["gpus"],
                attempt=p["attempt"],
                position=p["pending_position"],
                reason=p["pending_reason"],
                submitted_at=p["submitted_at"],
            )
            for p in pending
        ],
    )


def _node(row: Mapping[str, Any], used: dict[int, str]) -> NodeView:
    ready = row["status"] == "READY"
    return NodeView(
        node_id=row["node_id"],
        hostname=row["hostname"],
        gpu_flavor=row["gpu_flavor"],
        status=row["status"],
        gpu_count=row["gpu_count"],
        free_gpus=[i for i in range(row["gpu_count"]) if i not in used] if ready else [],
        used_gpus=dict(sorted(used.items())),
        last_heartbeat=row["last_heartbeat"],
    )
