"""The event bus on NATS JetStream.

Contract:
- ``Bus.connect`` creates the event stream (``trainyard.>``) and the dead-letter stream
  (``deadletter.>``) idempotently, and drains the connection on exit.
- ``publish`` sends an envelope with ``Nats-Msg-Id`` = event id, so a re-publish inside the
  duplicate window is dropped by the server (this is what makes the outbox relay exactly-once).
- ``consume`` runs a durable pull consumer: each message is parsed, handled, and acknowledged
  only after the handler returned (for database services: after its transaction committed).
  A handler error leads to a delayed redelivery; after ``max_deliver`` deliveries, or at once
  for bytes that are not a valid event, an event whose ``source`` may not send its type
  (``shared.events.trust``, checked before any handler), or a handler's ``Reject``, the
  message is copied to
  ``deadletter.<consumer>`` with the reason and terminated. Nothing crash-loops.
- ``consume_batches`` is the same for a handler that applies several events all-or-nothing
  (``shared.inbox.idempotent``: one transaction): each fetched batch is handed over whole
  and acknowledged after it returns, so a burst costs one commit, not one per event. If the
  batch fails, its events are handled again one at a time with the rules above, so one bad
  event costs its neighbours nothing but a retry.
- Each event is handled in a span whose parent is the trace context from its headers
  (``Delivery.span``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError
from opentelemetry import trace

from shared.events import Envelope, EventParseError, Payload, parse_envelope
from shared.events.trust import forged_because
from shared.settings import NatsSettings
from shared.telemetry import extract, inject, tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

EVENT_SUBJECTS = "trainyard.>"
DEADLETTER_PREFIX = "deadletter"
REASON_HEADER = "Trainyard-Dead-Letter-Reason"
ORIGINAL_SUBJECT_HEADER = "Trainyard-Original-Subject"

Handler = Callable[[Envelope[Payload]], Awaitable[None]]
"""Handles one event."""


@dataclass(frozen=True)
class Delivery:
    """An event as it came off the stream, with the headers its trace context travels in."""

    envelope: Envelope[Payload]
    headers: Mapping[str, str] = field(default_factory=dict)

    @contextmanager
    def span(self, consumer: str) -> Iterator[trace.Span]:
        """The consumer span of handling this event, inside the producer's trace."""
        with _tracer.start_as_current_span(
            f"{self.envelope.type} process",
            context=extract(dict(self.headers)),
            kind=trace.SpanKind.CONSUMER,
            attributes={**_attrs(self.envelope), "messaging.consumer.group.name": consumer},
        ) as span:
            yield span


BatchHandler = Callable[[Sequence[Delivery]], Awaitable[None]]
"""Applies all the deliveries or, by raising, none of them; opens each one's span."""


class Reject(Exception):
    """Raised by a handler for an event that can never be applied; it is dead-lettered at once."""


