"""Lost nodes: a node that misses heartbeats for ``node_timeout_seconds`` is LOST.

Contract of ``sweep_lost_nodes`` (one transaction, under the scheduling lock): every READY node
whose last heartbeat is older than the timeout becomes LOST; every job with a live allocation
on it loses its whole gang (each allocation released with outcome ``lost``, billed up to the
node's last heartbeat; the gang's other nodes are told to stop); each job is requeued for its
next attempt at once (no back-off: the node is gone), or FAILED ("node_lost: node lost; max
restarts (N) reached after M attempts") once ``spec.max_restarts`` restarts are used
(failures and lost nodes share the count); then a pass places what it can.

``NodeWatch.run`` sweeps every ``node_check_interval_seconds`` until stopped. It declares
nothing lost until the process has been up for one timeout, so a scheduler that was down
does not take its own downtime for silent nodes. A failed sweep is logged and retried on
the next tick: a database outage must not stop the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime, timedelta

import asyncpg

from services.scheduler import allocation_repository as allocation_repo
from services.scheduler import repository as repo
from services.scheduler.leader import NotLeader
from services.scheduler.leases import end_gang
from services.scheduler.scheduling import Clock, Tuning, run_pass, utc_now
from shared.inbox import Guard, no_guard

log = logging.getLogger(__name__)


async def sweep_lost_nodes(
    conn: asyncpg.Connection,
    now: datetime,
    node_timeout: timedelta,
    tuning: Tuning | None = None,
    guard: Guard = no_guard,
) -> list[str]:
    """Declare silent nodes lost and requeue their jobs; returns the ids of the lost nodes."""
    tuning = tuning or Tuning()
    await repo.lock_scheduler(conn)
    await guard(conn)
    lost = await repo.mark_lost_nodes(conn, now - node_timeout, now)
    for node in lost:
        allocations = await allocation_repo.live_allocations_on(conn, node["node_id"])
        log.warning(
            "node %s lost (last heartbeat %s); releasing %d allocation(s)",
            node["node_id"],
            node["last_heartbeat"].isoformat(),
            len(allocations),
        )
        for allocation in allocations:
            job = await repo.job_for_update(conn, allocation.job_id)
            gang = await allocation_repo.live_allocations(conn, allocation.job_id)
            if job is None or not gang:  # its gang already ended with another lost node
                continue
            await end_gang(
                conn,
                job,
                gang,
                "lost",
                node["last_heartbeat"],
                now,
                tuning,
                reporter=allocation.allocation_id,
            )
    if lost:
        await run_pass(conn, now, tuning)
    return [n["node_id"] for n in lost]


class NodeWatch:
    """The periodic lost-node sweep of one scheduler process."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        interval_seconds: float,
        timeout_seconds: float,
        clock: Clock = utc_now,
        tuning: Tuning | None = None,
        guard: Guard = no_guard,
    ) -> None:
        self._pool = pool
        self._interval = interval_seconds
        self._timeout = timedelta(seconds=timeout_seconds)
        self._clock = clock
        self._tuning = tuning or Tuning()
        self._guard = guard

    async def sweep(self) -> list[str]:
        async with self._pool.acquire() as conn, conn.transaction():
            return await sweep_lost_nodes(
                conn, self._clock(), self._timeout, self._tuning, self._guard
            )

    async def run(self, stop: asyncio.Event) -> None:
        armed_at = time.monotonic() + self._timeout.total_seconds()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval)
            if stop.is_set():
                return
            if time.monotonic() < armed_at:
                continue
            try:
                await self.sweep()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, NotLeader) as exc:
                log.warning("lost-node sweep failed: %s; retrying next tick", exc)
