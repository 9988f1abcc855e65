"""How the runner's events reach NATS: in the job's trace, in order, retried until sent.

The runner has no database and so no transactional outbox. Instead every event has a
deterministic id (``domain.event_id``), so publishing it again after an error is harmless:
JetStream drops the duplicate. ``JobEvents`` is one job's ordered queue of events, published
one after the other by a background task that retries each until it is sent; the terminal
event additionally sits in the ledger until then (see ``ledger``).

Every event of a job is published under a span whose parent is the context captured when
the job's ``allocation.granted`` was handled, so all of the job's events share its trace;
except its progress reports and metric batches (``shared.bus.UNTRACED_TYPES``), several a
second for as long as the job runs: they are published outside any trace, and the job's
other report spans (``checkpoint.saved``, the terminal event) summarise them instead
(``REPORT_SUMMARY``), so a job's trace has a span count bounded by its checkpoints, not by
its length.

What was published stays said only while the stream keeps it, and a report must never
reach a stream before the grant it answers (the submission's view drops a report about an
allocation it has not heard of). So the runner remembers, per allocation, the stream (its
identity, ``Bus.stream_created``) it received the grant from, and the job events it
published (``Journal``: the last ``JOURNAL_EVENTS``, within the stream's retention; not
``job.progress``, which the next report supersedes, nor ``job.metrics``, whose points are
too many to hold: after a lost store the points said before it are in the object store's
metric log of the job only). An allocation's event waits (up to
``GRANT_WAIT_S``) while the stream is not the one its grant came from: NATS lost its store
and the stream was made again. The scheduler then publishes its retained grants again; when
the grant of an allocation this node knows arrives again (or a revocation of one it
ended), ``say_again`` publishes that allocation's events again, in order with their ids (or,
after a restart, the start and the end its ledger kept), and notes the new stream, so the
waiting events follow. Consumers drop what they had applied. Heartbeats need nothing: the
next one says it all again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from weakref import WeakKeyDictionary

from opentelemetry import context as otel_context
from opentelemetry import trace

from trainyard_platform.shared.bus import UNTRACED_TYPES, Bus, infrastructure_fault
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobMetrics, JobProgress
from trainyard_platform.shared.telemetry import tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

_FIRST_RETRY_S = 0.2
_MAX_RETRY_S = 10.0
JOURNAL_EVENTS = 20_000
GRANT_WAIT_S = 600.0
"""How long an allocation's event waits for its grant to be in the stream again (then it is
published all the same: the scheduler may be down for long, or the grant aged out)."""


Said = tuple[Envelope[Payload], otel_context.Context | None]

REPORT_SUMMARY = (
    "trainyard.reports.progress",
    "trainyard.reports.metric_batches",
    "trainyard.reports.metric_points",
    "trainyard.reports.step",
)
"""The attributes of a job's report span that summarise the untraced reports before it:
progress reports and metric batches emitted (and the points in them) since the runner began
supervising the job, and the last step a progress report gave (absent before the first)."""


class Journal:
    """The job events a runner published, by allocation (see the module docstring)."""

    def __init__(self, max_events: int = JOURNAL_EVENTS) -> None:
        self._max_events = max_events
        self._events = 0
        self._by_allocation: OrderedDict[str, list[tuple[float, Said]]] = OrderedDict()
        self.granted_in: dict[str, datetime] = {}
        """The stream (its identity) each allocation's grant was last received from."""
        self.saying: set[str] = set()
        """Allocations whose events are being said again now."""

    def record(self, envelope: Envelope[Payload], parent: otel_context.Context | None) -> None:
        allocation_id = getattr(envelope.data, "allocation_id", None)
        if isinstance(envelope.data, JobProgress | JobMetrics) or not isinstance(
            allocation_id, str
        ):
            return
        said = self._by_allocation.setdefault(allocation_id, [])
        said.append((time.monotonic(), (envelope, parent)))
        self._by_allocation.move_to_end(allocation_id)
        self._events += 1
        while self._events > self._max_events and self._by_allocation:
            gone, dropped = self._by_allocation.popitem(last=False)
            self._events -= len(dropped)
            self.granted_in.pop(gone, None)

    def of(self, allocation_id: str, max_age_s: float) -> list[Said]:
        """What was published about ``allocation_id`` in the last ``max_age_s`` s, in order."""
        oldest = time.monotonic() - max_age_s
        return [said for at, said in self._by_allocation.get(allocation_id, []) if at >= oldest]


