"""Fair share and ageing: the order in which pending jobs are considered.

Contract:
- ``decay_usage(usage, elapsed_s, half_life_s)`` multiplies every team's usage by
  ``0.5 ** (elapsed_s / half_life_s)``: usage halves every half-life, so a bursty team is not
  punished forever. ``charge`` adds GPU-seconds to a team. Both return new dicts.
- A team's *share* in a cohort is its recent average GPU use plus the GPUs it holds now,
  divided by its weighted fair share of the cohort's nominal quota:
  ``(ln2 * usage / half_life + held) / (weight * nominal_per_weight)``. A share of 1 means the
  team uses exactly its weighted fair share. It only grows during a pass as jobs are placed.
- A pending job's *standing* (lower is considered earlier) is
  ``share - priority_level - waited / ageing_s``: each priority level counts as one whole fair
  share, and so does every ``ageing_s`` of waiting, so any job eventually outranks every
  younger one (no starvation). Within one queue the order is the same without the share term
  (``queue_key``), which only depends on the job, never on the clock. A priority class's
  level is its rank among the classes' values (``class_levels``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from trainyard_platform.services.scheduler.policy.model import (
    DEFAULT_PRIORITY,
    PriorityClass,
    Queue,
)


def decay_usage(
    usage: Mapping[str, float], elapsed_s: float, half_life_s: float
) -> dict[str, float]:
    """Usage after ``elapsed_s`` more seconds of exponential decay with ``half_life_s``."""
    if elapsed_s <= 0:
        return dict(usage)
    if half_life_s <= 0:
        return dict.fromkeys(usage, 0.0)
    factor = 0.5 ** (elapsed_s / half_life_s)
    return {team: used * factor for team, used in usage.items()}


def charge(usage: Mapping[str, float], team: str, gpu_seconds: float) -> dict[str, float]:
    """Usage with ``gpu_seconds`` more charged to ``team``."""
    charged = dict(usage)
    charged[team] = charged.get(team, 0.0) + gpu_seconds
    return charged


def size_levels(gpus: int, declared_runtime_s: float, size_weight: float) -> float:
    """How many priority levels a job's declared size costs it: ``size_weight`` levels per
    factor of ten in declared GPU-hours, counted from one GPU-hour (a smaller job gains).
    Declared sizes are bounded, so this delays a large job by a bounded time, never forever."""
    if size_weight == 0:
        return 0.0
    gpu_hours = max(gpus * declared_runtime_s, 60.0) / 3600.0
    return size_weight * math.log10(gpu_hours)


def class_levels(classes: Iterable[PriorityClass]) -> dict[int, int]:
    """Each priority value's level: its rank among the values of ``classes`` and of
    ``DEFAULT_PRIORITY`` (0 the lowest), what ``queue_key`` counts one ``ageing_s`` per."""
    values = sorted({c.value for c in classes} | {DEFAULT_PRIORITY.value})
    return {v: i for i, v in enumerate(values)}


def queue_key(
    submitted_at: float, level: float, seq: int, job_id: str, ageing_s: float
) -> tuple[float, float, int, str]:
    """Order within a queue: higher priority level first unless a lower one waited
    ``ageing_s`` longer per level; then submit time and arrival sequence. ``level`` may carry
    the job's ``size_levels`` (subtracted)."""
    return (submitted_at / ageing_s - level, submitted_at, seq, job_id)


class FairShare:
    """Shares of the teams of every cohort (see module docstring)."""

    def __init__(
        self,
        queues: Iterable[Queue],
        usage: Mapping[str, float],
        held: Mapping[str, int],
        half_life_s: float,
        cluster_gpus: int,
        enabled: bool = True,
    ):
        self.enabled = enabled
        weights: dict[tuple[str, str], float] = {}
        nominal: dict[str, int] = {}
        for q in queues:
            group = self.group(q)
            weights[(group, q.team)] = weights.get((group, q.team), 0.0) + max(q.weight, 1e-9)
            nominal[group] = nominal.get(group, 0) + sum(q.nominal.values())
        total_weight: dict[str, float] = {}
        for (group, _), weight in weights.items():
            total_weight[group] = total_weight.get(group, 0.0) + weight
        self._scale: dict[tuple[str, str], float] = {}
        for (group, team), weight in weights.items():
            per_weight = (nominal[group] or cluster_gpus or 1) / total_weight[group]
            self._scale[(group, team)] = 1.0 / (weight * per_weight)
        rate = math.log(2) / half_life_s if half_life_s > 0 else 0.0
        self._past = {team: used * rate for team, used in usage.items()}
        self._held = dict(held)
        self._queue_scale: dict[str, float] = {}
        """Queue name -> its team's scale in its group (``share``'s last factor)."""

    @staticmethod
    def group(queue: Queue) -> str:
        """Teams share fairly within a cohort; a queue without one is its own group."""
        return queue.cohort if queue.cohort is not None else f"queue:{queue.name}"

    def share(self, queue: Queue) -> float:
        if not self.enabled:
            return 0.0
        team = queue.team
        used = self._past.get(team, 0.0) + self._held.get(team, 0)
        scale = self._queue_scale.get(queue.name)
        if scale is None:  # fixed per queue: its group, team and the weights never change
            scale = self._queue_scale[queue.name] = self._scale.get((self.group(queue), team), 1.0)
        return used * scale

    def share_without(self, queue: Queue, gpus: int) -> float:
        """``share(queue)`` with ``gpus`` fewer held by its team: the share the queue would
        have once a job of it holding them has left (a victim, re-queued)."""
        if not self.enabled:
            return 0.0
        return self.share(queue) - gpus * self._queue_scale[queue.name]

    def charge(self, team: str, gpus: int) -> None:
        """Count ``gpus`` more held by ``team`` (a placement in this pass)."""
        self._held[team] = self._held.get(team, 0) + gpus
