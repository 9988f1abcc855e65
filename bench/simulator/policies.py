"""The two policies the simulator compares, and the queue set-up they run under.

- ``fifo``: the baseline, pure simulator code. Strict arrival order with head-of-line
  blocking: a job starts only once every earlier job has started; first fit (nodes in id
  order, lowest free GPU indices; a multi-node gang takes the first nodes with room for its
  per-node share). Never preempts, explains nothing.
- ``ours(config)``: the real ``services.scheduler.policy.schedule``, unchanged.
- ``team_queues``: one queue per team, all in one cohort, nominal quotas as equal as whole GPUs
  allow and summing to the cluster (500 GPUs / 15 teams: 5 teams get 34, 10 get 33, by team
  name), lending and borrowing unlimited, weight 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter

from bench.simulator.cluster import FLAVOR
from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Node,
    PendingJob,
    Placement,
    PolicyConfig,
    PriorityClass,
    Queue,
    Snapshot,
)

COHORT = "philly"
_ARRIVAL_ORDER = attrgetter("seq")  # the engine numbers jobs in order of submission
PRIORITY = PriorityClass("default", 0, preemptible=True, min_runtime_s=0.0)


def team_queues(teams: Iterable[str], total_gpus: int) -> tuple[Queue, ...]:
    """One queue per team in one cohort (see the module docstring)."""
    names = sorted(set(teams))
    base, extra = divmod(total_gpus, len(names))
    return tuple(
        Queue(
            name=team,
            team=team,
            cohort=COHORT,
            nominal={FLAVOR: base + (1 if i < extra else 0)},
        )
        for i, team in enumerate(names)
    )


def ours(config: PolicyConfig) -> Callable[[Snapshot], Decisions]:
    """The platform's policy with ``config``, called as is."""
    return functools.partial(schedule, config=config)


def fifo(snapshot: Snapshot) -> Decisions:
    """Strict FIFO with first fit (see the module docstring)."""
    nodes = sorted(snapshot.nodes, key=lambda n: n.node_id)
    free = {n.node_id: _free(n) for n in nodes}
    placements: list[Placement] = []
    for job in sorted(snapshot.pending, key=_ARRIVAL_ORDER):
        gpus = _first_fit(job, free)
        if gpus is None:
            break  # head-of-line blocking: nobody behind the head may start
        for node_id, indices in gpus.items():
            free[node_id] = free[node_id][len(indices) :]
        placements.append(Placement(job.job_id, gpus))
    return Decisions(placements=tuple(placements))


def _free(node: Node) -> list[int]:
    if not node.used:
        return list(range(node.gpu_count))
    if len(node.used) >= node.gpu_count:
        return []
    return [i for i in range(node.gpu_count) if i not in node.used]


def _first_fit(job: PendingJob, free: Mapping[str, list[int]]) -> dict[str, tuple[int, ...]] | None:
    per_node = job.gpus_per_node or job.gpus
    if job.gpus == per_node:
        for node_id, indices in free.items():
            if len(indices) >= per_node:
                return {node_id: tuple(indices[:per_node])}
        return None
    count = job.gpus // per_node
    fits = [n for n, ix in free.items() if len(ix) >= per_node][:count]
    if len(fits) < count:
        return None
    return {n: tuple(free[n][:per_node]) for n in fits}
