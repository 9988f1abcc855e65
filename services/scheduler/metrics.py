"""The scheduler's gauges and totals, read from its tables by ``shared.metrics_sampler``.

Every reading is one aggregate query over small tables or partial indexes (waiting jobs,
nodes, live GPU leases), except the two totals, which count allocations (with their jobs'
flavors) and finished jobs by a grouped scan: run every 15 s on one connection, not per scrape. Labels are queues,
flavors, states and the fields the node inventory caps only (``shared.metrics``: nothing
about a tenant beyond counts). A flavor label is a node's flavor (for the allocation
totals, the one it had at the grant), which is a flavor of the catalogue
(``repository.upsert_node`` registers it): a node the node inventory gives no
flavor (``inventory.NO_FLAVOR``) is left out of the flavor series, so a name an undeclared
node chose never becomes a label; nor does a node's id or topology.
"""

from __future__ import annotations

import asyncpg

from trainyard_platform.services.scheduler.inventory import CAPPED_FIELDS
from trainyard_platform.shared.metrics_sampler import Readings, Sampler

_QUEUES = """SELECT q.name AS queue, count(j.job_id) AS depth,
       coalesce(extract(epoch FROM now() - min(j.submitted_at)), 0) AS oldest
FROM queues q LEFT JOIN jobs j ON j.queue = q.name AND j.status = 'QUEUED'
GROUP BY q.name"""
"""Every queue, empty ones at 0 (a series that vanishes when a queue drains reads as
"unknown" to Prometheus)."""

_GPUS = """SELECT n.gpu_flavor AS flavor, n.status, n.cordoned_at IS NOT NULL AS cordoned,
       sum(n.gpu_count) AS gpus,
       coalesce(sum(l.leased), 0) AS leased,
       coalesce(sum(l.stopping), 0) AS stopping,
       coalesce(extract(epoch FROM now() - min(l.stopping_since)), 0) AS stopping_for
FROM nodes n
LEFT JOIN (SELECT node_id, count(*) AS leased,
                  count(*) FILTER (WHERE stopping_since IS NOT NULL) AS stopping,
                  min(stopping_since) AS stopping_since
           FROM gpu_leases WHERE released_at IS NULL
           GROUP BY node_id) l USING (node_id)
WHERE n.retired_at IS NULL AND n.gpu_flavor <> ''
GROUP BY n.gpu_flavor, n.status, n.cordoned_at IS NOT NULL"""

GPU_STATES = ("allocated", "stopping", "idle", "cordoned", "lost")
"""Every state of ``trainyard.scheduler.gpus``, each reported for every flavor a node has
(0 where none): before, a flavor whose nodes were all lost lost its ``allocated`` and
``idle`` series, and its ``lost`` series vanished once they came back. The free GPUs of a
cordoned node are ``cordoned``, not ``idle``: no job can be placed on them, and counted
idle they set off ``TrainyardGPUsIdleWhileJobsWait`` for as long as a node was cordoned.
``stopping``: GPUs still leased to an allocation that ended while its runner stops the job
(``leases``, ``gpu_leases.stopping_since``), neither a job's nor free; counted
``allocated`` they hid GPUs held for a runner that never said it stopped, and
``trainyard.scheduler.gpus.stopping_for`` says how long the oldest of them has been held.
A retired node (``admin.retire_node``) counts in no state: its GPUs are gone for good, and
counted ``lost`` they kept ``TrainyardGPUsLost`` firing forever."""

_ALLOCATIONS = """WITH granted AS (
    SELECT j.gpu_flavor AS flavor, a.allocation_id, a.outcome, a.notice_at
    FROM allocations a JOIN jobs j USING (job_id))
SELECT f.flavor, count(g.allocation_id) AS granted,
       count(g.allocation_id) FILTER (WHERE g.outcome = 'preempted' AND g.notice_at IS NOT NULL)
           AS preempted
FROM (SELECT gpu_flavor AS flavor FROM nodes WHERE gpu_flavor <> ''
      UNION SELECT flavor FROM granted) f
LEFT JOIN granted g USING (flavor)
GROUP BY f.flavor"""
"""Every flavor a node has, at 0 until its first allocation (as ``_QUEUES``), and every
flavor an allocation was granted on (its job's, the node's then), retired nodes included:
these are totals, which must never go down. An allocation counts under the flavor it was
granted on, not its node's now: a node whose flavor changed or went (undeclared under a
required inventory: ``inventory.NO_FLAVOR``) took its grants out of the totals."""

_NODES = "SELECT status, count(*) AS n FROM nodes WHERE retired_at IS NULL GROUP BY status"
"""Ready and lost nodes (``TrainyardNodeLost``); a retired node is neither, and is left out."""

