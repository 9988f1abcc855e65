"""Saying each node's supply (``node.supplied``): what the scheduler places on it, which
billing counts a node's unallocated GPUs from.

Contract:
- Each node's supply (its flavor and GPU count, ``inventory.cap`` of its claim) has a
  version, ``nodes.supply_version``: 1 when the node is first heard, one more each time a
  judgement changes the supply (``repository.upsert_node``, under the node's row lock, so
  versions follow the order the judgements commit in whichever replica, and whatever its
  clock, made them). ``NodeSupplied.sequence`` carries it: a consumer keeps a node's
  highest; the same version is always the same supply.
- ``say_judged`` (after a judgement, in its transaction) says the supply when its version
  is not the one last said: a judgement that changes nothing is not said. A change its
  node's own claim made (not a new node, a node back from lost or retired, another
  declaration or inventory mode) is said at most once per ``SAY_MIN_INTERVAL``: a node
  flipping its claim is not said at every heartbeat. One held back is said at the node's
  first heartbeat after the interval (``repository.touch_node`` judges such a node again).
- ``SupplyHerald`` says every ready judged node's supply again, without a pass: at the
  start of each leadership term those not said during it, then every ``interval_s`` those
  not said for that long, ``batch`` nodes per transaction (under the scheduling lock and
  the leader check, so each batch's events are stored in one statement, not one a node:
  at 10,000 nodes on a loopback database, about 50 ms a batch rather than 300; a failed
  round is tried again after ``RETRY_S``). So a node judged while no consumer heard its supply (an upgrade's
  roll: an older billing drops ``node.supplied``, an older scheduler never says it) is
  said again without waiting for its claim, declaration or the mode to change. A node never
  judged (before ``0015``, or reset by ``0016``) is judged, and said, at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta

import asyncpg

from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.inventory import SAY_MIN_INTERVAL
from trainyard_platform.services.scheduler.leader import NotLeader
from trainyard_platform.services.scheduler.scheduling import Clock, emit, traced, utc_now
from trainyard_platform.shared import outbox
from trainyard_platform.shared.db import DATABASE_FAULTS, failed_rounds_from_zero, log_failed_round
from trainyard_platform.shared.events.payloads import NodeSupplied
from trainyard_platform.shared.inbox import Guard, no_guard

log = logging.getLogger(__name__)

HERALD_INTERVAL_S = 3600.0
"""How long a ready node's supply goes unsaid before the herald says it again."""

HERALD_BATCH = 500
"""Nodes the herald says per transaction."""

RETRY_S = 5.0
"""How soon the herald tries a failed round again."""

_SKIPPED: tuple[type[BaseException], ...] = (NotLeader, *DATABASE_FAULTS)


def _supplied(row: asyncpg.Record, now: datetime) -> NodeSupplied:
    return NodeSupplied(
        node_id=row["node_id"],
        gpu_flavor=row["gpu_flavor"],
        gpu_count=row["gpu_count"],
        judged_at=now,
        sequence=row["supply_version"],
    )


async def say_judged(
    conn: asyncpg.Connection, node_id: str, now: datetime, *, at_once: bool
) -> NodeSupplied | None:
    """Say the node's supply just judged, unless its version was said already or, for a
    change of the node's own claim (``at_once`` False: not a new node, one back, another
    declaration or mode), one was said under ``SAY_MIN_INTERVAL`` ago; returns what was
    said."""
    row = await conn.fetchrow(
        """UPDATE nodes SET supply_said_version = supply_version, supply_said_at = $2
           WHERE node_id = $1 AND supply_said_version IS DISTINCT FROM supply_version
                 AND ($3 OR supply_said_at IS NULL OR supply_said_at <= $2::timestamptz - $4::interval)
           RETURNING node_id, gpu_flavor, gpu_count, supply_version""",
        node_id,
        now,
        at_once,
        SAY_MIN_INTERVAL,
    )
    if row is None:
        return None
    supplied = _supplied(row, now)
    await emit(conn, supplied, node_id)
    return supplied


async def say_unsaid_since(
    conn: asyncpg.Connection, since: datetime, now: datetime, batch: int, after: str = ""
) -> list[str]:
    """Say the supply of up to ``batch`` ready judged nodes not said since ``since``, in the
    order of their ids from past ``after``; returns their ids, in that order."""
    rows = await conn.fetch(
        """WITH picked AS (
               SELECT node_id FROM nodes
               WHERE status = 'READY' AND inventory_mode IS NOT NULL AND node_id > $4
                     AND (supply_said_at IS NULL OR supply_said_at < $1)
               ORDER BY node_id LIMIT $3 FOR UPDATE),
           said AS (
               UPDATE nodes n SET supply_said_version = supply_version, supply_said_at = $2
               FROM picked WHERE n.node_id = picked.node_id
               RETURNING n.node_id, n.gpu_flavor, n.gpu_count, n.supply_version)
           SELECT * FROM said ORDER BY node_id""",
        since,
        now,
        batch,
        after,
    )
    # One statement for the batch's events: the scheduling lock is held while they are stored.
    await outbox.enqueue_traced(conn, [traced(_supplied(r, now), r["node_id"]) for r in rows])
    return [row["node_id"] for row in rows]


class SupplyHerald:
    """Says every ready node's supply again, at the start of a term and then every
    ``interval_s`` (module contract). A failed round is logged and tried again at the next
    tick."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        clock: Clock = utc_now,
        guard: Guard = no_guard,
        *,
        interval_s: float = HERALD_INTERVAL_S,
        batch: int = HERALD_BATCH,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._guard = guard
        self._interval = interval_s
        self._batch = batch

    async def say_since(self, since: datetime) -> int:
        """Say every ready judged node not said since ``since``, a batch per transaction;
        returns how many."""
        said, after = 0, ""
        while True:  # by node id: ends even if the clock steps back before ``since``
            async with self._pool.acquire() as conn, conn.transaction():
                await repo.lock_scheduler(conn)  # the event batches' order: lock, then check
                await self._guard(conn)
                ids = await say_unsaid_since(conn, since, self._clock(), self._batch, after)
            said += len(ids)
            if len(ids) < self._batch:
                return said
            after = ids[-1]

    async def run(self, stop: asyncio.Event) -> None:
        failed_rounds_from_zero("node-supply-herald")
        term = self._clock()  # the first round: every node not said during this term
        said_in_term = False
        while not stop.is_set():
            since = self._clock() - timedelta(seconds=self._interval) if said_in_term else term
            wait = self._interval
            try:
                said = await self.say_since(since)
                said_in_term = True
                if said:
                    log.info("said the supply of %d node(s) again", said)
            except _SKIPPED as exc:
                wait = min(wait, RETRY_S)
                log_failed_round(
                    log,
                    "node-supply-herald",
                    "saying node supplies failed: %s; retrying next tick",
                    exc,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