_journals: WeakKeyDictionary[Bus, Journal] = WeakKeyDictionary()


def journal(bus: Bus) -> Journal:
    """The journal of the job events published on ``bus``."""
    found = _journals.get(bus)
    if found is None:
        found = _journals[bus] = Journal()
    return found


async def note_grant(bus: Bus, allocation_id: str) -> None:
    """The grant of ``allocation_id`` was just received: the stream as it is now holds it."""
    try:
        created = await bus.stream_created()
    except Exception as exc:  # NATS away: nothing noted, its events will not wait
        log.warning("allocation %s: the stream's identity is unknown (%s)", allocation_id, exc)
        return
    if created is not None:
        journal(bus).granted_in[allocation_id] = created


async def say_again(bus: Bus, allocation_id: str, stored: Sequence[Said] = ()) -> None:
    """The grant (or revocation) of ``allocation_id`` came again: publish again what this
    runner said about it (its journal; without one, ``stored``: the start and the end its
    ledger kept), in order, same ids, and note that the stream holds its grant."""
    record = journal(bus)
    events = record.of(allocation_id, bus.settings.retention_hours * 3600)
    if not events:
        events = list(stored)
    record.saying.add(allocation_id)
    try:
        await note_grant(bus, allocation_id)
        if events:
            log.info("allocation %s: saying its %d events again", allocation_id, len(events))
        for envelope, parent in events:
            await publish_until_sent(bus, envelope, parent, record=False, after_grant=False)
    finally:
        record.saying.discard(allocation_id)


async def _after_grant(bus: Bus, envelope: Envelope[Payload]) -> None:
    """Wait (at most ``GRANT_WAIT_S``) until the stream is the one the grant of the event's
    allocation came from, and nothing is being said again about it (module docstring)."""
    allocation_id = getattr(envelope.data, "allocation_id", None)
    record = journal(bus)
    if not isinstance(allocation_id, str) or allocation_id not in record.granted_in:
        return
    deadline = time.monotonic() + GRANT_WAIT_S
    told = False
    while time.monotonic() < deadline:
        answered = True
        if allocation_id not in record.saying:
            try:
                created = await bus.stream_created()
            except Exception as exc:  # NATS away: publishing would fail too
                answered, created = False, None
                if infrastructure_fault(exc) is not None:
                    bus.nats_away.failed(exc)  # the outage's one line, not this event's
            if created is not None and created == record.granted_in.get(allocation_id):
                return
        if answered and not told:  # NATS away says nothing of the stream: no line of it
            log.warning(
                "allocation %s: %s waits until its grant is in the event stream again "
                "(the stream was lost and made again)",
                allocation_id,
                envelope.type,
            )
            told = True
        await asyncio.sleep(0.5)
    log.warning(
        "allocation %s: its grant did not come again; publishing all the same", allocation_id
    )


async def publish_in_trace(
    bus: Bus,
    envelope: Envelope[Payload],
    parent: otel_context.Context | None,
    *,
    record: bool = True,
    summary: dict[str, int] | None = None,
) -> None:
    """Publish once, under a ``runner report`` span that is a child of ``parent`` (with the
    ``summary`` attributes, ``REPORT_SUMMARY``), or under none for an event of
    ``UNTRACED_TYPES``; then remember it in the bus's ``journal`` (unless ``record`` is
    false)."""
    if envelope.type in UNTRACED_TYPES:
        await bus.publish(envelope)
    else:
        attributes: dict[str, str | int] = {
            "cloudevents.event_type": envelope.type,
            "trainyard.subject": envelope.subject,
            **(summary or {}),
        }
        with _tracer.start_as_current_span(
            "runner report", context=parent, kind=trace.SpanKind.INTERNAL, attributes=attributes
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
    after_grant: bool = True,
    summary: dict[str, int] | None = None,
) -> None:
    """Publish, retrying with growing pauses until the server has it (or we're cancelled);
    with ``after_grant``, only into a stream that holds the allocation's grant (the module
    docstring)."""
    delay = _FIRST_RETRY_S
    while True:
        try:
            if after_grant:
                await _after_grant(bus, envelope)
            await publish_in_trace(bus, envelope, parent, record=record, summary=summary)
        except Exception as exc:  # any NATS or connection error: the event must still go out
            if infrastructure_fault(exc) is not None:
                # NATS away: one line for the outage (``Bus.nats_away``), not one a try.
                bus.nats_away.failed(exc)
            else:
                log.warning(
                    "publishing %s %s failed (%s); retrying", envelope.type, envelope.id, exc
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_S)
        else:
            bus.nats_away.answered()
            return


