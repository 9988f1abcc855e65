"""Event handling rate, latency and failures per consumer and event type.

``measured(consumer, handler)`` wraps a ``BatchHandler`` (``shared.bus``; ``measured_each``
a one-event ``Handler``, the runner's): each batch
counts its events on ``trainyard.events.handled`` by event type with ``outcome`` ok or failed
(failed: the handler raised; the bus then retries or dead-letters) and records the batch's
handling time on ``trainyard.events.handling.duration`` once per type in it. The ``type``
label is the event's type (``job.started``, a fixed set), never its NATS subject, which
ends in the job or node id.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from trainyard_platform.shared.bus import BatchHandler, Delivery, Handler
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.metrics import instrument

_handled = instrument("trainyard.events.handled")
_duration = instrument("trainyard.events.handling.duration")


def measured(consumer: str, handler: BatchHandler) -> BatchHandler:
    """``handler``, measured (see the module)."""

    async def handle(deliveries: Sequence[Delivery]) -> None:
        types = Counter(d.envelope.type for d in deliveries)
        started = time.perf_counter()
        outcome = "failed"
        try:
            await handler(deliveries)
            outcome = "ok"
        finally:
            elapsed = time.perf_counter() - started
            for event_type, count in types.items():
                labels = {"consumer": consumer, "type": event_type}
                _handled.add(count, {**labels, "outcome": outcome})
                _duration.record(elapsed, labels)

    return handle


def measured_each(consumer: str, handler: Handler) -> Handler:
    """``handler`` (one event at a time), measured (see the module)."""

    async def handle(envelope: Envelope[Payload]) -> None:
        labels = {"consumer": consumer, "type": envelope.type}
        started = time.perf_counter()
        outcome = "failed"
        try:
            await handler(envelope)
            outcome = "ok"
        finally:
            _handled.add(1, {**labels, "outcome": outcome})
            _duration.record(time.perf_counter() - started, labels)

    return handle
