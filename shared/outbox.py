"""The transactional outbox: events leave the service exactly when their change commits.

Contract:
- ``enqueue(conn, envelope)`` must run inside the transaction that makes the change; it
  stores the event with the current trace context and notifies the relay on commit. A rolled
  back transaction therefore publishes nothing.
- ``OutboxRelay.run`` publishes unpublished events in commit order with ``Nats-Msg-Id`` = event
  id and marks them published. A crash between publish and mark re-publishes the event on
  restart; JetStream drops the duplicate inside its window, so each event is published once.
- Several replicas may relay one outbox: rows are claimed with ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import asyncio
import json
import logging

import asyncpg

from shared.bus import Bus
from shared.events import Envelope, Payload
from shared.telemetry import inject

log = logging.getLogger(__name__)
_CHANNEL = "trainyard_outbox"


async def enqueue(conn: asyncpg.Connection, envelope: Envelope[Payload]) -> None:
    """Record ``envelope`` for publication when the surrounding transaction commits."""
    await conn.execute(
        "INSERT INTO outbox (event_id, subject, body, headers) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (event_id) DO NOTHING",
        envelope.id,
        envelope.nats_subject,
        envelope.to_json(),
        inject(),
    )
    # Delivered to listeners only if and when the transaction commits.
    await conn.execute("SELECT pg_notify($1, current_schema())", _CHANNEL)


class OutboxRelay:
    """Moves committed outbox rows to NATS."""

    def __init__(self, pool: asyncpg.Pool, bus: Bus, batch: int = 100, idle_poll_s: float = 1.0):
        self._pool = pool
        self._bus = bus
        self._batch = batch
        self._idle_poll_s = idle_poll_s
        self._wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set, then flush what is committed and return."""
        listener = await self._pool.acquire()
        await listener.add_listener(_CHANNEL, self._on_notify)
        try:
            while not stop.is_set():
                # Cleared before reading, so a commit that lands during the read still wakes us.
                self._wake.clear()
                try:
                    sent = await self.relay_once()
                except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
                    log.warning("outbox relay: %s; retrying", exc)
                    sent = 0
                    await asyncio.sleep(self._idle_poll_s)
                if sent == 0:
                    await self._sleep(stop)
            while await self.relay_once():
                pass
        finally:
            await listener.remove_listener(_CHANNEL, self._on_notify)
            await self._pool.release(listener)

    async def relay_once(self) -> int:
        """Publish up to one batch of committed, unpublished events; return how many."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT seq, event_id, subject, body, headers FROM outbox "
                "WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED",
                self._batch,
            )
            for row in rows:
                headers = row["headers"]
                if isinstance(headers, str):
                    headers = json.loads(headers)
                await self._bus.publish_raw(row["subject"], row["body"], row["event_id"], headers)
            if rows:
                await conn.execute(
                    "UPDATE outbox SET published_at = now() WHERE seq = ANY($1::bigint[])",
                    [r["seq"] for r in rows],
                )
        return len(rows)

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    async def _sleep(self, stop: asyncio.Event) -> None:
        waiters = {asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())}
        _, pending = await asyncio.wait(
            waiters, timeout=self._idle_poll_s, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
