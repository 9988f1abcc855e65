"""Event handling outcomes and times per consumer and event type, as the bus settles them.

Contract (``shared.bus`` calls these; handlers report nothing themselves):
- ``settled(consumer, deliveries, outcome)`` counts each delivery of an event once, on
  ``trainyard.events.handled``, when the bus settles it after its handler ran: ``ok``
  (applied and acknowledged), ``failed`` (its handler raised; it comes again after a delay)
  or ``dead_lettered`` (its handler rejected it, or failed on its ``max_deliver``-th
  delivery). A batch that failed whole and is then handled one event at a time is no
  outcome: each of its events counts its own. Retries in place while a dependency is away
  are no outcome either (``trainyard.consumer.outage_retries`` counts them), nor is a
  delivery handed back on stop: it counts when it comes again.
- ``applied(consumer, deliveries, seconds)`` records on ``trainyard.events.handling.duration``
  the time of the attempt that applied a batch, once per event type in it; attempts that
  failed, and waits out of an outage, applied nothing.
- The ``type`` label is the event's type (``job.started``, a fixed set), never its NATS
  subject, which ends in the job or node id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from opentelemetry import metrics

from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.metrics import instrument

Outcome = Literal["ok", "failed", "dead_lettered"]


class EventMetrics:
    """The two instruments of the module docstring, made on ``meter``."""

    def __init__(self, meter: metrics.Meter | None = None) -> None:
        self._handled = instrument("trainyard.events.handled", meter)
        self._duration = instrument("trainyard.events.handling.duration", meter)

    def settled(self, consumer: str, events: Iterable[Envelope[Payload]], outcome: Outcome) -> None:
        for event_type, count in Counter(e.type for e in events).items():
            self._handled.add(count, {"consumer": consumer, "type": event_type, "outcome": outcome})

    def applied(self, consumer: str, events: Sequence[Envelope[Payload]], seconds: float) -> None:
        for event_type in {e.type for e in events}:
            self._duration.record(seconds, {"consumer": consumer, "type": event_type})