class Bus:
    """A JetStream connection with Trainyard's publish and consume rules."""

    def __init__(self, nc: NatsClient, settings: NatsSettings) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._settings = settings

    @classmethod
    @asynccontextmanager
    async def connect(cls, settings: NatsSettings, name: str) -> AsyncIterator[Bus]:
        """Connect, make sure the streams exist, and drain on exit."""
        nc = await nats.connect(
            settings.url, name=name, max_reconnect_attempts=-1, **_auth(settings)
        )
        bus = cls(nc, settings)
        try:
            await bus.ensure_streams()
            yield bus
        finally:
            if nc.is_connected:
                await nc.drain()
            else:
                await nc.close()

    @property
    def jetstream(self) -> JetStreamContext:
        return self._js

    @property
    def nats(self) -> NatsClient:
        return self._nc

    async def ping(self) -> bool:
        """Readiness: connected, and JetStream answers."""
        if not self._nc.is_connected:
            return False
        await self._js.stream_info(self._settings.stream)
        return True

    async def ensure_streams(self) -> None:
        # Dead letters wait for an operator, however long that takes.
        events_max_age = self._settings.retention_hours * 3600
        for name, subjects, max_age in (
            (self._settings.stream, [EVENT_SUBJECTS], events_max_age),
            (self._settings.deadletter_stream, [f"{DEADLETTER_PREFIX}.>"], None),
        ):
            config = api.StreamConfig(
                name=name,
                subjects=subjects,
                storage=api.StorageType.FILE,
                retention=api.RetentionPolicy.LIMITS,
                max_age=max_age,
                duplicate_window=self._settings.duplicate_window_seconds,
            )
            try:
                await self._js.add_stream(config)
            except BadRequestError:
                # Exists with another configuration (e.g. an older duplicate window).
                await self._js.update_stream(config)

    async def publish(
        self, envelope: Envelope[Payload], headers: dict[str, str] | None = None
    ) -> None:
        """Publish one event now, with the current trace context (no outbox: for services
        without a database, such as the runner, whose event ids are deterministic)."""
        with _tracer.start_as_current_span(
            f"{envelope.type} publish", kind=trace.SpanKind.PRODUCER, attributes=_attrs(envelope)
        ):
            await self.publish_raw(
                envelope.nats_subject, envelope.to_json(), envelope.id, inject(headers)
            )

    async def publish_raw(
        self, subject: str, body: bytes, event_id: str, headers: dict[str, str]
    ) -> None:
        await self._js.publish(
            subject,
            body,
            timeout=self._settings.publish_timeout_seconds,
            headers={**headers, "Nats-Msg-Id": event_id},
        )

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        """Publish ``(subject, body, event id, headers)`` messages in order, pipelined: all are
        sent before the first acknowledgement is awaited. Raises if any was not stored."""
        acks = [
            await self._js.publish_async(
                subject, body, headers={**headers, "Nats-Msg-Id": event_id}
            )
            for subject, body, event_id, headers in messages
        ]
        async with asyncio.timeout(self._settings.publish_timeout_seconds):
            await asyncio.gather(*acks)

    async def consume(
        self,
        consumer: str,
        subjects: list[str],
        handler: Handler,
        stop: asyncio.Event,
        batch: int = 16,
    ) -> None:
        """Handle messages of ``subjects`` in order, one at a time, until ``stop`` is set, then
        return after the batch in hand is finished (graceful drain)."""

        async def each(deliveries: Sequence[Delivery]) -> None:
            for delivery in deliveries:
                with delivery.span(consumer):
                    await handler(delivery.envelope)

        await self._pull(consumer, subjects, each, stop, batch, atomic=False)

    async def consume_batches(
        self,
        consumer: str,
        subjects: list[str],
        handler: BatchHandler,
        stop: asyncio.Event,
        batch: int = 64,
    ) -> None:
        """Like ``consume``, handing each fetched batch (up to ``batch`` events, in order) to an
        all-or-nothing ``handler`` at once."""
        await self._pull(consumer, subjects, handler, stop, batch, atomic=True)

    async def _pull(
        self,
        consumer: str,
        subjects: list[str],
        handler: BatchHandler,
        stop: asyncio.Event,
        batch: int,
        atomic: bool,
    ) -> None:
        config = api.ConsumerConfig(
            durable_name=consumer,
            filter_subjects=subjects,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            max_deliver=self._settings.max_deliver,
            ack_wait=self._settings.ack_wait_seconds,
        )
        await self._ensure_consumer(config)
        sub = await self._js.pull_subscribe_bind(durable=consumer, stream=self._settings.stream)
        try:
            while not stop.is_set():
                try:
                    messages = await sub.fetch(batch, timeout=0.5)
                except (TimeoutError, NatsTimeoutError):
                    continue
                parsed = [p for p in [await self._parse(consumer, m) for m in messages] if p]
                if atomic and len(parsed) > 1 and await self._handle_all(parsed, handler):
                    continue
                for msg, delivery in parsed:
                    await self._handle(consumer, msg, delivery, handler)
        finally:
            await sub.unsubscribe()

    async def _ensure_consumer(self, config: api.ConsumerConfig) -> None:
        # NATS 2.10+ treats a create for an existing durable as create-or-update, so a
        # consumer whose filters changed between releases is updated in place.
        await self._js.add_consumer(self._settings.stream, config)

    async def _parse(self, consumer: str, msg: Msg) -> tuple[Msg, Delivery] | None:
        try:
            envelope = parse_envelope(msg.data)
        except EventParseError as exc:
            await self._dead_letter(consumer, msg, f"unparseable event: {exc}")
            return None
        forged = forged_because(envelope.type, envelope.source)
        if forged is not None:
            await self._dead_letter(consumer, msg, f"forged event: {forged}")
            return None
        return msg, Delivery(envelope, msg.headers or {})

    async def _handle_all(
        self, parsed: Sequence[tuple[Msg, Delivery]], handler: BatchHandler
    ) -> bool:
        """Apply a whole batch at once; False (nothing applied) if any event failed."""
        try:
            await handler([delivery for _, delivery in parsed])
        except Exception as exc:
            log.info("batch of %d failed (%s); handling them one at a time", len(parsed), exc)
            return False
        for msg, _ in parsed:
            await msg.ack()
        return True

    async def _handle(
        self, consumer: str, msg: Msg, delivery: Delivery, handler: BatchHandler
    ) -> None:
        deliveries = msg.metadata.num_delivered
        envelope = delivery.envelope
        try:
            await handler([delivery])
        except Reject as exc:
            await self._dead_letter(consumer, msg, f"rejected: {exc}")
            return
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if deliveries >= self._settings.max_deliver:
                log.error(
                    "%s: giving up on %s after %d deliveries: %s",
                    consumer,
                    envelope.id,
                    deliveries,
                    reason,
                )
                await self._dead_letter(consumer, msg, f"failed {deliveries} times: {reason}")
            else:
                log.warning(
                    "%s: %s failed (delivery %d), will retry: %s",
                    consumer,
                    envelope.id,
                    deliveries,
                    reason,
                )
                await msg.nak(delay=self._settings.retry_delay_seconds * 2 ** (deliveries - 1))
            return
        await msg.ack()

    async def _dead_letter(self, consumer: str, msg: Msg, reason: str) -> None:
        seq = msg.metadata.sequence.stream
        await self.publish_raw(
            f"{DEADLETTER_PREFIX}.{consumer}",
            msg.data,
            f"deadletter:{consumer}:{seq}",
            {REASON_HEADER: reason[:1000], ORIGINAL_SUBJECT_HEADER: msg.subject},
        )
        await msg.term()
        log.error("%s: dead-lettered message %d from %s: %s", consumer, seq, msg.subject, reason)


def _auth(settings: NatsSettings) -> dict[str, str]:
    """Connect options for the settings' user: its password and its own inbox prefix (a user
    may subscribe only to ``_INBOX.<user>.>``, so no one reads another's replies)."""
    if settings.user is None:
        return {}
    password = settings.password.get_secret_value() if settings.password is not None else ""
    return {"user": settings.user, "password": password, "inbox_prefix": f"_INBOX.{settings.user}"}


def _attrs(envelope: Envelope[Payload]) -> dict[str, str]:
    return {
        "messaging.system": "nats",
        "messaging.destination.name": envelope.nats_subject,
        "messaging.message.id": envelope.id,
        "cloudevents.event_type": envelope.type,
        "cloudevents.event_subject": envelope.subject,
    }
