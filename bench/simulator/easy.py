"""FIFO with EASY backfill: what a Slurm user gets. Never preempts, explains nothing.

Contract of ``easy_backfill(snapshot)``:
- Pending jobs are taken in arrival order (``seq``); each one that fits now starts (first fit,
  ``gangs.first_fit``) until the first that does not: the head.
- The head gets one reservation: walking the running jobs (and those started earlier in this
  pass) by their declared end, ``started_at + declared_runtime_s``, their GPUs are added to the
  free ones until the head's gang fits; that time is the shadow time and that gang the reserved
  GPUs. Only durations the scheduler is told are used, never true ones.
- Every later job may start now if it fits and either its declared end is no later than the
  shadow time or it fits without touching the reserved GPUs; so no backfilled job can delay
  the head while declared runtimes hold. Only the head has a reservation (EASY, not
  conservative backfill).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from bench.simulator import gangs
from trainyard_platform.services.scheduler.policy.model import Decisions, Placement, Snapshot


def easy_backfill(snapshot: Snapshot) -> Decisions:
    """One pass of FIFO + EASY backfill (see the module docstring)."""
    now = snapshot.now
    free = gangs.free_map(snapshot)
    ends: list[tuple[float, Mapping[str, tuple[int, ...]]]] = [
        (max(now, r.started_at + r.declared_runtime_s), r.placement) for r in snapshot.running
    ]
    placements: list[Placement] = []
    pending = sorted(snapshot.pending, key=lambda p: p.seq)
    shadow, reserved = math.inf, gangs.FreeMap()
    rest = iter(pending)
    for job in rest:
        fit = gangs.first_fit(job.gpus, free)
        if fit is not None:
            gangs.take(free, fit)
            placements.append(Placement(job.job_id, fit))
            ends.append((now + job.declared_runtime_s, fit))
            continue
        shadow, reserved = _reservation(job.gpus, free, ends)
        break
    # Jobs that would still run at the shadow time must keep off the reserved GPUs.
    outside = {n: [i for i in ix if i not in reserved.get(n, ())] for n, ix in free.items()}
    failed: set[tuple[int, bool]] = set()
    for job in rest:
        short = now + job.declared_runtime_s <= shadow
        if (job.gpus, short) in failed:
            continue  # the free GPUs only shrink during a pass
        fit = gangs.first_fit(job.gpus, free if short else outside)
        if fit is None:
            failed.add((job.gpus, short))
            continue
        gangs.take(free, fit)
        gangs.take(outside, fit)
        placements.append(Placement(job.job_id, fit))
    return Decisions(placements=tuple(placements))


def _reservation(
    gpus: int,
    free: gangs.FreeMap,
    ends: list[tuple[float, Mapping[str, tuple[int, ...]]]],
) -> tuple[float, gangs.FreeMap]:
    """(shadow time, reserved GPUs by node) of a head job of ``gpus`` GPUs."""
    hypothetical = {node: list(ix) for node, ix in free.items()}
    for end, placement in sorted(ends, key=lambda e: e[0]):
        for node, indices in placement.items():
            hypothetical[node] = sorted([*hypothetical[node], *indices])
        fit = gangs.first_fit(gpus, hypothetical)
        if fit is not None:
            return end, {node: list(ix) for node, ix in fit.items()}
    return math.inf, {}
