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

The audit log (``shared.audit``) has a horizon of its own, ``audit_days`` (the installation's
``TRAINYARD_AUDIT_RETENTION_DAYS``; 0 keeps it forever): its entries are deleted once older
than that. The table refuses every other DELETE (``shared/migrations/0009``): each batch names
its cutoff in its transaction (``trainyard.audit_prune_before``), and the database refuses to
delete an entry younger than that cutoff or than ``MIN_AUDIT_DAYS``, whatever the caller.

Contract: ``prune_once(cutoff)`` deletes inbox rows applied before ``cutoff``, outbox rows
published before it and, when ``audit_days`` is set, audit entries older than ``audit_days``
(counted from now by the database's clock, the trigger's), and returns how many of each; ``run(stop)`` prunes every ``interval_s``
until ``stop``, logging database errors and trying again next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from trainyard_platform.shared.db import DATABASE_FAULTS, failed_rounds_from_zero, log_failed_round
from trainyard_platform.shared.settings import MIN_AUDIT_DAYS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pruned:
    inbox: int
    outbox: int
    audit: int = 0


class Retention:
    """Deletes inbox and published outbox rows older than ``horizon_hours``, and audit entries
    older than ``audit_days`` when it is not 0 (see the module); services pass the stream's
    ``NatsSettings.retention_hours`` and ``ServiceSettings.audit_retention_days``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        horizon_hours: float,
        interval_s: float = 600.0,
        batch: int = 10_000,
        audit_days: int = 0,
    ) -> None:
        if audit_days and audit_days < MIN_AUDIT_DAYS:
            raise ValueError(f"audit_days: must be 0 or at least {MIN_AUDIT_DAYS}")
        self._pool = pool
        self._horizon = timedelta(hours=horizon_hours)
        self._audit_horizon = timedelta(days=audit_days) if audit_days else None
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
                if pruned.inbox or pruned.outbox or pruned.audit:
                    log.info(
                        "retention: deleted %d inbox, %d outbox rows, %d audit entries",
                        pruned.inbox,
                        pruned.outbox,
                        pruned.audit,
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
        audit = 0
        if self._audit_horizon is not None:
            # Counted by the database's clock, as the table's trigger counts its 30 days: by
            # this host's, a minute ahead, a 30-day retention picked entries the trigger
            # refuses, and each batch holding one was refused whole.
            audit_cutoff = await self._pool.fetchval(
                "SELECT now() - $1::interval", self._audit_horizon
            )
            audit = await self._drain(
                "DELETE FROM audit_log WHERE id = ANY(ARRAY("
                "  SELECT id FROM audit_log WHERE at < $1 LIMIT $2))",
                audit_cutoff,
                audit=True,
            )
        return Pruned(inbox, outbox, audit)

    async def _drain(self, delete: str, cutoff: datetime, *, audit: bool = False) -> int:
        """Run ``delete`` (``$1`` the cutoff, ``$2`` the batch) until a batch is short; for the
        audit log, each batch's transaction first names its cutoff (the table's trigger
        deletes only rows older than it)."""
        total = 0
        while True:
            async with self._pool.acquire() as conn, conn.transaction():
                if audit:
                    await conn.execute(
                        "SELECT set_config('trainyard.audit_prune_before', $1, true)",
                        cutoff.isoformat(),
                    )
                status = await conn.execute(delete, cutoff, self._batch)
            deleted = int(status.split()[-1])  # "DELETE n"
            total += deleted
            if deleted < self._batch:
                return total
