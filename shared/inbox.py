"""Idempotent event handling: an effect and the record that it happened commit together.

``idempotent(pool, consumer, handler)`` turns a handler of ``(event, connection)`` into a bus
handler: it opens a transaction, records ``(consumer, event id)`` in the inbox, and runs the
handler in that same transaction — unless the event was already recorded, in which case it
does nothing. JetStream redelivery (a crash before the ack) therefore never applies an event
twice. Events the handler enqueues in the outbox commit with the same transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from shared.bus import Handler
from shared.events import Envelope, Payload

TransactionalHandler = Callable[[Envelope[Payload], asyncpg.Connection], Awaitable[None]]


def idempotent(pool: asyncpg.Pool, consumer: str, handler: TransactionalHandler) -> Handler:
    async def handle(envelope: Envelope[Payload]) -> None:
        async with pool.acquire() as conn, conn.transaction():
            first_time = await conn.fetchval(
                "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) "
                "ON CONFLICT DO NOTHING RETURNING true",
                consumer,
                envelope.id,
            )
            if first_time:
                await handler(envelope, conn)

    return handle
