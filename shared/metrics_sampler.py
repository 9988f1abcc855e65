"""Gauges read from PostgreSQL and JetStream on a timer, never on the scrape.

Contract:
- ``Sampler.gauge(name, read)`` registers catalogue gauge (or observed counter) ``name``
  (``shared.metrics``); ``Sampler.run(stop)`` calls every ``read`` once per
  ``interval_s`` (15 s) and keeps what it returned, which each scrape then reports. A scrape
  costs no query, so Prometheus (or a curious operator) cannot load the database.
- A reading that fails (the database or NATS unreachable) reports nothing until it succeeds
  again: a missing series means "unknown" (alert on ``absent``), never a stale number.
- ``common_readings`` are those of every service with a database and a bus: the outbox's
  backlog, lag and parked rows, the consumer's lag (messages not yet delivered to it, and
  delivered but not acknowledged) and the dead letters waiting in its dead-letter subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import asyncpg
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.deadletters import DeadLetters
from trainyard_platform.shared.metrics import CATALOGUE

log = logging.getLogger(__name__)

Readings = list[tuple[float, dict[str, str]]]
Read = Callable[[], Awaitable[Readings]]
INTERVAL_S: Final = 15.0


class Sampler:
    """Runs the registered readings on a timer (see the module)."""

    def __init__(self, interval_s: float = INTERVAL_S, meter: metrics.Meter | None = None):
        self._interval_s = interval_s
        self._meter = meter or metrics.get_meter("trainyard")
        self._reads: dict[str, Read] = {}
        self._last: dict[str, Readings] = {}

    def gauge(self, name: str, read: Read) -> None:
        spec = CATALOGUE[name]
        self._reads[name] = read

        def callback(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, labels) for value, labels in self._last.get(name, [])]

        if spec.kind == "gauge":
            self._meter.create_observable_gauge(
                name, callbacks=[callback], unit=spec.unit, description=spec.description
            )
        elif spec.kind == "counter":  # a total the database keeps, reported as it is
            self._meter.create_observable_counter(
                name, callbacks=[callback], unit=spec.unit, description=spec.description
            )
        else:
            raise ValueError(f"{name} is a {spec.kind}: record it where it happens")

    async def sample_once(self) -> None:
        for name, read in list(self._reads.items()):
            try:
                self._last[name] = await read()
            except Exception as exc:  # unknown, not stale: see the module
                self._last.pop(name, None)
                log.debug("metric %s not read: %s", name, exc)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)


_OUTBOX = """SELECT count(*) FILTER (WHERE parked_at IS NULL) AS backlog,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)), 0)
           AS lag,
       count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked
FROM outbox WHERE published_at IS NULL"""


def common_readings(sampler: Sampler, pool: asyncpg.Pool | None, bus: Bus, consumer: str) -> None:
    """Register the readings every service shares (see the module); ``pool`` None: a
    service without an outbox (the runner)."""
    if pool is not None:
        outbox: dict[str, float] = {}

        async def read_outbox() -> dict[str, float]:
            outbox.clear()  # a failed read leaves lag and parked unknown too
            async with pool.acquire() as conn:
                row = await conn.fetchrow(_OUTBOX)
            assert row is not None
            outbox.update(backlog=row["backlog"], lag=float(row["lag"]), parked=row["parked"])
            return outbox

        async def backlog() -> Readings:
            return [((await read_outbox())["backlog"], {})]

        async def lag() -> Readings:
            return [(outbox["lag"], {})] if outbox else []

        async def parked() -> Readings:
            return [(outbox["parked"], {})] if outbox else []

        # Registered in this order: one query serves the three (``backlog`` runs it).
        sampler.gauge("trainyard.outbox.backlog", backlog)
        sampler.gauge("trainyard.outbox.lag", lag)
        sampler.gauge("trainyard.outbox.parked", parked)

    async def consumer_lag() -> Readings:
        info = await bus.jetstream.consumer_info(bus.settings.stream, consumer)
        return [
            (float(info.num_pending or 0), {"consumer": consumer, "state": "undelivered"}),
            (float(info.num_ack_pending or 0), {"consumer": consumer, "state": "unacknowledged"}),
        ]

    dead_letters = DeadLetters(bus, consumer)

    async def waiting() -> Readings:
        return [(float(await dead_letters.count()), {"consumer": consumer})]

    sampler.gauge("trainyard.consumer.lag", consumer_lag)
    sampler.gauge("trainyard.deadletters.waiting", waiting)
