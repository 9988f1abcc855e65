"""How the runner's events reach NATS: in the job's trace, in order, retried until sent.

The runner has no database and so no transactional outbox. Instead every event has a
deterministic id (``domain.event_id``), so publishing it again after an error is harmless:
JetStream drops the duplicate. ``JobEvents`` is one job's ordered queue of events, published
one after the other by a background task that retries each until it is sent; the terminal
event additionally sits in the ledger until then (see ``ledger``).

Every event of a job is published under a span whose parent is the context captured when
the job's ``allocation.granted`` was handled, so all of the job's events share its trace.
"""

from __future__ import annotations

import asyncio
import logging

from opentelemetry import context as otel_context
from opentelemetry import trace

from shared.bus import Bus
from shared.events import Envelope, Payload
from shared.telemetry import tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

_FIRST_RETRY_S = 0.2
_MAX_RETRY_S = 10.0


async def publish_in_trace(
    bus: Bus, envelope: Envelope[Payload], parent: otel_context.Context | None
) -> None:
    """Publish once, under a ``runner report`` span that is a child of ``parent``."""
    with _tracer.start_as_current_span(
        "runner report",
        context=parent,
        kind=trace.SpanKind.INTERNAL,
        attributes={"cloudevents.event_type": envelope.type, "trainyard.subject": envelope.subject},
    ):
        await bus.publish(envelope)


async def publish_until_sent(
    bus: Bus, envelope: Envelope[Payload], parent: otel_context.Context | None
) -> None:
    """Publish, retrying with growing pauses until the server has it (or we're cancelled)."""
    delay = _FIRST_RETRY_S
    while True:
        try:
            await publish_in_trace(bus, envelope, parent)
            return
        except Exception as exc:  # any NATS or connection error: the event must still go out
            log.warning("publishing %s %s failed (%s); retrying", envelope.type, envelope.id, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_S)


class JobEvents:
    """One job's events, published in the order they were emitted."""

    def __init__(self, bus: Bus, parent: otel_context.Context | None, name: str) -> None:
        self._bus = bus
        self._parent = parent
        self._queue: asyncio.Queue[Envelope[Payload] | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._pump(), name=f"events {name}")

    def emit(self, envelope: Envelope[Payload]) -> None:
        """Queue an event; it is published after every event emitted before it."""
        self._queue.put_nowait(envelope)

    async def close(self) -> None:
        """Wait until every emitted event is published."""
        self._queue.put_nowait(None)
        await self._task

    def cancel(self) -> None:
        self._task.cancel()

    async def _pump(self) -> None:
        while (envelope := await self._queue.get()) is not None:
            await publish_until_sent(self._bus, envelope, self._parent)
