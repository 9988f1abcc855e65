"""Max-min fair share of GPUs across teams (water-filling), FIFO within a team, preemptive.

Contract of ``max_min_fair(snapshot)``:
- Demand of a team: the GPUs of its running and pending jobs. Shares: max-min fair
  water-filling of the cluster's GPUs over the demands (``water_fill``): teams demanding less
  than an equal split get their demand, the rest split what is left equally. Team weights
  are ignored (all are 1 in the simulator's set-up).
- Phase 1: repeatedly the team with the smallest held/share ratio offers its oldest pending
  job (FIFO within the team). It starts if it fits. If not, and the team's holding plus the
  job stays within its share, it may claim GPUs under notice or preempt jobs of teams that
  hold more than their share (latest started first, kind ``reclaim``); otherwise the team is
  done for the pass (its later jobs do not pass its head in this phase).
- Phase 2 (work conservation): the jobs left, teams furthest below their share first, then
  arrival, start if they fit in the GPUs still free; no preemption. A gang larger than its
  team's share therefore only ever starts here, on GPUs nobody else wants.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from bench.simulator.preemptive import PreemptivePass
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    PendingJob,
    RunningJob,
    Snapshot,
)

_EPS = 1e-9


def water_fill(demands: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair split of ``capacity`` over ``demands`` (no team gets more than it asks)."""
    shares: dict[str, float] = {}
    left = capacity
    ordered = sorted(demands, key=lambda t: (demands[t], t))
    for i, team in enumerate(ordered):
        give = min(demands[team], left / (len(ordered) - i))
        shares[team] = give
        left -= give
    return shares


def max_min_fair(snapshot: Snapshot) -> Decisions:
    """One pass (see the module docstring)."""
    demand: dict[str, float] = {}
    held: dict[str, float] = {}
    for r in snapshot.running:
        demand[r.queue] = demand.get(r.queue, 0) + r.gpus
        if r.notice_at is None:
            held[r.queue] = held.get(r.queue, 0) + r.gpus
    queues: dict[str, list[PendingJob]] = {}
    for job in sorted(snapshot.pending, key=lambda j: j.seq):
        demand[job.queue] = demand.get(job.queue, 0) + job.gpus
        queues.setdefault(job.queue, []).append(job)
    share = water_fill(demand, sum(n.gpu_count for n in snapshot.nodes))

    def ratio(team: str) -> float:
        return held.get(team, 0) / share[team] if share[team] > 0 else float("inf")

    p = PreemptivePass(snapshot, lambda r: (-r.started_at,), kind="reclaim")
    heap = [(ratio(t), t) for t in queues]
    heapq.heapify(heap)
    position = dict.fromkeys(queues, 0)
    while heap:
        _, team = heapq.heappop(heap)
        job = queues[team][position[team]]
        mine = held.get(team, 0)
        if mine + job.gpus <= share[team] + _EPS:
            outcome, victims = p.start(
                job,
                _over_share(held, share),
                f"max-min fair share: {team} holds {mine:.0f} of its {share[team]:.1f} GPUs",
            )
        else:
            outcome, victims = ("started" if p.start_if_free(job, job.gpus) else "blocked"), []
        for v in victims:
            held[v.queue] -= v.gpus
        if outcome == "blocked":
            continue  # FIFO within the team: its later jobs wait for phase 2
        held[team] = mine + job.gpus
        position[team] += 1
        if position[team] < len(queues[team]):
            heapq.heappush(heap, (ratio(team), team))
    rest = [job for team, jobs in queues.items() for job in jobs[position[team] :]]
    rest.sort(key=lambda j: (ratio(j.queue), j.seq))
    for job in rest:
        if p.start_if_free(job, job.gpus):
            held[job.queue] = held.get(job.queue, 0) + job.gpus
    return p.decisions()


def _over_share(
    held: Mapping[str, float], share: Mapping[str, float]
) -> Callable[[RunningJob], bool]:
    """Victims: jobs of teams holding more than their share (read when asked: it changes)."""
    return lambda v: held.get(v.queue, 0) > share[v.queue] + _EPS
