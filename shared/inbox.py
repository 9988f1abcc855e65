"""Idempotent event handling: an effect and the record that it happened commit together.

``idempotent(pool, consumer, handler)`` turns a handler of ``(event, connection)`` into a
batch handler for ``Bus.consume_batches``: it opens one transaction, records
``(consumer, event id)`` in the inbox for every event of the batch, and runs the handler, in
order and inside each event's span, for the events not recorded before. JetStream redelivery
(a crash before the ack) therefore never applies an event twice, and a burst of events costs
one commit. Events the handler enqueues in the outbox commit with the same transaction; if
any event fails, none of the batch is applied. An optional ``guard`` runs once, first thing in
the transaction, for the whole batch (e.g. a leader check: it raises to refuse the batch).

``idempotent_batches(pool, consumer, handler)`` is the same with a handler of
``(deliveries, connection)`` that gets the batch's first-time deliveries at once, in order,
and opens their spans itself: for a consumer that applies runs of events in bulk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from trainyard_platform.shared.bus import BatchHandler, Delivery
from trainyard_platform.shared.events import Envelope, Payload

TransactionalHandler = Callable[[Envelope[Payload], asyncpg.Connection], Awaitable[None]]
TransactionalBatchHandler = Callable[[Sequence[Delivery], asyncpg.Connection], Awaitable[None]]
Guard = Callable[[asyncpg.Connection], Awaitable[None]]
"""Raises unless the transaction on this connection may go on."""


async def no_guard(_: asyncpg.Connection) -> None:
    return None


def idempotent(
    pool: asyncpg.Pool, consumer: str, handler: TransactionalHandler, *, guard: Guard = no_guard
) -> BatchHandler:
    async def each(deliveries: Sequence[Delivery], conn: asyncpg.Connection) -> None:
        for delivery in deliveries:
            with delivery.span(consumer):
                await handler(delivery.envelope, conn)

    return idempotent_batches(pool, consumer, each, guard=guard)


def idempotent_batches(
    pool: asyncpg.Pool,
    consumer: str,
    handler: TransactionalBatchHandler,
    *,
    guard: Guard = no_guard,
) -> BatchHandler:
    async def handle(deliveries: Sequence[Delivery]) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await guard(conn)
            rows = await conn.fetch(
                "INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::text[]) "
                "ON CONFLICT DO NOTHING RETURNING event_id",
                consumer,
                [d.envelope.id for d in deliveries],
            )
            first_time = {r["event_id"] for r in rows}
            fresh = []
            for delivery in deliveries:
                if delivery.envelope.id in first_time:
                    first_time.discard(delivery.envelope.id)  # a repeat inside the batch
                    fresh.append(delivery)
            await handler(fresh, conn)

    return handle
