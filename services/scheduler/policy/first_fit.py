"""The walking skeleton's placement policy: first fit over one flavor, no quotas.

The service still calls this while the full policy (``services.scheduler.policy.schedule``
over ``policy.model``) waits to be wired in; its types are the legacy ones re-exported by
the package.

Contract of ``first_fit``:
- Jobs are considered in queue order (submit time, then arrival sequence); nodes in
  ``node_id`` order. The input order of either does not change the result (deterministic).
- A job goes to the first ready node of its flavor with at least ``gpus`` free GPUs and gets
  that node's lowest free indices. Gang placement: all of a job's GPUs on one node, or none.
- GPUs given to a job earlier in the same pass are in use for the jobs after it.
- Every job left waiting gets a human reason and its 1-based position among the waiting jobs
  of its flavor (jobs of other flavors never stand in its way).

No I/O here: the service loads a ``Snapshot``, calls the policy, and applies the decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class NodeState:
    """A ready node and which of its GPUs are leased, to which job."""

    node_id: str
    gpu_flavor: str
    gpu_count: int
    used: Mapping[int, str] = field(default_factory=dict)
    """GPU index -> id of the job holding it."""


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs."""

    job_id: str
    team: str
    gpu_flavor: str
    gpus: int
    submitted_at: datetime
    seq: int
    """Arrival order at the scheduler; breaks ties between equal submit times."""


@dataclass(frozen=True)
class Snapshot:
    """Supply (ready nodes) and demand (queued jobs) at one moment."""

    nodes: tuple[NodeState, ...]
    queue: tuple[QueuedJob, ...]


@dataclass(frozen=True)
class Placement:
    job_id: str
    node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Waiting:
    job_id: str
    reason: str
    position: int


@dataclass(frozen=True)
class Decisions:
    placements: tuple[Placement, ...]
    waiting: tuple[Waiting, ...]


def first_fit(snapshot: Snapshot) -> Decisions:
    """Place queued jobs first-fit (see the module docstring)."""
    nodes = sorted(snapshot.nodes, key=lambda n: n.node_id)
    used: dict[str, dict[int, str]] = {n.node_id: dict(n.used) for n in nodes}
    placements: list[Placement] = []
    waiting: list[Waiting] = []
    positions: dict[str, int] = {}
    for job in queue_order(snapshot.queue):
        candidates = [n for n in nodes if n.gpu_flavor == job.gpu_flavor]
        placement = _place(job, candidates, used)
        if placement is not None:
            placements.append(placement)
            for index in placement.gpu_indices:
                used[placement.node_id][index] = job.job_id
            continue
        positions[job.gpu_flavor] = positions.get(job.gpu_flavor, 0) + 1
        waiting.append(
            Waiting(job.job_id, _reason(job, candidates, used), positions[job.gpu_flavor])
        )
    return Decisions(tuple(placements), tuple(waiting))


def queue_order(queue: tuple[QueuedJob, ...]) -> list[QueuedJob]:
    return sorted(queue, key=lambda j: (j.submitted_at, j.seq, j.job_id))


def _free(node: NodeState, used: Mapping[str, Mapping[int, str]]) -> list[int]:
    taken = used[node.node_id]
    return [i for i in range(node.gpu_count) if i not in taken]


def _place(
    job: QueuedJob, candidates: list[NodeState], used: Mapping[str, Mapping[int, str]]
) -> Placement | None:
    if job.gpus < 1:
        return None
    for node in candidates:
        free = _free(node, used)
        if len(free) >= job.gpus:
            return Placement(job.job_id, node.node_id, tuple(free[: job.gpus]))
    return None


def _reason(
    job: QueuedJob, candidates: list[NodeState], used: Mapping[str, Mapping[int, str]]
) -> str:
    flavor = job.gpu_flavor
    if job.gpus < 1:
        return f"asks for {job.gpus} GPUs; a job needs at least 1"
    if not candidates:
        return f"no ready node has {flavor} GPUs"
    biggest = max(candidates, key=lambda n: n.gpu_count)  # max keeps the first of equals
    if biggest.gpu_count < job.gpus:
        return (
            f"needs {job.gpus} {flavor} GPUs on one node; the largest ready {flavor} node "
            f"({biggest.node_id}) has {biggest.gpu_count}"
        )
    # Only nodes big enough for the job can ever take it, and those are all partly in use.
    big_enough = [n for n in candidates if n.gpu_count >= job.gpus]
    best = max(big_enough, key=lambda n: len(_free(n, used)))
    free = len(_free(best, used))
    holders = sorted(set(used[best.node_id].values()))
    in_use = len(used[best.node_id])
    label = "job" if len(holders) == 1 else "jobs"
    return (
        f"needs {job.gpus} {flavor} GPUs; the largest free block is {free} on {best.node_id} "
        f"({in_use} in use by {label} {', '.join(holders)})"
    )
