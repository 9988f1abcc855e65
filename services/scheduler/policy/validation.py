"""Requests that can never start as asked, whatever else happens in the cluster.

Contract: ``why_invalid`` returns None for a job that could start some day (given enough free
GPUs and quota), else the reason, what blocks it, and what to ask for instead. It depends only
on the job, the queue configuration and the ready nodes, never on what is running, so callers
may cache it per kind of request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from trainyard_platform.services.scheduler.policy import explain
from trainyard_platform.services.scheduler.policy.model import PendingJob
from trainyard_platform.services.scheduler.policy.packing import FlavorPool, Shape, job_shapes
from trainyard_platform.services.scheduler.policy.quota import QuotaBook


class Invalid(NamedTuple):
    reason: str
    blocking: str
    suggestion: str | None


def usable_shapes(job: PendingJob, pool: FlavorPool) -> tuple[Shape, ...]:
    """The job's gang shapes for which the flavor has enough big-enough nodes."""
    every = job_shapes(job.gpus, job.gpus_per_node, pool.capacity)
    return tuple(s for s in every if s[0] <= pool.count_nodes_with(s[1]))


def why_invalid(
    job: PendingJob,
    quota: QuotaBook,
    pools: Mapping[str, FlavorPool],
    shapes: tuple[Shape, ...],
    borrows: bool = True,
) -> Invalid | None:
    """Why ``job`` (whose usable ``shapes`` are given; ``borrows``: whether it may borrow
    its cohort's quota, ``quota.QuotaBook.check``) can never start, or None."""
    if job.queue not in quota.queues:
        return Invalid(explain.unknown_queue(job.queue), f"queue {job.queue}", None)
    if job.gpus < 1:
        return Invalid(explain.bad_request(job.gpus), "the request", "ask for at least 1 GPU")
    pool = pools.get(job.flavor)
    if pool is None or pool.total == 0:
        ready = [f for f, p in pools.items() if p.total]
        hint = f"flavors with ready nodes: {', '.join(ready)}" if ready else None
        return Invalid(explain.no_nodes(job.flavor), f"{job.flavor} nodes", hint)
    if not shapes:
        text = explain.no_shape(job.gpus, job.flavor, job.gpus_per_node, pool.capacity, pool.total)
        fits = [
            n
            for n in range(job.gpus - 1, 0, -1)
            if job_shapes(n, None, pool.capacity) and n <= pool.total
        ]
        return Invalid(text, "the request", f"ask for {fits[0]} GPUs" if fits else None)
    ceiling = quota.ceiling(job.queue, job.flavor, borrows)
    if job.gpus > ceiling:
        if borrows or quota.ceiling(job.queue, job.flavor) <= ceiling:
            text = explain.quota_ceiling(job.queue, job.gpus, job.flavor, ceiling)
        else:
            text = explain.no_borrowing(job.queue, job.gpus, job.flavor, ceiling, job.priority)
        hint = f"ask for at most {ceiling} GPUs" if ceiling > 0 else None
        return Invalid(text, f"queue {job.queue} quota", hint)
    return None
