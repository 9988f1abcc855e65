"""How the runner's events reach NATS: in the job's trace, in order, retried until sent.

The runner has no database and so no transactional outbox. Instead every event has a
deterministic id (``domain.event_id``), so publishing it again after an error is harmless:
JetStream drops the duplicate. ``JobEvents`` is one job's ordered queue of events, published
one after the other by a background task that retries each until it is sent; the terminal
event additionally sits in the ledger until then (see ``ledger``).

Every event of a job is published under a span whose parent is the context captured when
the job's ``allocation.granted`` was handled, so all of the job's events share its trace.

What was published stays said only while the stream keeps it. The runner remembers the job
events it published (``Journal``: the last ``JOURNAL_EVENTS``, within the stream's
retention; not ``job.progress``, which the next report supersedes), and
``say_again_when_stream_lost`` publishes them again, in order with their ids, when the event
stream was lost and made again (NATS lost its store): consumers drop what they had applied.
Heartbeats need nothing: the next one says it all again. A runner process that starts after
the loss knows only its ledger (``agent.recover``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from weakref import WeakKeyDictionary

from opentelemetry import context as otel_context
from opentelemetry import trace

from shared.bus import Bus
from shared.events import Envelope, Payload
from shared.events.payloads import JobProgress
from shared.outbox import watch_stream
from shared.telemetry import tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

_FIRST_RETRY_S = 0.2
_MAX_RETRY_S = 10.0
JOURNAL_EVENTS = 20_000


class Journal:
    """The job events a runner published (see the module docstring), oldest first."""

    def __init__(self, max_events: int = JOURNAL_EVENTS) -> None:
        self._sent: deque[tuple[float, Envelope[Payload], otel_context.Context | None]] = deque(
            maxlen=max_events
        )

    def record(self, envelope: Envelope[Payload], parent: otel_context.Context | None) -> None:
        if not isinstance(envelope.data, JobProgress):
            self._sent.append((time.monotonic(), envelope, parent))

    def since(
        self, max_age_s: float
    ) -> list[tuple[Envelope[Payload], otel_context.Context | None]]:
        """What was published within the last ``max_age_s`` seconds, in order."""
        oldest = time.monotonic() - max_age_s
        return [(envelope, parent) for at, envelope, parent in self._sent if at >= oldest]


_journals: WeakKeyDictionary[Bus, Journal] = WeakKeyDictionary()


def journal(bus: Bus) -> Journal:
    """The journal of the job events published on ``bus``."""
    found = _journals.get(bus)
    if found is None:
        found = _journals[bus] = Journal()
    return found


async def say_again_when_stream_lost(bus: Bus, stop: asyncio.Event) -> None:
    """Until ``stop``: when the event stream was lost and made again, publish the journal of
    ``bus`` again (module docstring)."""

    async def say_again() -> None:
        events = journal(bus).since(bus.settings.retention_hours * 3600)
        log.warning("publishing the %d job events of the lost stream again", len(events))
        for envelope, parent in events:
            if stop.is_set():
                return
            await publish_until_sent(bus, envelope, parent, record=False)

    await watch_stream(bus, say_again, stop)


async def publish_in_trace(
    bus: Bus,
    envelope: Envelope[Payload],
    parent: otel_context.Context | None,
    *,
    record: bool = True,
) -> None:
    """Publish once, under a ``runner report`` span that is a child of ``parent``; then
    remember it in the bus's ``journal`` (unless ``record`` is false)."""
    with _tracer.start_as_current_span(
        "runner report",
        context=parent,
        kind=trace.SpanKind.INTERNAL,
        attributes={"cloudevents.event_type": envelope.type, "trainyard.subject": envelope.subject},
    ):
        await bus.publish(envelope)
    if record:
        journal(bus).record(envelope, parent)


async def publish_until_sent(
    bus: Bus,
    envelope: Envelope[Payload],
    parent: otel_context.Context | None,
    *,
    record: bool = True,
) -> None:
    """Publish, retrying with growing pauses until the server has it (or we're cancelled)."""
    delay = _FIRST_RETRY_S
    while True:
        try:
            await publish_in_trace(bus, envelope, parent, record=record)
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
