"""The transactional outbox: events leave the service exactly when their change commits.

Contract:
- ``enqueue(conn, *envelopes)`` must run inside the transaction that makes the change; it
  stores the events with the current trace context (in one statement) and notifies the relay
  on commit. A rolled back transaction therefore publishes nothing. ``enqueue_traced`` does
  the same for events that each carry their own trace context (``traced`` takes it).
- ``OutboxRelay.run`` publishes unpublished events in commit order with ``Nats-Msg-Id`` = event
  id and marks them published. A batch is published pipelined (all sent in order, then the
  acknowledgements awaited together). A crash between publish and mark re-publishes the
  event on restart; JetStream drops the duplicate inside its window, so each event is
  published once.
- Several replicas may relay one outbox: rows are claimed with ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import asyncpg

from shared.bus import Bus
from shared.events import Envelope, Payload
from shared.telemetry import inject

log = logging.getLogger(__name__)
_CHANNEL = "trainyard_outbox"


Traced = tuple[Envelope[Payload], dict[str, str]]
"""An event and the trace context (W3C headers) it is to be published in."""


def traced(envelope: Envelope[Payload]) -> Traced:
    """``envelope`` with the trace context current now."""
    return envelope, inject()


async def enqueue(conn: asyncpg.Connection, *envelopes: Envelope[Payload]) -> None:
    """Record ``envelopes`` for publication, in this order, in the current trace context,
    when the surrounding transaction commits."""
    context = inject()
    await enqueue_traced(conn, [(e, context) for e in envelopes])


async def enqueue_traced(conn: asyncpg.Connection, events: Sequence[Traced]) -> None:
    """Record ``events`` for publication, in this order, each in its own trace context, when
    the surrounding transaction commits."""
    if not events:
        return
    # The notification reaches listeners only if and when the transaction commits.
    await conn.execute(
        "WITH rows AS (INSERT INTO outbox (event_id, subject, body, headers) "
        "              SELECT e.id, e.subject, e.body, e.headers "
        "              FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[]) "
        "                   WITH ORDINALITY AS e(id, subject, body, headers, n) ORDER BY e.n "
        "              ON CONFLICT (event_id) DO NOTHING) "
        "SELECT pg_notify($5, current_schema())",
        [e.id for e, _ in events],
        [e.nats_subject for e, _ in events],
        [e.to_json() for e, _ in events],
        [headers for _, headers in events],
        _CHANNEL,
    )


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
            if rows:
                await self._bus.publish_many(
                    (r["subject"], r["body"], r["event_id"], _headers(r["headers"])) for r in rows
                )
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


def _headers(stored: str | dict[str, str] | None) -> dict[str, str]:
    if isinstance(stored, str):  # a pool without the jsonb codec
        loaded: dict[str, str] = json.loads(stored)
        return loaded
    return stored or {}
