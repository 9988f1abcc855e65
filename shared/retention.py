"""Bounded event history: the stream, the inbox and the outbox keep one horizon.

JetStream keeps an event for ``NatsSettings.retention_hours`` (the stream's ``max_age``), and
a consumer can be handed an event, again or for the first time, only while the stream holds
it. An inbox row older than that horizon can therefore never again match a delivery, and a
published outbox row that old has long been stored in the stream: ``Retention`` deletes
both, in bounded batches, so the tables grow with the event rate times the horizon, not
forever (every runner heartbeat adds an inbox row to the scheduler's). Unpublished outbox
rows are never deleted, whatever their age. One case escapes: a relay that died between
publishing a row and marking it, and stays down longer than the horizon, publishes it again
after consumers have forgotten it, and they apply it twice.

Contract: ``prune_once(cutoff)`` deletes inbox rows applied before ``cutoff`` and outbox rows
published before it, and returns how many of each; ``run(stop)`` prunes every
``interval_s`` until ``stop``, logging database errors and trying again next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from trainyard_platform.shared.db import DATABASE_FAULTS, failed_rounds_from_zero, log_failed_round

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pruned:
    inbox: int
    outbox: int


class Retention:
    """Deletes inbox and published outbox rows older than ``horizon_hours`` (see the module);
    services pass the stream's ``NatsSettings.retention_hours``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        horizon_hours: float,
        interval_s: float = 600.0,
        batch: int = 10_000,
    ) -> None:
        self._pool = pool
        self._horizon = timedelta(hours=horizon_hours)
        self._interval_s = interval_s
        self._batch = batch

    async def run(self, stop: asyncio.Event) -> None:
        failed_rounds_from_zero("retention")
        while not stop.is_set():
            try:
                pruned = await self.prune_once(datetime.now(UTC) - self._horizon)
            except DATABASE_FAULTS as exc:
                log_failed_round(
                    log,
                    "retention",
                    f"retention: %s; trying again in {self._interval_s:.0f} s",
                    exc,
                )
            else:
                if pruned.inbox or pruned.outbox:
                    log.info(
                        "retention: deleted %d inbox, %d outbox rows", pruned.inbox, pruned.outbox
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    async def prune_once(self, cutoff: datetime) -> Pruned:
        """Delete everything older than ``cutoff``, one short transaction per batch."""
        inbox = await self._drain(
            "DELETE FROM inbox WHERE ctid = ANY(ARRAY("
            "  SELECT ctid FROM inbox WHERE applied_at < $1 LIMIT $2))",
            cutoff,
        )
        outbox = await self._drain(
            "DELETE FROM outbox WHERE seq = ANY(ARRAY("
            "  SELECT seq FROM outbox WHERE published_at < $1 LIMIT $2))",
            cutoff,
        )
        return Pruned(inbox, outbox)

    async def _drain(self, delete: str, cutoff: datetime) -> int:
        total = 0
        while True:
            async with self._pool.acquire() as conn:
                status = await conn.execute(delete, cutoff, self._batch)
            deleted = int(status.split()[-1])  # "DELETE n"
            total += deleted
            if deleted < self._batch:
                return total