MAX_PENDING_METRIC_BATCHES = 256
"""``job.metrics`` batches a job may have waiting to be published (up to 512,000 points);
while NATS is away longer than that lasts, newer batches are dropped (counted and logged:
the job's metric log in the object store keeps every point), so a chatty job cannot fill
the runner's memory. Every other event always waits its turn."""


class JobEvents:
    """One job's events, published in the order they were emitted."""

    def __init__(
        self,
        bus: Bus,
        parent: otel_context.Context | None,
        name: str,
        max_pending_metrics: int = MAX_PENDING_METRIC_BATCHES,
    ) -> None:
        self._bus = bus
        self._parent = parent
        self._name = name
        self._queue: asyncio.Queue[tuple[Envelope[Payload], dict[str, int]] | None] = (
            asyncio.Queue()
        )
        self._max_pending_metrics = max_pending_metrics
        self._pending_metrics = 0
        self.dropped_points = 0
        """Metric points not published because too many batches waited (see above)."""
        self._reports = dict.fromkeys(REPORT_SUMMARY[:3], 0)
        self._step: int | None = None
        self._task = asyncio.create_task(self._pump(), name=f"events {name}")

    def emit(self, envelope: Envelope[Payload]) -> None:
        """Queue an event; it is published after every event emitted before it (a
        ``job.metrics`` beyond ``max_pending_metrics`` waiting ones is dropped instead)."""
        if isinstance(envelope.data, JobProgress):
            self._reports["trainyard.reports.progress"] += 1
            self._step = envelope.data.step
        if isinstance(envelope.data, JobMetrics):
            self._reports["trainyard.reports.metric_batches"] += 1
            self._reports["trainyard.reports.metric_points"] += len(envelope.data.points)
            if self._pending_metrics >= self._max_pending_metrics:
                if self.dropped_points == 0:
                    log.warning(
                        "job %s: %d metric batches wait to be published; dropping newer "
                        "ones until they go (every point is in the job's metric log)",
                        self._name,
                        self._pending_metrics,
                    )
                self.dropped_points += len(envelope.data.points)
                return
            self._pending_metrics += 1
        self._queue.put_nowait((envelope, self.summary()))

    async def close(self) -> None:
        """Wait until every emitted event is published."""
        self._queue.put_nowait(None)
        await self._task

    def cancel(self) -> None:
        self._task.cancel()

    @property
    def parent(self) -> otel_context.Context | None:
        """The trace context the job's events are published in (its grant's)."""
        return self._parent

    def summary(self) -> dict[str, int]:
        """The ``REPORT_SUMMARY`` attributes as of now (an event's span gets them as of its
        ``emit``)."""
        step = {} if self._step is None else {"trainyard.reports.step": self._step}
        return self._reports | step

    async def _pump(self) -> None:
        while (queued := await self._queue.get()) is not None:
            envelope, summary = queued
            await publish_until_sent(self._bus, envelope, self._parent, summary=summary)
            if isinstance(envelope.data, JobMetrics):
                self._pending_metrics -= 1
        if self.dropped_points:
            log.warning(
                "job %s: %d metric points were not published (NATS was away too long); its "
                "metric log in the object store has them",
                self._name,
                self.dropped_points,
            )
