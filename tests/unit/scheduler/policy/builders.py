"""Small builders for policy scenarios: nodes, queues, jobs and snapshots in one line each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trainyard_platform.services.scheduler.policy.model import (
    Node,
    PendingJob,
    PriorityClass,
    Queue,
    RunningJob,
    Snapshot,
)

NOW = 100_000.0
HOUR = 3600.0

CLASSES = (
    PriorityClass("low", 0, preemptible=True, min_runtime_s=0.0),
    PriorityClass("normal", 10, preemptible=True, min_runtime_s=0.0),
    PriorityClass("high", 20, preemptible=True, min_runtime_s=0.0),
    PriorityClass("guarded", 5, preemptible=True, min_runtime_s=1800.0),
    PriorityClass("pinned", 0, preemptible=False, min_runtime_s=0.0),
)


def node(
    node_id: str, gpus: int = 8, flavor: str = "a100", topology: str = "r1", **used: int
) -> Node:
    """``used``: job id -> how many GPUs it holds, lowest indices first."""
    taken: dict[int, str] = {}
    for job_id, n in used.items():
        for _ in range(n):
            taken[len(taken)] = job_id
    return Node(node_id, flavor, gpus, topology, taken)


def queue(
    name: str,
    nominal: int = 8,
    cohort: str | None = None,
    team: str | None = None,
    flavor: str = "a100",
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    weight: float = 1.0,
) -> Queue:
    return Queue(
        name,
        team or f"team-{name}",
        cohort,
        {flavor: nominal},
        {} if borrowing_limit is None else {flavor: borrowing_limit},
        {} if lending_limit is None else {flavor: lending_limit},
        weight,
    )


def pending(
    job_id: str,
    queue: str = "a",
    gpus: int = 1,
    *,
    priority: str = "normal",
    at: float = NOW - 60,
    runtime: float = HOUR,
    seq: int = 0,
    flavor: str = "a100",
    per_node: int | None = None,
) -> PendingJob:
    return PendingJob(job_id, queue, flavor, gpus, priority, at, runtime, seq, per_node)


def running(
    job_id: str,
    queue: str,
    placement: Mapping[str, int],
    *,
    priority: str = "normal",
    started: float = NOW - HOUR,
    runtime: float = 10 * HOUR,
    checkpoint: float | None = None,
    notice: float | None = None,
    flavor: str = "a100",
) -> RunningJob:
    """``placement``: node id -> GPU count (``cluster`` assigns the indices)."""
    layout = {node_id: tuple(range(count)) for node_id, count in placement.items()}
    gpus = sum(len(v) for v in layout.values())
    return RunningJob(
        job_id,
        queue,
        flavor,
        gpus,
        priority,
        started,
        runtime,
        layout,
        checkpoint,
        False,
        notice,
    )


def snap(
    nodes: tuple[Node, ...],
    queues: tuple[Queue, ...],
    pend: tuple[PendingJob, ...] = (),
    run: tuple[RunningJob, ...] = (),
    usage: Mapping[str, float] | None = None,
    now: float = NOW,
) -> Snapshot:
    """A snapshot; running jobs get their GPUs on the nodes via ``cluster``."""
    nodes, run = cluster(nodes, run)
    return Snapshot(now, nodes, queues, CLASSES, pend, run, dict(usage or {}))


def cluster(
    nodes: tuple[Node, ...], run: tuple[RunningJob, ...]
) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]]:
    """Give each running job the lowest free indices of its nodes (in order) and mark them
    used on the nodes, so that node and job views agree."""
    used = {n.node_id: dict(n.used) for n in nodes}
    jobs = []
    for r in run:
        layout: dict[str, tuple[int, ...]] = {}
        for node_id, indices in r.placement.items():
            size = next(n.gpu_count for n in nodes if n.node_id == node_id)
            free = [i for i in range(size) if i not in used[node_id]][: len(indices)]
            assert len(free) == len(indices), f"{node_id} has no room for {r.job_id}"
            for i in free:
                used[node_id][i] = r.job_id
            layout[node_id] = tuple(free)
        jobs.append(replace(r, placement=layout))
    out = tuple(replace(n, used=used[n.node_id]) for n in nodes)
    return out, tuple(jobs)
