"""Idempotent event handling: an effect and the record that it happened commit together.

``idempotent(pool, consumer, handler)`` turns a handler of ``(event, connection)`` into a
batch handler for ``Bus.consume_batches``: it opens one transaction, records
``(consumer, sender, event id)`` in the inbox for every event of the batch, and runs the
handler, in order and inside each event's span, for the events not recorded before. An event
is one per source and id (CloudEvents), and the sender is its source and, for a runner's
event, the node its subject names (``trust.sender_of``: every node says one source), so no
publisher, no runner node either, can keep another's event out by sending an event of its
own under that id first. JetStream redelivery
(a crash before the ack) therefore never applies an event twice, and a burst of events costs
one commit. Events the handler enqueues in the outbox commit with the same transaction; if
any event fails, none of the batch is applied. An optional ``guard`` runs once, first thing in
the transaction, for the whole batch (e.g. a leader check: it raises to refuse the batch).

``idempotent_batches(pool, consumer, handler)`` is the same with a handler of
``(deliveries, connection)`` that gets the batch's first-time deliveries at once, in order,
and opens their spans itself: for a consumer that applies runs of events in bulk.

``prepared_batches(pool, consumer, prepare)`` is ``idempotent_batches`` for a consumer whose
handling has a slow part that is not the database's (copying or reading an object, hashing
a large file, an HTTP call): nothing slow may run on the transaction's connection, since it
holds one of the pool's connections (every HTTP request and other handler of the service
waits for one) and an open transaction (which holds back PostgreSQL's vacuum) all along.
``prepare(deliveries)`` gets the deliveries it ``wants`` (all, by default) that the inbox
has not recorded when the batch begins (read on a connection given back at once; not read
when it wants none of the batch), runs holding no connection, and answers
the transactional handler that finishes them, which then runs as ``idempotent_batches``
runs one. What ``prepare`` does must be safe to repeat and to go unused: the batch may fail
and be prepared again (one event at a time, or after an outage), and another replica may
apply an event first. The transactional handler decides again on what it reads in the
transaction, uses what was prepared only where it still fits, and raises (``bus.NotYet``:
the event is prepared again when redelivered) where nothing fitting was prepared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from trainyard_platform.shared.bus import BatchHandler, Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.trust import sender_of

TransactionalHandler = Callable[[Envelope[Payload], asyncpg.Connection], Awaitable[None]]
TransactionalBatchHandler = Callable[[Sequence[Delivery], asyncpg.Connection], Awaitable[None]]
Guard = Callable[[asyncpg.Connection], Awaitable[None]]
"""Raises unless the transaction on this connection may go on."""
Prepare = Callable[[Sequence[Delivery]], Awaitable[TransactionalBatchHandler]]
"""Does the slow part of handling these deliveries, holding no connection, and answers the
transactional handler that finishes them (``prepared_batches``)."""


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
        await _apply(pool, consumer, deliveries, handler, guard)

    return handle


def _every(_: Delivery) -> bool:
    return True


def prepared_batches(
    pool: asyncpg.Pool,
    consumer: str,
    prepare: Prepare,
    *,
    guard: Guard = no_guard,
    wants: Callable[[Delivery], bool] = _every,
) -> BatchHandler:
    async def handle(deliveries: Sequence[Delivery]) -> None:
        wanted = [d for d in deliveries if wants(d)]
        if wanted:
            async with pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT source, event_id FROM inbox "
                    "WHERE consumer = $1 AND event_id = ANY($2::text[])",
                    consumer,
                    [d.envelope.id for d in wanted],
                )
            seen = {(r["source"], r["event_id"]) for r in rows}
            wanted = [d for d in wanted if not _recorded(d, seen)]
        handler = await prepare(wanted)
        await _apply(pool, consumer, deliveries, handler, guard)

    return handle


async def _apply(
    pool: asyncpg.Pool,
    consumer: str,
    deliveries: Sequence[Delivery],
    handler: TransactionalBatchHandler,
    guard: Guard,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await guard(conn)
        rows = await conn.fetch(
            "INSERT INTO inbox (consumer, source, event_id) "
            "SELECT $1, u.sender, u.event_id "
            "FROM unnest($2::text[], $3::text[], $5::text[]) AS u(sender, event_id, source) "
            "WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = $1 "
            "AND i.event_id = u.event_id AND i.source IN ($4, u.source)) "
            "ON CONFLICT DO NOTHING RETURNING source, event_id",
            consumer,
            [_sender(d) for d in deliveries],
            [d.envelope.id for d in deliveries],
            _ANY_SOURCE,
            [d.envelope.source for d in deliveries],
        )
        first_time = {(r["source"], r["event_id"]) for r in rows}
        fresh = []
        for delivery in deliveries:
            key = (_sender(delivery), delivery.envelope.id)
            if key in first_time:
                first_time.discard(key)  # a repeat inside the batch
                fresh.append(delivery)
        await handler(fresh, conn)


_ANY_SOURCE = ""
"""The source of inbox rows recorded before the inbox kept sources: such a row counts for
an event of its id from any source. A row of a runner's event recorded before the inbox kept
its node (source ``trainyard/runner``) counts for an event of its id from any node."""


def _sender(delivery: Delivery) -> str:
    return sender_of(delivery.envelope.source, delivery.envelope.data)


def _recorded(delivery: Delivery, seen: set[tuple[str, str]]) -> bool:
    """Whether ``seen`` (inbox rows as (sender, event id)) holds ``delivery``'s event."""
    event_id = delivery.envelope.id
    return any(
        (who, event_id) in seen
        for who in (_sender(delivery), delivery.envelope.source, _ANY_SOURCE)
    )