CORDONED_BY = ("operator", "scheduler")
"""Every ``by`` of ``trainyard.scheduler.nodes.cordoned``, each from the start at 0: an
automatic cordon (the scheduler's) has an end, an operator's has none."""
_CORDONED = """SELECT CASE WHEN cordoned_until IS NULL THEN 'operator' ELSE 'scheduler' END AS by,
       count(*) AS n
FROM nodes WHERE cordoned_at IS NOT NULL AND retired_at IS NULL GROUP BY 1"""

_CAPPED = """SELECT field, count(*) AS n FROM nodes, unnest(capped) AS field
WHERE status = 'READY' AND retired_at IS NULL GROUP BY field"""
"""Ready nodes the node inventory gives less than they claim, by what it capped
(``inventory.CAPPED_FIELDS``, each at 0 from the start)."""

TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
"""Every state of ``trainyard.scheduler.jobs.finished``: each is reported from the start, 0
until a job ends in it (a series that appears only with its first job reads as "unknown" to
Prometheus, and ``increase`` misses that first job)."""
_FINISHED = """SELECT status, count(*) AS jobs FROM jobs
WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELLED') GROUP BY status"""


def scheduler_readings(sampler: Sampler, pool: asyncpg.Pool) -> None:
    """Register the scheduler's readings on ``sampler``."""

    async def fetch(query: str) -> list[asyncpg.Record]:
        async with pool.acquire() as conn:
            return list(await conn.fetch(query))

    async def depth() -> Readings:
        return [(float(r["depth"]), {"queue": r["queue"]}) for r in await fetch(_QUEUES)]

    async def oldest() -> Readings:
        return [(float(r["oldest"]), {"queue": r["queue"]}) for r in await fetch(_QUEUES)]

    async def gpus() -> Readings:
        counts: dict[str, dict[str, float]] = {}
        for r in await fetch(_GPUS):
            flavor = counts.setdefault(r["flavor"], dict.fromkeys(GPU_STATES, 0.0))
            if r["status"] == "LOST":
                flavor["lost"] += float(r["gpus"])
                continue
            leased = float(r["leased"])
            flavor["allocated"] += leased - float(r["stopping"])
            flavor["stopping"] += float(r["stopping"])
            flavor["cordoned" if r.get("cordoned") else "idle"] += float(r["gpus"]) - leased
        return [
            (n, {"flavor": flavor, "state": state})
            for flavor, states in counts.items()
            for state, n in states.items()
        ]

    async def stopping_for() -> Readings:
        oldest: dict[str, float] = {}
        for r in await fetch(_GPUS):
            flavor = r["flavor"]
            oldest[flavor] = max(oldest.get(flavor, 0.0), float(r["stopping_for"]))
        return [(seconds, {"flavor": flavor}) for flavor, seconds in oldest.items()]

    async def nodes() -> Readings:
        counts = {"ready": 0.0, "lost": 0.0}
        for r in await fetch(_NODES):
            counts[str(r["status"]).lower()] = float(r["n"])
        return [(n, {"state": state}) for state, n in counts.items()]

    async def cordoned() -> Readings:
        counts = dict.fromkeys(CORDONED_BY, 0.0)
        for r in await fetch(_CORDONED):
            counts[str(r["by"])] = float(r["n"])
        return [(n, {"by": by}) for by, n in counts.items()]

    async def capped() -> Readings:
        counts = dict.fromkeys(CAPPED_FIELDS, 0.0)
        for r in await fetch(_CAPPED):
            counts[str(r["field"])] = float(r["n"])
        return [(n, {"field": field}) for field, n in counts.items()]

    async def allocations() -> Readings:
        return [(float(r["granted"]), {"flavor": r["flavor"]}) for r in await fetch(_ALLOCATIONS)]

    async def preemptions() -> Readings:
        return [(float(r["preempted"]), {"flavor": r["flavor"]}) for r in await fetch(_ALLOCATIONS)]

    async def finished() -> Readings:
        counts = dict.fromkeys(TERMINAL_STATES, 0.0)
        for r in await fetch(_FINISHED):
            counts[str(r["status"])] = float(r["jobs"])
        return [(n, {"state": state}) for state, n in counts.items()]

    sampler.gauge("trainyard.scheduler.queue.depth", depth)
    sampler.gauge("trainyard.scheduler.queue.oldest_wait", oldest)
    sampler.gauge("trainyard.scheduler.gpus", gpus)
    sampler.gauge("trainyard.scheduler.gpus.stopping_for", stopping_for)
    sampler.gauge("trainyard.scheduler.nodes", nodes)
    sampler.gauge("trainyard.scheduler.nodes.cordoned", cordoned)
    sampler.gauge("trainyard.scheduler.nodes.capped", capped)
    sampler.gauge("trainyard.scheduler.allocations", allocations)
    sampler.gauge("trainyard.scheduler.preemptions", preemptions)
    sampler.gauge("trainyard.scheduler.jobs.finished", finished)
