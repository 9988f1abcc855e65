"""The event bus on NATS JetStream.

Contract:
- ``Bus.connect`` creates the event stream (``trainyard.>``), the dead-letter stream
  (``deadletter.>``, kept ``deadletter_max_age_days`` and at most ``deadletter_max_messages``)
  and the attempts stream (``attempts.>``) idempotently (as the scheduler's NATS user or an
  admin; any other service waits until they exist, however long, with capped back-off,
  saying why at most once a minute), and drains the connection on exit.
- A lost stream is made again: when NATS lost its store (or someone deleted a stream), a
  consumer finds its durable consumer gone; the bus that may make the streams makes them
  again, any other waits for them as for an outage (``StreamMissingError``: paused, never
  dead-lettered), and the consumer is created again (it then reads the new stream from its
  start). ``stream_created`` is the event stream's identity (a stream made again has a new
  one); the outbox relay (``shared.outbox``) uses it to publish again what the lost stream
  held.
- ``publish`` sends an envelope with ``Nats-Msg-Id`` = ``Bus.msg_id(subject, event id)``, so a
  re-publish inside the duplicate window is dropped by the server (this is what makes the
  outbox relay exactly-once). That id is keyed with a secret of the publisher's own NATS
  credentials (``dedup_key``) and names the subject: JetStream's duplicate window is one
  for the whole stream, whoever published, so with the bare event id as ``Nats-Msg-Id`` a
  publisher that foresees another's id (``preempt:<allocation>``, a runner's
  ``uuid5(<allocation>:end)``) could send a message of its own under it first and have the
  server drop the real event. Every process and replica of one service (one NATS user) makes
  the same id for the same event, so a re-publish after a lost acknowledgement, a relay's
  after a crash, or another replica's is still dropped once; no other user can make it.
- The event stream keeps events ``retention_hours`` (7 days by default), but a message with a
  ``Nats-TTL`` header (``TTL_HEADER``; the stream allows per-message TTLs) is removed when its
  TTL ends: high-rate, short-lived facts (runner heartbeats, every 2 s per node) say so
  instead of filling the week's store.
- ``consume`` runs a durable pull consumer: each message is parsed, handled, and acknowledged
  only after the handler returned (for database services: after its transaction committed).
  While a fetched batch is in hand its messages are kept in progress (``+WPI`` every third of
  ``ack_wait``), so JetStream never redelivers them to anyone in parallel. No more than one
  batch is ever unacknowledged (``max_ack_pending``): the batch a consumer held when it died
  comes back after ``ack_wait``, before anything newer, so events stay in stream order.
- A handler that fails because the infrastructure is unreachable (``infrastructure_fault``:
  PostgreSQL, NATS or the object store down, a connection lost, a pool or request timeout)
  is retried in place for as long as the outage lasts, with capped exponential back-off and
  jitter; meanwhile the consumer fetches nothing new (it is *paused*: ``Bus.paused``,
  ``ping`` and so the service's ``/readyz`` say so, and the metric
  ``trainyard.consumer.paused`` is 1 for it), and the message is neither acknowledged nor
  redelivered. An infrastructure fault never dead-letters a message. On stop, and when the
  consumer is cancelled (its service's stop grace ran out), the messages in hand are handed
  back (``nak``): the next process gets them at once, not after ``ack_wait``.
- A handler's ``NotNow`` (this process may not apply events now: a deposed scheduler
  leader) hands every message of the batch back at once, counted as no failure, never
  dead-lettered, and the consumer waits ``retry_delay_seconds`` or its stop.
- What became of a message's deliveries is counted by the bus itself, not read from
  JetStream's delivery count (which counts every delivery: those after a consumer stopped,
  died or handed the message back too). Each outcome that is not final is recorded before
  JetStream is told it (``Tally``: one record per consumer and message in the attempts
  stream ``attempts_stream``, subject ``attempts.<consumer>.<stream sequence>``, written
  only if nobody wrote it since it was read, so replicas sharing the consumer never lose a
  count; it survives restarts and is kept ``retention_hours``): a real failure (any handler
  error but the ones below), a ``NotYet``, or a hand-back (``NotNow``, a stop, a cancel).
  A first delivery reads nothing; a redelivery reads its record.
- A real failure leads to a delayed redelivery (``retry_delay_seconds``, doubled per
  failure, at most ``retry_delay_max_seconds``); at the ``max_deliver``-th real failure the
  message is dead-lettered. A ``NotYet`` (an event that follows one not applied yet, which
  a replica that died may hold) is counted apart and dead-lettered at its ``max_deliver +
  NOT_YET_EXTRA_DELIVERIES``-th (the last ones each ``ack_wait`` later). Hand-backs, outage waits and redeliveries after a
  stop or a crash count toward neither. A message is also dead-lettered at once
  for bytes that are not a valid event, an event whose ``source`` may not send its
  type or that came on another subject than its type, source and routing key give
  (``shared.events.trust``, checked before any handler), or a handler's ``Reject``, the
  message is copied to ``deadletter.<consumer>`` with the reason (one line; a database
  error's message and detail withheld, as on spans: the log keeps them) and its origin in
  headers (its body cut to fit the server's ``max_payload`` with them, ``TRUNCATED_HEADER``
  saying so), and terminated. A message whose earlier deliveries ended
  ``max_unfinished_deliveries`` times without any recorded outcome (the consumer died while
  handling it, each time) is dead-lettered before it is handled again. Nothing
  crash-loops, and the server never drops a message on its own
  (the consumer's ``max_deliver`` is unlimited: these rules decide).
- Each delivery a handler ran for is counted once when it is settled (applied, failed to be
  retried, or dead-lettered), and the time of the attempt that applied a batch recorded
  (``shared.event_metrics``); handlers report nothing themselves.
- Dead letters are listed, redriven and discarded with ``shared.deadletters``: a redrive
  republishes the event as it was (same body, so the same event id for the inboxes) to
  ``trainyard.redrive.<consumer>``, which only that consumer reads. A redrive is believed
  only as the event would be on the subject it first came on (its dead letter's
  ``ORIGINAL_SUBJECT_HEADER``, copied by the redrive): one dead-lettered as forged for its
  subject is dead-lettered as forged again, never applied because an operator redrove it.
- ``consume_batches`` is the same for a handler that applies several events all-or-nothing
  (``shared.inbox.idempotent``: one transaction): each fetched batch is handed over whole
  and acknowledged after it returns, so a burst costs one commit, not one per event. A batch
  that fails for an infrastructure fault waits out the outage whole; one that fails
  otherwise is handled again one event at a time with the rules above, so one bad event
  costs its neighbours nothing but a retry.
- Each event is handled in a span whose parent is the trace context from its headers
  (``Delivery.span``), or, where a batch handler applies several events together, in one
  consumer span for them all (``batch_span``: a trace of its own with a link to each event's
  context, as OpenTelemetry's messaging conventions have a batch consumer do), except the
  high-rate facts of ``UNTRACED_TYPES`` (runner heartbeats,
  a job's progress reports and metric batches): they are published without a span or a
  trace context and handled under no span at all (their database queries make none either),
  so they never flood the trace store nor grow a job's trace with its length.
- What a consumer has been able to hear (``Bus.hearing``): ``since``, when it last began
  hearing without a gap (the latest of its start, the connection's last reconnect, and its
  first fetch after one that failed), and ``through``, the start of its latest fetch that
  left nothing waiting (``_DurablePull.nothing_waiting``: none undelivered on the server, none
  delivered and not yet handed over; a short fetch is no proof), once what that fetch brought was handled: every
  message published before ``through`` has been handled. None while disconnected or not caught up
  since ``since``; a consumer is judged only from its first fetch after its hearing was first
  asked (an empty fetch's judgment costs a JetStream API request). ``Bus.connected_since`` is
  when the connection was last (re)established.
  A liveness judge (the scheduler's lost-node watch) uses it so that its own outage or lag
  never passes for the silence of others.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import random
import time
import traceback
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Final, TypeVar
from urllib.parse import urlsplit

import asyncpg
import nats
import nats.errors
import nats.js.errors
import urllib3.exceptions
from minio.error import InvalidResponseError, S3Error, ServerError
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import SpanLimits

from trainyard_platform.shared.event_metrics import EventMetrics
from trainyard_platform.shared.events import Envelope, EventParseError, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import JobMetrics, JobProgress, RunnerHeartbeat
from trainyard_platform.shared.events.trust import forged_because, misrouted_because, speaker_of
from trainyard_platform.shared.exception_chain import exception_chain
from trainyard_platform.shared.logs import Throttle, error_text, held_back, job_scope, span_job_id
from trainyard_platform.shared.settings import NatsSettings
from trainyard_platform.shared.span_errors import safe_message
from trainyard_platform.shared.telemetry import extract, inject, tracer
from trainyard_platform.shared.telemetry import meter as telemetry_meter

if TYPE_CHECKING:
    from trainyard_platform.shared.outages import Dependency

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

EVENT_SUBJECTS = "trainyard.>"
UNTRACED_TYPES: frozenset[str] = frozenset(
    {RunnerHeartbeat.TYPE, JobProgress.TYPE, JobMetrics.TYPE}
)
"""Event types published and handled outside any trace (module docstring): a node's
heartbeat every 2 s, a job's progress and metric reports several times a second. Their
numbers are in the metrics store and the scheduler's node table; a job's trace summarises
them on its other spans (``services.runner.publishing``)."""
TTL_HEADER = "Nats-TTL"
"""A message header that makes JetStream remove that message after the given time (``600s``)."""
DEADLETTER_PREFIX = "deadletter"
REDRIVE_PREFIX = "trainyard.redrive"
REASON_HEADER = "Trainyard-Dead-Letter-Reason"
ORIGINAL_SUBJECT_HEADER = "Trainyard-Original-Subject"
CONSUMER_HEADER = "Trainyard-Dead-Letter-Consumer"
ORIGINAL_SEQUENCE_HEADER = "Trainyard-Original-Sequence"
ORIGINAL_MSG_ID_HEADER = "Trainyard-Original-Msg-Id"
DELIVERIES_HEADER = "Trainyard-Deliveries"
REDRIVEN_FROM_HEADER = "Trainyard-Redriven-From"
TRUNCATED_HEADER = "Trainyard-Dead-Letter-Truncated"
"""On a dead letter whose body was cut to fit the bus's ``max_payload`` with its headers: the
original body's size in bytes (it cannot be redriven)."""
DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""NATS's default ``max_payload``: the limit assumed when the server names none."""
DEAD_LETTER_KINDS = ("abandoned", "unparseable", "forged", "rejected", "failed")
"""The ``kind`` label of ``trainyard.consumer.dead_letters``: the first word of the reason.
Each kind's series (and the consumer's outage retries) is reported from the consumer's
start, at 0 until it happens (a series that appears only with its first dead letter reads
as "unknown" to Prometheus, and ``increase`` misses that first one)."""
STREAMS_USER = "scheduler"
"""The one service NATS user that makes and updates the streams (docs/security.md, "Bus")."""
STREAM_WAIT_LOG_S = 60.0
"""While another service waits at start for the streams to exist (for as long as it takes:
the scheduler may be down, or NATS away), it says so at most once this often."""
STORE_FAILED_ERR_CODE = 10049
"""JetStream's error code for "error creating store for stream" (``Bus._add_stream``)."""
OTHER_STREAMS_CHECK_S = 10.0
"""How often at most ``stream_created`` of a bus that makes the streams also looks for the
dead-letter and attempts streams (two more requests), to make a lost one again."""
STORE_RETRIES = 5
STORE_RETRY_S = 0.2

Handler = Callable[[Envelope[Payload]], Awaitable[None]]
"""Handles one event."""

T = TypeVar("T")


def deadletter_subject(consumer: str) -> str:
    """Where ``consumer``'s dead letters go (stream ``NatsSettings.deadletter_stream``)."""
    return f"{DEADLETTER_PREFIX}.{consumer}"


def redrive_subject(consumer: str) -> str:
    """Where a redriven dead letter of ``consumer`` is republished: in the event stream, read
    by that consumer alone (every consumer's filter includes its own)."""
    return f"{REDRIVE_PREFIX}.{consumer}"


@dataclass(frozen=True)
class Delivery:
    """An event as it came off the stream, with the headers its trace context travels in."""

    envelope: Envelope[Payload]
    headers: Mapping[str, str] = field(default_factory=dict)

    @contextmanager
    def span(self, consumer: str) -> Iterator[trace.Span]:
        """The consumer span of handling this event, inside the producer's trace; for an
        event of ``UNTRACED_TYPES``, no span: the handler runs under an invalid one, so its
        database queries make no span either. The lines logged inside name the event's job
        (``job_of``)."""
        with self.about_its_job():
            if self.envelope.type in UNTRACED_TYPES:
                with untraced():
                    yield trace.INVALID_SPAN
                return
            with _tracer.start_as_current_span(
                f"{self.envelope.type} process",
                context=extract(self.headers),
                kind=trace.SpanKind.CONSUMER,
                attributes={**_attrs(self.envelope), "messaging.consumer.group.name": consumer},
            ) as span:
                yield span

    def about_its_job(self) -> AbstractContextManager[None]:
        """The job scope of the event's job (``job_of``; none for an event about no one
        job): the lines logged inside carry its ``job_id``."""
        job_id = job_of(self.envelope)
        return job_scope(job_id) if job_id is not None else nullcontext()

    @cached_property
    def carried(self) -> trace.SpanContext | None:
        """The valid trace context this event's headers carry (the span that published it or
        whose transaction wrote it), or None (none, or not a valid one)."""
        if not self.headers or self.envelope.type in UNTRACED_TYPES:
            return None
        context = trace.get_current_span(extract(self.headers)).get_span_context()
        return context if context.is_valid else None

    @contextmanager
    def continued(self) -> Iterator[None]:
        """Handle this event in its producer's trace without a span of its own (as one of a
        ``batch_span``'s events): what is said inside carries the context the event came with
        (``carried``), so the spans of its consumers join the producer's trace; an event that
        carries none is handled under no span (``untraced``). The lines logged inside name the
        event's job, as inside its span (``job_of``)."""
        carried = self.carried
        with (
            _current(trace.INVALID_SPAN if carried is None else trace.NonRecordingSpan(carried)),
            self.about_its_job(),
        ):
            yield

    def trace_headers(self) -> dict[str, str]:
        """The W3C headers of ``carried`` as this event came with them (what ``inject`` would
        write inside that context), or empty when it carries no valid context."""
        if self.carried is None:
            return {}
        return {k: self.headers[k] for k in _TRACE_HEADERS if k in self.headers}


_TRACE_HEADERS = ("traceparent", "tracestate")


def link_limit() -> int:
    """How many links a span keeps (``OTEL_SPAN_LINK_COUNT_LIMIT``, 128 by default): a
    ``batch_span`` covers at most this many events."""
    global _link_limit
    if _link_limit is None:
        _link_limit = max(1, SpanLimits().max_links or 128)
    return _link_limit


_link_limit: int | None = None


def link_chunks(items: Sequence[T]) -> list[Sequence[T]]:
    """``items`` (deliveries, or what goes with each) cut, in order, into runs that one
    ``batch_span`` each can cover."""
    size = link_limit()
    return [items[i : i + size] for i in range(0, len(items), size)]


@contextmanager
def batch_span(deliveries: Sequence[Delivery], consumer: str) -> Iterator[trace.Span]:
    """One consumer span for handling ``deliveries`` (at most ``link_limit()``) together, as
    OpenTelemetry's messaging conventions have a batch consumer do: a trace of its own (each
    event's trace is its producer's; the batch belongs to none of them alone), with a link to
    the context each event carries (``Delivery.carried``) and ``messaging.batch.message_count``.
    Named ``<type> process`` when the events are of one type, ``<consumer> process``
    otherwise. Events of ``UNTRACED_TYPES`` are not linked."""
    types = {d.envelope.type for d in deliveries}
    one_type = next(iter(types)) if len(types) == 1 else None
    attributes: dict[str, str | int] = {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.batch.message_count": len(deliveries),
        "messaging.consumer.group.name": consumer,
    }
    if one_type is not None:
        attributes["cloudevents.event_type"] = one_type
    links = [trace.Link(c) for d in deliveries if (c := d.carried) is not None]
    with _tracer.start_as_current_span(
        f"{one_type or consumer} process",
        context=otel_context.Context(),
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
    ) as span:
        yield span


BatchHandler = Callable[[Sequence[Delivery]], Awaitable[None]]
"""Applies all the deliveries or, by raising, none of them; opens each one's span, or one
``batch_span`` for several."""


@dataclass(frozen=True)
class Hearing:
    """What a consumer has been able to hear (``Bus.hearing``): continuously since ``since``,
    and every message published before ``through`` (``since <= through``) has been handled."""

    since: datetime
    through: datetime


class Reject(Exception):
    """Raised by a handler for an event that can never be applied; it is dead-lettered at once."""


class NotYet(Exception):
    """Raised by a handler for an event that follows another one not applied yet (a release
    before its grant, a success before its start). Replicas of a service share the durable
    consumer and apply their batches concurrently, so the earlier event may be in another
    replica's hands; if that replica died, it comes back only after ``ack_wait``. It is
    retried as any failure and then, past the last delivery, ``NOT_YET_EXTRA_DELIVERIES``
    more times, each ``ack_wait`` later, before it is dead-lettered."""


class NotNow(Exception):
    """Raised by a handler (or the guard of its transaction) when this process may not apply
    events now, whatever they are (a scheduler that is no longer the leader): the messages in
    hand go back at once (``nak``), for the process that may, counted as no failure and never
    dead-lettered, and the consumer waits ``retry_delay_seconds`` (or its stop) before it
    fetches again."""


NOT_YET_EXTRA_DELIVERIES: Final = 2
"""``NotYet`` outcomes past ``max_deliver`` of an event before it is dead-lettered, each
``ack_wait`` after the one before: the earlier event a dead replica held is delivered again
by then."""

ATTEMPTS_PREFIX = "attempts"
MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_LAST_HEADER = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE_ERR_CODE = 10071
"""JetStream's error code for a publish whose ``Nats-Expected-Last-Subject-Sequence`` is
not the subject's last sequence: someone recorded an outcome since it was read."""
RECORD_TRIES = 5
"""Reads and writes of one tally before a conflicting writer is taken for a fault."""
RECORDED_DELIVERIES_KEPT = 16
"""The latest deliveries a tally names as counted (``Tally.deliveries``): enough for the
replicas that may hold one message in turn while a write of theirs is retried."""
DELIVERY_ID_CHARS = 16
"""Hex characters of a delivery's own id in a tally (random, one per delivery in hand)."""


MSG_ID_BYTES: Final = 16
"""Bytes of a keyed ``Nats-Msg-Id`` (``Bus.msg_id``; 22 characters of base64url): 128 bits,
which no other publisher can guess, in fewer characters than an event id (a uuid has 36)."""


def dedup_key(settings: NatsSettings) -> bytes | None:
    """The key of the ``Nats-Msg-Id`` this connection's publishes carry (``Bus.msg_id``):
    derived from its NATS credentials (the password of ``user``, or the one in ``url``),
    which only its service's processes hold, so every replica and restart of one service
    shares it and no other user can compute it. None for a connection with no password (a
    server that lets anyone in, which the project never runs): its ids are the event ids,
    which ``Bus.connect`` allows only with ``NatsSettings.unkeyed_msg_ids``."""
    found = urlsplit(settings.url.split(",", 1)[0])
    if settings.password is not None:
        secret, user = settings.password.get_secret_value(), settings.user or ""
    else:
        secret, user = found.password or "", settings.user or found.username or ""
    if not secret:
        return None
    label = f"trainyard Nats-Msg-Id\0{user}".encode()
    return hmac.new(secret.encode(), label, hashlib.sha256).digest()


class UnkeyedMsgIds(Exception):
    """``Bus.connect`` refused: the connection has no password to key its ``Nats-Msg-Id``
    with (``dedup_key``) and ``NatsSettings.unkeyed_msg_ids`` does not allow bare event
    ids. A start-up refused by the configuration (``runtime.run_service``: exit 2)."""


UNKEYED_MSG_IDS_REFUSED: Final = (
    "TRAINYARD_NATS_PASSWORD: no NATS password is set (nor one in TRAINYARD_NATS_URL), so "
    "the Nats-Msg-Id of this service's events cannot be keyed, and another publisher could "
    "send one first under the same id and have the real event dropped as a duplicate; give "
    "the service's NATS user and password (TRAINYARD_NATS_USER, TRAINYARD_NATS_PASSWORD), or "
    "set TRAINYARD_NATS_UNKEYED_MSG_IDS=true on a development server that lets anyone in"
)


def keyed_msg_id(key: bytes | None, subject: str, event_id: str) -> str:
    """``Nats-Msg-Id`` of ``event_id`` published on ``subject`` with ``key`` (``dedup_key``):
    the HMAC of both, so it is the publisher's alone and one subject's; ``event_id`` itself
    where there is no key."""
    if key is None:
        return event_id
    mac = hmac.new(key, f"{subject}\0{event_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:MSG_ID_BYTES]).decode().rstrip("=")


def attempts_subject(consumer: str, sequence: int) -> str:
    """Where ``consumer``'s tally of the event-stream message ``sequence`` is recorded."""
    return f"{ATTEMPTS_PREFIX}.{consumer}.{sequence}"


def consumer_attempts(consumer: str) -> str:
    """The subjects of every tally of ``consumer``: all its NATS user may write or read."""
    return f"{ATTEMPTS_PREFIX}.{consumer}.>"


@dataclass(frozen=True)
class Tally:
    """The recorded outcomes of a message's earlier deliveries to one consumer: ``failures``
    (its handler failed for real), ``waits`` (``NotYet``) and ``handed_back`` (``NotNow``,
    a stop, a cancel); ``revision`` is the record's sequence in the attempts stream (0: none
    yet). Deliveries beyond these ended with no outcome told (the consumer died).
    ``deliveries`` are the ids of the latest deliveries (at most ``RECORDED_DELIVERIES_KEPT``)
    whose outcome it counts: each delivery counts once, however often its write was tried.
    The ids are the bus's own, random per delivery in hand, not JetStream's delivery count,
    which starts again at 1 for a consumer made again."""

    failures: int = 0
    waits: int = 0
    handed_back: int = 0
    revision: int = 0
    deliveries: tuple[str, ...] = ()

    def unfinished(self, delivered: int) -> int:
        """Earlier deliveries (of ``delivered`` so far) that ended without any outcome."""
        return max(0, delivered - 1 - self.failures - self.waits - self.handed_back)

    def to_json(self, msg_id: str) -> bytes:
        return json.dumps(
            {
                "msg_id": msg_id,
                "failures": self.failures,
                "waits": self.waits,
                "handed_back": self.handed_back,
                "deliveries": list(self.deliveries),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes | None, msg_id: str, revision: int) -> Tally:
        """The tally a record holds; none (but its revision) when it is of another message
        (the event stream was made again, and its sequences with it) or unreadable."""
        try:
            found = json.loads(data or b"")
            if found.get("msg_id") != msg_id:
                return cls(revision=revision)
            return cls(
                failures=int(found["failures"]),
                waits=int(found["waits"]),
                handed_back=int(found["handed_back"]),
                revision=revision,
                # A record written before deliveries were kept names none.
                deliveries=tuple(str(d) for d in found.get("deliveries", ())),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls(revision=revision)


class _Stopped(Exception):
    """The consumer was asked to stop while it waited out an outage."""


class StreamMissingError(Exception):
    """A stream this service needs does not exist (NATS lost its store, or it was deleted)
    and this service may not make it: an outage, waited out until the scheduler's bus has
    made it again."""


class ConsumerLostError(Exception):
    """A durable consumer was gone (with its stream) and has just been made again: what it
    had not yet handled of the old stream is lost to it (the producers publish it again)."""


# PostgreSQL errors that say the server, or the way to it, is not there now: connection
# failures (class 08), shutdowns and "starting up" (57P0x), a session the server ended (a
# timeout of its own: 57P05, 25P03, 25P04; the database dropped under it: 57P04), out of
# resources (class 53: disk full, memory, too many connections), its disk failing (58030),
# a failover that left the connection on a read-only server (25006), and a login refused
# now (class 28: credentials rotated; 3D000: the database not there yet). None says
# anything of the event: the same event succeeds once the server serves again. A cancelled
# statement (57014) is not among them: it is retried as an ordinary failure.
_POSTGRES_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.DatabaseDroppedError,
    asyncpg.IdleSessionTimeoutError,
    asyncpg.IdleInTransactionSessionTimeoutError,
    asyncpg.TransactionTimeoutError,
    asyncpg.InsufficientResourcesError,
    asyncpg.PostgresIOError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
)
_PATH_FOR_GOOD: tuple[type[OSError], ...] = (
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)
_NATS_DOWN: tuple[type[BaseException], ...] = (
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    nats.js.errors.NoStreamResponseError,  # no stream stores the subject (now): it was lost
    StreamMissingError,
    ConsumerLostError,
)
# S3 error codes that mean "the store is overloaded or unavailable; ask again later". The
# code is the server's word when it gives one: throttles and timeouts come as 400 or 429 too,
# and MinIO that lost the quorum of its drives says ``SlowDownWrite``/``SlowDownRead`` (older
# releases ``XMinio*Quorum``) as a 503. minio's client retries no POST (a multipart upload's
# start and completion, a bulk delete), so these reach the caller as they are.
_S3_UNAVAILABLE = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "SlowDownRead",
        "SlowDownWrite",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequests",
        "RequestLimitExceeded",
        "XMinioServerNotInitialized",
        "XMinioStorageFull",
        "XMinioReadQuorum",
        "XMinioWriteQuorum",
    }
)
# The statuses of an answer that is not S3's XML (a proxy's or load balancer's page before
# the store, minio's ``InvalidResponseError``), which has no code: the store away, not
# answering in time, or busy. Not 501: a method it will never take.
_HTTP_UNAVAILABLE = frozenset({408, 429, 500, 502, 503, 504})


def infrastructure_fault(exc: BaseException) -> str | None:
    """Why ``exc`` is an infrastructure fault (PostgreSQL, NATS or the object store
    unreachable or overloaded; a connection lost; a timeout), or None when it is not.

    An infrastructure fault says nothing about the event: the same event succeeds once the
    outage is over, so it is retried for as long as the outage lasts, never dead-lettered.
    The exception's causes and contexts (``raise ... from``) and the members of exception
    groups are looked at too."""
    for current in exception_chain(exc):
        reason = _own_fault(current)
        if reason is not None:
            return reason
    return None


POSTGRES_NOT_ANSWERING = "PostgreSQL not answering"
"""How ``infrastructure_fault`` begins for a timeout of asyncpg's (a statement past its
``command_timeout``, an acquire or a connect past theirs: ``shared.db``)."""
NATS_NOT_ANSWERING = "NATS not answering"
"""How it begins for the NATS client's timeout (a request or a publish unanswered)."""


def _own_fault(exc: BaseException) -> str | None:
    what = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, _POSTGRES_DOWN):
        return f"PostgreSQL unavailable ({what})"
    if isinstance(exc, TimeoutError) and _raised_in(exc, "asyncpg"):
        return f"{POSTGRES_NOT_ANSWERING} ({what})"
    if isinstance(exc, NatsTimeoutError):
        return f"{NATS_NOT_ANSWERING} ({what})"
    if isinstance(exc, asyncpg.InternalClientError) or (
        isinstance(exc, asyncpg.InterfaceError)
        and any(word in str(exc) for word in ("connection is closed", "pool is closing"))
    ):  # InternalClientError: a connection an outage left mid-operation (db.DATABASE_FAULTS)
        return f"PostgreSQL connection lost ({what})"
    if isinstance(exc, _NATS_DOWN):
        return f"NATS unavailable ({what})"
    if isinstance(exc, urllib3.exceptions.HTTPError | ServerError):
        return f"object store unreachable ({what})"
    if isinstance(exc, S3Error) and exc.code in _S3_UNAVAILABLE:
        return f"object store unavailable ({what})"
    if isinstance(exc, InvalidResponseError) and _status_of(exc) in _HTTP_UNAVAILABLE:
        return f"object store unavailable ({what})"
    # Sockets, DNS, refused and reset connections, a PostgreSQL socket that is not there,
    # a full disk, and every timeout (asyncio's, a pool acquire's, NATS's: all OSError).
    # Not the errors of a path that will stay what it is (a local object store's file
    # refused, a directory where a file is wanted, a file that exists): waiting them out
    # would retry for ever, and an HTTP client told "try again" would too.
    if isinstance(exc, OSError) and not isinstance(exc, _PATH_FOR_GOOD):
        if _raised_in(exc, "asyncpg"):  # its connect raises the socket's own error
            return f"PostgreSQL unavailable ({what})"
        return f"unreachable or timed out ({what})"
    return None


def _status_of(exc: InvalidResponseError) -> int | None:
    """The HTTP status of a non-XML answer (minio keeps it in ``_code``, with no accessor)."""
    status = getattr(exc, "_code", None)
    return status if isinstance(status, int) else None


CLOSE_TIMEOUT_S: Final = 5
"""Longest the connection's drain may take when the bus closes (a healthy NATS takes
milliseconds): the client's own limit on draining its subscriptions (``drain_timeout``),
and a second more for the rest; past it the connection is closed as it is."""


async def _close(nc: NatsClient) -> None:
    """Drain the connection (subscriptions end, what was published leaves) within
    ``CLOSE_TIMEOUT_S``, then close it, whatever the drain did. Against a NATS that took the
    connection and never answered, the client's drain waited 20 s, then raised
    ``FlushTimeoutError`` out of the stop (a traceback and status 1, past the stop's time
    in compose) and left the connection open. A close while NATS is away may fail on the
    client's last socket; that is logged in one line and the close is over."""
    if nc.is_connected:
        draining = asyncio.ensure_future(nc.drain())
        done, _ = await asyncio.wait({draining}, timeout=CLOSE_TIMEOUT_S + 1)
        failed: BaseException | None = None
        if done:
            failed = draining.exception()
        else:
            # Its last step waits for the server's answer to a flush (10 s); the client's
            # drain swallows a cancellation that comes while it waits for its subscriptions.
            while not draining.done():
                draining.cancel()
                await asyncio.wait({draining}, timeout=0.1)
            if not draining.cancelled():
                draining.exception()  # retrieved: the warning below says it
        if not done or failed is not None:
            log.warning(
                "NATS (TRAINYARD_NATS_URL): the connection did not drain on closing (%s); "
                "closed as it is",
                "no answer" if failed is None else error_text(failed),
            )
    try:
        await nc.close()
    except OSError as exc:
        # What the client buffered while NATS was away is written on its last socket, which
        # NATS had reset: the client raised that out of the close (a stop during an outage
        # ended with status 1 and a traceback). Nothing more can be sent: the stop goes on.
        log.warning(
            "NATS (TRAINYARD_NATS_URL): closed while unreachable (%s); what was not sent is "
            "dropped",
            error_text(exc),
        )
    await _end_reconnecting(nc)


async def _end_reconnecting(nc: NatsClient) -> None:
    """See that the client's task trying to reconnect has ended once it is closed. Its close
    cancels that task once and waits at most ``reconnect_time_wait`` (2 s) for it; a
    cancellation that comes as a try to connect completes can be lost inside it (Python
    3.11's ``wait_for``), and the task then tried again every 2 s for ever: a test's event
    loop never closed, seen under load, and a service's stop during an outage would wait
    for its kill. Cancelled again until it ends, for at most ``CLOSE_TIMEOUT_S``."""
    reconnecting: asyncio.Task[None] | None = getattr(nc, "_reconnection_task", None)
    for _ in range(int(CLOSE_TIMEOUT_S * 10)):
        if reconnecting is None or reconnecting.done():
            return
        reconnecting.cancel()
        await asyncio.wait({reconnecting}, timeout=0.1)
    log.warning("NATS (TRAINYARD_NATS_URL): the client's try to reconnect did not end on closing")


def _raised_in(exc: BaseException, package: str) -> bool:
    """Whether ``exc`` went through code of ``package`` on its way up: asyncpg's timeouts
    are plain ``TimeoutError``s, told from others only by where they were raised."""
    return any(
        str(frame.f_globals.get("__name__", "")).partition(".")[0] == package
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


def nats_error_logger(
    dependency: Dependency | None = None, connected: Callable[[], bool] = lambda: False
) -> Callable[[Exception], Awaitable[None]]:
    """The NATS client's ``error_cb``, never logging a traceback. An error that comes while
    the client is not ``connected`` (its tries to connect, at the start or after a loss) or
    that is a refused login tells ``dependency`` (``outages.Dependency``, one of the
    connection's own by default) that NATS is away, so an outage is one line when it goes
    (``NATS (TRAINYARD_NATS_URL) unavailable: <error>; waiting for it``), at most one a
    minute while it lasts, and one when the connection is made (``Bus.connect`` tells it).
    The client reports every failed try, one every 2 s for as long as NATS is away (at
    start too: the client waits for it for ever), each with its own error (EOF, a reset, a
    refusal): logged per error, a loss of NATS was three lines a minute. A refused login's
    error names the user's settings. An error on a connection that is there (a slow
    consumer, a permission refused, a flush unanswered) says nothing of NATS being away
    (nothing would ever say it answers again): a line of its own, once per error and minute
    (``logs.Throttle``). A drain that timed out is the bus closing, not a try to connect:
    ``_close`` says it in a line of its own."""
    nats_away = dependency or nats_dependency()
    throttle = Throttle()

    async def report(exc: Exception) -> None:
        if isinstance(exc, nats.errors.DrainTimeoutError):
            return
        reason = error_text(exc)
        if "authorization" in reason.lower() or "authentication" in reason.lower():
            nats_away.failed(
                ConnectionError(f"{reason} (TRAINYARD_NATS_USER, TRAINYARD_NATS_PASSWORD)")
            )
        elif not connected():
            nats_away.failed(exc)
        elif (repeats := throttle.due(reason)) is not None:
            log.warning("NATS (TRAINYARD_NATS_URL): %s%s", reason, held_back(repeats))

    return report


def nats_dependency() -> Dependency:
    """NATS as a dependency of one connection (``outages.Dependency``)."""
    # Imported here: ``outages`` tells outages apart with this module's
    # ``infrastructure_fault``.
    from trainyard_platform.shared.outages import Dependency

    return Dependency("NATS", "TRAINYARD_NATS_URL", "nats")


class Bus:
    """A JetStream connection with Trainyard's publish and consume rules."""

    def __init__(
        self,
        nc: NatsClient,
        settings: NatsSettings,
        *,
        meter: metrics.Meter | None = None,
        nats_away: Dependency | None = None,
    ) -> None:
        self._nc = nc
        self.nats_away = nats_away or nats_dependency()
        """NATS as a dependency of this connection (``outages.Dependency``), told by the
        client's errors and reconnections (``connect``); code whose own use of the bus
        fails while NATS is away (a publish retried) tells it too, so an outage is one line
        when it starts and one when it ends, not one a try."""
        self._js: JetStreamContext = nc.jetstream()
        self._settings = settings
        self._dedup_key = dedup_key(settings)
        self._paused: dict[str, str] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._parsers: dict[str, Callable[[bytes], Envelope[Payload]]] = {}
        """How each consumer reads its messages' bytes (``consume``'s ``parse``)."""
        self._connected_since: datetime | None = _utc_now() if nc.is_connected else None
        self._reconnects = _reconnects(nc)
        self._fetching_since: dict[str, datetime] = {}
        self._heard_through: dict[str, datetime] = {}
        self._heeded: set[str] = set()
        """The consumers whose ``hearing`` was asked: only their fetches are judged (one
        JetStream API request per empty fetch; a runner's consumer needs none)."""
        self._others_checked_at: float | None = None
        """When ``stream_created`` last found the dead-letter and attempts streams there."""
        self._tallies: dict[int, Tally] = {}
        """The recorded outcomes (``Tally``) of the earlier deliveries of each message in hand
        (by ``id``), as read when it was fetched and updated as this process records more."""
        self._delivery_ids: dict[int, str] = {}
        """Each message in hand's delivery id in its tally (``Tally.deliveries``), made when
        its outcome is first recorded and kept while it is in hand, so a write tried again
        names the same delivery."""
        self._settled: set[int] = set()
        """The messages in hand (by ``id``) whose outcome JetStream was told (``_settle``):
        acknowledged, handed back or terminated. The bus keeps this itself rather than read
        nats-py's private ``Msg._ackd``; a batch's are forgotten when it leaves hand."""
        instruments = meter or telemetry_meter(__name__)
        self._paused_metric = instruments.create_up_down_counter(
            "trainyard.consumer.paused",
            unit="{consumer}",
            description="Consumers waiting out an infrastructure outage with a message in "
            "hand (alert when above 0 for a few minutes)",
        )
        self._outage_retries = instruments.create_counter(
            "trainyard.consumer.outage_retries",
            unit="{retry}",
            description="Retries of a message (or fetch) after an infrastructure fault",
        )
        self._dead_letters = instruments.create_counter(
            "trainyard.consumer.dead_letters",
            unit="{message}",
            description="Messages copied to the dead-letter stream, by consumer and kind",
        )
        self._event_metrics = EventMetrics(meter)

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, settings: NatsSettings, name: str, *, meter: metrics.Meter | None = None
    ) -> AsyncIterator[Bus]:
        """Connect, make sure the streams exist, and drain on exit. ``UnkeyedMsgIds``
        before any connection when the settings give no password to key the message ids
        with (``dedup_key``) and do not allow bare ones (``unkeyed_msg_ids``)."""
        if dedup_key(settings) is None and not settings.unkeyed_msg_ids:
            raise UnkeyedMsgIds(UNKEYED_MSG_IDS_REFUSED)
        buses: list[Bus] = []
        outage = nats_dependency()
        outage.watched()

        async def disconnected() -> None:
            for one in buses:
                one._connected_since = None

        async def reconnected() -> None:
            # Its going is told by ``nats_error_logger``; its coming back in one line too.
            outage.answered()
            for one in buses:
                one._reconnects = _reconnects(one._nc)
                one._connected_since = _utc_now()

        clients: list[NatsClient] = []  # none while it connects the first time

        def connected() -> bool:
            return any(client.is_connected for client in clients)

        nc = await nats.connect(
            settings.url,
            name=name,
            max_reconnect_attempts=-1,
            drain_timeout=CLOSE_TIMEOUT_S,
            error_cb=nats_error_logger(outage, connected),
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            **_auth(settings),
        )
        clients.append(nc)
        outage.answered()  # it may have been away at the start, which no callback tells
        bus = cls(nc, settings, meter=meter, nats_away=outage)
        buses.append(bus)
        try:
            await bus.ensure_streams()
            yield bus
        finally:
            await _close(nc)

    @property
    def jetstream(self) -> JetStreamContext:
        return self._js

    @property
    def nats(self) -> NatsClient:
        return self._nc

    @property
    def settings(self) -> NatsSettings:
        return self._settings

    @property
    def max_payload(self) -> int:
        """The largest message (body and headers) the server takes: its ``max_payload``, or
        ``DEFAULT_MAX_PAYLOAD`` when it names none."""
        server = getattr(self._nc, "max_payload", None)
        return server if isinstance(server, int) and server > 0 else DEFAULT_MAX_PAYLOAD

    @property
    def paused(self) -> Mapping[str, str]:
        """The consumers of this bus waiting out an infrastructure outage, with its reason."""
        return dict(self._paused)

    @property
    def connected_since(self) -> datetime | None:
        """When the NATS connection was last (re)established; None while it is down. A
        reconnect no callback reported (a ``Bus`` made around a client of its own) counts from
        when it is first noticed here: later than it was, never earlier."""
        if not self._nc.is_connected:
            return None
        reconnects = _reconnects(self._nc)
        if self._connected_since is None or reconnects != self._reconnects:
            self._reconnects = reconnects
            self._connected_since = _utc_now()
        return self._connected_since

    def hearing(self, consumer: str) -> Hearing | None:
        """What ``consumer`` (running on this bus) has been able to hear (see the module
        docstring); None while the connection is down, the consumer is not running, or it has
        not caught up since it last began hearing. Only the consumers whose hearing is
        asked are judged, from their next fetch on."""
        self._heeded.add(consumer)
        connected = self.connected_since
        fetching = self._fetching_since.get(consumer)
        through = self._heard_through.get(consumer)
        if connected is None or fetching is None or through is None:
            return None
        since = max(connected, fetching)
        return Hearing(since, through) if through >= since else None

    def _fetched(self, consumer: str, asked_at: datetime, drained: bool) -> None:
        """A fetch asked at ``asked_at`` came back without a fault and what it brought is
        handled; ``drained``: it left nothing waiting (``_DurablePull.nothing_waiting``)."""
        since = self._fetching_since.setdefault(consumer, asked_at)
        connected = self.connected_since
        if drained and connected is not None and max(connected, since) <= asked_at:
            self._heard_through[consumer] = asked_at

    async def ping(self) -> bool:
        """Readiness: connected, JetStream answers, and no consumer is paused by an outage."""
        if not self._nc.is_connected or self._paused:
            return False
        await self._js.stream_info(self._settings.stream)
        return True

    @property
    def makes_streams(self) -> bool:
        """Whether this connection makes and updates the streams (the user ``STREAMS_USER``,
        or credentials in the URL: an operator's, a test's)."""
        return self._settings.user in (None, STREAMS_USER)

    async def stream_created(self) -> datetime | None:
        """When the event stream was created: its identity, since a stream that was lost (NATS
        lost its store) and made again has a new one. A bus that makes the streams makes them
        again first when they are gone, the dead-letter and attempts streams too (looked for
        at most every ``OTHER_STREAMS_CHECK_S``: every other service waits, paused, for a
        lost one, and the scheduler's outbox relay asks this every second); any other bus
        answers None while the event stream is missing."""
        try:
            info = await self._js.stream_info(self._settings.stream)
        except NotFoundError:
            if not self.makes_streams:
                return None
            await self.ensure_streams()
            info = await self._js.stream_info(self._settings.stream)
        else:
            if self.makes_streams:
                await self._make_other_streams_again()
        return info.created

    async def _make_other_streams_again(self) -> None:
        """Make the streams again if the dead-letter or the attempts stream is gone (deleted
        by hand), at most every ``OTHER_STREAMS_CHECK_S``."""
        now = asyncio.get_running_loop().time()
        if (
            self._others_checked_at is not None
            and now - self._others_checked_at < OTHER_STREAMS_CHECK_S
        ):
            return
        for name in (self._settings.deadletter_stream, self._settings.attempts_stream):
            try:
                await self._js.stream_info(name)
            except NotFoundError:
                log.warning("stream %s does not exist (lost?): making it again", name)
                await self.ensure_streams()
                break
        self._others_checked_at = now

    async def _restore_streams(self) -> None:
        """Make the streams again where this bus may; elsewhere raise ``StreamMissingError``
        (an outage) while one is missing."""
        if self.makes_streams:
            await self.ensure_streams()
            return
        for name in self._stream_names:
            try:
                await self._js.stream_info(name)
            except NotFoundError:
                raise StreamMissingError(
                    f"stream {name} does not exist (NATS lost it?); the NATS user "
                    f"{STREAMS_USER!r} makes it again"
                ) from None

    @property
    def _stream_names(self) -> tuple[str, str, str]:
        return (
            self._settings.stream,
            self._settings.deadletter_stream,
            self._settings.attempts_stream,
        )

    async def ensure_streams(self) -> None:
        """Make or update the streams (events, dead letters, attempts) where this connection
        may (the user ``STREAMS_USER``, or credentials in the URL: an operator's, a test's);
        any other service only waits until they exist, since its NATS user may read a
        stream's info but not change it."""
        events_max_age = self._settings.retention_hours * 3600
        for name, subjects, max_age, max_msgs in (
            (self._settings.stream, [EVENT_SUBJECTS], events_max_age, None),
            (
                self._settings.deadletter_stream,
                [f"{DEADLETTER_PREFIX}.>"],
                self._settings.deadletter_max_age_days * 86400,
                self._settings.deadletter_max_messages,
            ),
            # A tally is of a message of the event stream: it need not outlive it.
            (self._settings.attempts_stream, [f"{ATTEMPTS_PREFIX}.>"], events_max_age, None),
        ):
            attempts = name == self._settings.attempts_stream
            config = api.StreamConfig(
                name=name,
                subjects=subjects,
                storage=api.StorageType.FILE,
                retention=api.RetentionPolicy.LIMITS,
                max_age=max_age,
                max_msgs=max_msgs,
                duplicate_window=self._settings.duplicate_window_seconds,
                # Per-message TTLs (TTL_HEADER) on the event stream only: heartbeats expire in
                # minutes there. NATS cannot turn this off again once on, so it stays on.
                allow_msg_ttl=True if name == self._settings.stream else None,
                # One tally per message, read by its subject (a consumer's NATS user may read
                # only its own: ``$JS.API.DIRECT.GET.<stream>.attempts.<consumer>.>``).
                max_msgs_per_subject=1 if attempts else -1,
                allow_direct=True if attempts else None,
            )
            if not self.makes_streams:
                await self._wait_for_stream(name)
                continue
            await self._add_stream(config)

    async def _add_stream(self, config: api.StreamConfig) -> None:
        """Add ``config``'s stream, or update it where it exists with another configuration
        (e.g. an older duplicate window). A store the server fails to create is tried again
        ``STORE_RETRIES`` times, ``STORE_RETRY_S`` apart, before the error is raised: seen
        (nats-server 2.15, a loaded host) when a stream is made again right after the
        stream of that name was deleted, as a bus does when a stream was lost."""
        for attempt in range(STORE_RETRIES + 1):
            try:
                await self._js.add_stream(config)
                return
            except BadRequestError:
                await self._js.update_stream(config)
                return
            except nats.js.errors.ServerError as exc:
                if exc.err_code != STORE_FAILED_ERR_CODE or attempt == STORE_RETRIES:
                    raise
                log.warning(
                    "NATS could not create the store of stream %s yet; retrying", config.name
                )
                await asyncio.sleep(STORE_RETRY_S)

    async def _wait_for_stream(self, name: str) -> None:
        """Return once stream ``name`` exists, however long that takes: while it is missing
        (the scheduler, whose NATS user makes it, has not started yet or is down) or NATS
        does not answer, try again with capped back-off (``outage_retry_*``), saying why
        at the first miss and then at most every ``STREAM_WAIT_LOG_S``. A stop meanwhile
        cancels the start (``shared.runtime``)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        misses = 0
        said_at: float | None = None
        while True:
            try:
                await self._js.stream_info(name)
            except NotFoundError:
                why = f"it does not exist yet (the NATS user {STREAMS_USER!r} makes it)"
            except Exception as exc:
                fault = infrastructure_fault(exc)
                if fault is None:
                    raise
                why = fault
            else:
                if misses:
                    log.warning(
                        "stream %s is there after %.0f s: going on", name, loop.time() - started
                    )
                return
            misses += 1
            delay = self._outage_delay(misses)
            now = loop.time()
            if said_at is None or now - said_at >= STREAM_WAIT_LOG_S:
                said_at = now
                log.warning(
                    "waiting for stream %s: %s; %.0f s so far, next try in %.1f s",
                    name,
                    why,
                    now - started,
                    delay,
                )
            await asyncio.sleep(delay)

    async def publish(
        self, envelope: Envelope[Payload], headers: dict[str, str] | None = None
    ) -> None:
        """Publish one event now, with the current trace context (no outbox: for services
        without a database, such as the runner, whose event ids are deterministic); an event of
        ``UNTRACED_TYPES`` without a span or a trace context."""
        if envelope.type in UNTRACED_TYPES:
            await self.publish_raw(
                envelope.nats_subject, envelope.to_json(), envelope.id, dict(headers or {})
            )
            return
        with _tracer.start_as_current_span(
            f"{envelope.type} publish", kind=trace.SpanKind.PRODUCER, attributes=_attrs(envelope)
        ):
            await self.publish_raw(
                envelope.nats_subject, envelope.to_json(), envelope.id, inject(headers)
            )

    def msg_id(self, subject: str, event_id: str) -> str:
        """The ``Nats-Msg-Id`` this connection publishes ``event_id`` on ``subject`` under
        (module docstring; ``keyed_msg_id``): the same in every process of its service,
        unknown to every other publisher."""
        return keyed_msg_id(self._dedup_key, subject, event_id)

    async def publish_raw(
        self, subject: str, body: bytes, event_id: str, headers: dict[str, str]
    ) -> api.PubAck:
        """Publish ``body`` on ``subject`` once: a re-publish of ``event_id`` there inside the
        duplicate window is dropped (``msg_id``; any ``Nats-Msg-Id`` in ``headers`` is
        replaced)."""
        return await self._js.publish(
            subject,
            body,
            timeout=self._settings.publish_timeout_seconds,
            headers={**headers, MSG_ID_HEADER: self.msg_id(subject, event_id)},
        )

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        """Publish ``(subject, body, event id, headers)`` messages in order, pipelined: all are
        sent before the first acknowledgement is awaited, each under its ``msg_id``. Raises
        if any was not stored."""
        acks = [
            await self._js.publish_async(
                subject, body, headers={**headers, MSG_ID_HEADER: self.msg_id(subject, event_id)}
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
        *,
        redrive: bool = True,
        parse: Callable[[bytes], Envelope[Payload]] = parse_envelope,
    ) -> None:
        """Handle messages of ``subjects`` in order, one at a time, until ``stop`` is set, then
        return after the batch in hand is finished (graceful drain). Without ``redrive`` the
        consumer reads no redrive subject, so one subject filter stays one: it then travels
        in the consumer-create request's subject, where NATS permissions can check it (a
        runner's NATS user may create its consumer only with its own node's filter).
        ``parse`` reads a message's bytes (``parse_envelope``, or one that reads more of
        them); what it raises ``EventParseError`` for is dead-lettered as unparseable."""

        async def each(deliveries: Sequence[Delivery]) -> None:
            for delivery in deliveries:
                with delivery.span(consumer):
                    await handler(delivery.envelope)

        await self._pull(
            consumer, subjects, each, stop, batch, atomic=False, redrive=redrive, parse=parse
        )

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
        redrive: bool = True,
        parse: Callable[[bytes], Envelope[Payload]] = parse_envelope,
    ) -> None:
        filters = [*subjects, redrive_subject(consumer)] if redrive else subjects
        one = filters[0] if len(filters) == 1 else None
        config = api.ConsumerConfig(
            name=consumer,
            durable_name=consumer,
            filter_subject=one,  # then in the create subject, which permissions see
            filter_subjects=None if one else filters,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            # Unlimited: the server would otherwise stop delivering a message silently after
            # so many deliveries; this consumer decides instead (dead letter, with a reason).
            max_deliver=-1,
            ack_wait=self._settings.ack_wait_seconds,
            # At most the batch in hand is unacknowledged: what a consumer that died held
            # comes back (after ack_wait) before anything newer, so order survives a crash.
            max_ack_pending=batch,
        )
        sub = await _DurablePull.bind(self, config)
        self._stops[consumer] = stop
        self._parsers[consumer] = parse
        self._counters_from_zero(consumer)
        asked_at = _utc_now()
        lost_cancel = _LostCancellation()

        async def fetch() -> list[Msg]:
            nonlocal asked_at
            asked_at = _utc_now()
            try:
                fetched = await sub.fetch(batch, timeout=0.5)
            except (TimeoutError, NatsTimeoutError):
                fetched = []
            except Exception:
                self._fetching_since.pop(consumer, None)  # a gap: hearing begins again
                raise
            if lost_cancel.was_asked():
                raise asyncio.CancelledError
            return fetched

        try:
            while not stop.is_set():
                try:
                    messages = await self._through_outages(consumer, fetch, stop)
                except _Stopped:
                    break
                if messages:
                    try:
                        async with self._kept_in_progress(consumer, messages):
                            await self._handle_batch(consumer, messages, handler, stop, atomic)
                    except NotNow as exc:
                        # What was not settled went back as the batch left hand.
                        log.info("%s: %s; the events in hand went back", consumer, exc)
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(self._settings.retry_delay_seconds):
                                await stop.wait()
                        continue
                judged = consumer in self._heeded
                drained = judged and await sub.nothing_waiting(messages)
                self._fetched(consumer, asked_at, drained=drained)
        finally:
            self._stops.pop(consumer, None)
            self._parsers.pop(consumer, None)
            self._fetching_since.pop(consumer, None)
            self._heard_through.pop(consumer, None)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _consumer_gone(self, consumer: str) -> bool:
        """Whether the durable consumer (or its stream) no longer exists on the server."""
        try:
            await self._js.consumer_info(self._settings.stream, consumer)
        except NotFoundError:
            return True
        return False

    async def _ensure_consumer(self, config: api.ConsumerConfig) -> None:
        # NATS 2.10+ treats a create for an existing durable as create-or-update, so a
        # consumer whose filters changed between releases is updated in place.
        await self._js.add_consumer(self._settings.stream, config)

    async def _handle_batch(
        self,
        consumer: str,
        messages: Sequence[Msg],
        handler: BatchHandler,
        stop: asyncio.Event,
        atomic: bool,
    ) -> None:
        parsed = []
        for msg in messages:
            deliveries = msg.metadata.num_delivered
            try:
                tally = await self._tally(consumer, msg, stop)
            except _Stopped:
                return  # what is in hand goes back as the batch leaves hand
            self._tallies[id(msg)] = tally
            unfinished = tally.unfinished(deliveries)
            if unfinished >= self._settings.max_unfinished_deliveries:
                await self._dead_letter(
                    consumer,
                    msg,
                    f"abandoned: {unfinished} of its {deliveries - 1} earlier deliveries ended "
                    "without an outcome (the consumer died while handling it, each time)",
                )
                continue
            found = await self._parse(consumer, msg)
            if found:
                parsed.append(found)
        if atomic and len(parsed) > 1 and await self._handle_all(consumer, parsed, handler, stop):
            return
        for msg, delivery in parsed:
            await self._handle(consumer, msg, delivery, handler, stop)

    async def _parse(self, consumer: str, msg: Msg) -> tuple[Msg, Delivery] | None:
        try:
            envelope = self._parsers.get(consumer, parse_envelope)(msg.data)
        except EventParseError as exc:
            await self._dead_letter(consumer, msg, f"unparseable event: {exc}")
            return None
        came_on = msg.subject
        if came_on == redrive_subject(consumer):
            # A redrive comes on the consumer's own redrive subject, which only its service
            # publishes, but its body is the dead letter's: what vouches for that is the
            # subject it first came on, which the bus recorded when it dead-lettered it.
            # Judged on the redrive subject alone, a forgery dead-lettered for its subject
            # (a runner's report claiming the scheduler) passed once redriven.
            came_on = (msg.headers or {}).get(ORIGINAL_SUBJECT_HEADER, "")
        if not came_on:
            forged: str | None = "a redrive that does not name the subject it first came on"
        else:
            forged = forged_because(
                envelope.type,
                envelope.source,
                routing_key=envelope.subject,
                subject=came_on,
                node=speaker_of(envelope.data),
            ) or misrouted_because(envelope.data, envelope.subject)
        if forged is not None:
            await self._dead_letter(consumer, msg, f"forged event: {forged}")
            return None
        return msg, Delivery(envelope, msg.headers or {})

    async def _handle_all(
        self,
        consumer: str,
        parsed: Sequence[tuple[Msg, Delivery]],
        handler: BatchHandler,
        stop: asyncio.Event,
    ) -> bool:
        """Apply a whole batch at once, waiting out outages; False (nothing applied) if it
        failed otherwise."""
        deliveries = [delivery for _, delivery in parsed]
        try:
            await self._apply(consumer, handler, deliveries, stop)
        except _Stopped:
            for msg, _ in parsed:
                await self._hand_back(consumer, msg)
            return True
        except NotNow:
            raise  # not the events': all of them go back
        except Exception as exc:
            # No outcome of any event yet: each counts its own, handled alone.
            log.info("batch of %d failed (%s); handling them one at a time", len(parsed), exc)
            return False
        for msg, _ in parsed:
            await self._ack(msg)
        self._event_metrics.settled(consumer, (d.envelope for d in deliveries), "ok")
        return True

    async def _apply(
        self,
        consumer: str,
        handler: BatchHandler,
        deliveries: Sequence[Delivery],
        stop: asyncio.Event,
    ) -> None:
        """``handler(deliveries)``, waiting out outages (``_through_outages``); the time of
        the attempt that applied them is recorded (``EventMetrics.applied``), not the wait."""
        took = 0.0

        async def attempt() -> None:
            nonlocal took
            started = time.perf_counter()
            await handler(deliveries)
            took = time.perf_counter() - started

        await self._through_outages(consumer, attempt, stop)
        self._event_metrics.applied(consumer, [d.envelope for d in deliveries], took)

    async def _handle(
        self,
        consumer: str,
        msg: Msg,
        delivery: Delivery,
        handler: BatchHandler,
        stop: asyncio.Event,
    ) -> None:
        # What is said of this event after its handler's span (it will be retried, it is
        # dead-lettered) names its job too.
        with delivery.about_its_job():
            await self._handle_in_scope(consumer, msg, delivery, handler, stop)

    async def _handle_in_scope(
        self,
        consumer: str,
        msg: Msg,
        delivery: Delivery,
        handler: BatchHandler,
        stop: asyncio.Event,
    ) -> None:
        deliveries = msg.metadata.num_delivered
        envelope = delivery.envelope
        try:
            await self._apply(consumer, handler, [delivery], stop)
        except _Stopped:
            await self._hand_back(consumer, msg)
            return
        except NotNow:
            raise  # not the event's: it goes back with the rest of the batch, unsettled
        except Reject as exc:
            if await self._dead_letter(consumer, msg, f"rejected: {exc}"):
                self._event_metrics.settled(consumer, [envelope], "dead_lettered")
            return
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            tally = self._tallies.get(id(msg), Tally())
            waiting = isinstance(exc, NotYet)
            # Only this handler's own outcomes count: not the deliveries that ended in a
            # stop, a crash or a hand-back (JetStream's delivery count has those too).
            count = (tally.waits if waiting else tally.failures) + 1
            last = self._settings.max_deliver
            if waiting:  # the earlier event may come back after ack_wait
                last += NOT_YET_EXTRA_DELIVERIES
            if count >= last:
                log.error(
                    "%s: giving up on %s after %d failures (delivery %d): %s",
                    consumer,
                    envelope.id,
                    count,
                    deliveries,
                    reason,
                )
                # The dead letter outlives the log and is read through an API: a database
                # error's values stay in the log only (``span_errors.safe_message``).
                kept = f"{type(exc).__name__}: {safe_message(exc)}"
                if await self._dead_letter(consumer, msg, f"failed {count} times: {kept}"):
                    self._event_metrics.settled(consumer, [envelope], "dead_lettered")
                return
            try:
                await self._through_outages(
                    consumer,
                    lambda: self._record(
                        consumer, msg, waits=1 if waiting else 0, failures=0 if waiting else 1
                    ),
                    stop,
                )
            except _Stopped:
                await self._hand_back(consumer, msg)
                return
            log.warning(
                "%s: %s failed (failure %d of %d, delivery %d), will retry: %s",
                consumer,
                envelope.id,
                count,
                last,
                deliveries,
                reason,
            )
            delay = (
                self._retry_delay(count)
                if count < self._settings.max_deliver
                else self._settings.ack_wait_seconds  # a NotYet past max_deliver
            )
            await self._settle(msg, msg.nak(delay=delay))
            self._event_metrics.settled(consumer, [envelope], "failed")
            return
        await self._ack(msg)
        self._event_metrics.settled(consumer, [envelope], "ok")

    async def _through_outages(
        self, consumer: str, attempt: Callable[[], Awaitable[T]], stop: asyncio.Event
    ) -> T:
        """``attempt()``, again and again while it fails with an infrastructure fault, with
        capped exponential back-off and jitter; the consumer counts as paused meanwhile.
        Other errors propagate; ``_Stopped`` when ``stop`` is set during an outage. After a
        pause its last line says how the pause ended: ``resumed`` (a try succeeded),
        ``stopped while paused``, ``cancelled while paused`` or ``outage over, the next try
        failed (<error type>)``."""
        failures = 0
        ended = "stopped while paused,"  # what the last line says, unless the end is another
        started = asyncio.get_running_loop().time()
        lost_cancel = _LostCancellation()
        try:
            while True:
                try:
                    result = await attempt()
                except asyncio.CancelledError:
                    ended = "cancelled while paused,"
                    raise
                except Exception as exc:
                    if lost_cancel.was_asked():  # else lost in the try, it would retry for good
                        ended = "cancelled while paused,"
                        raise asyncio.CancelledError from exc
                    fault = infrastructure_fault(exc)
                    if fault is None:
                        ended = f"outage over, the next try failed ({type(exc).__name__}),"
                        raise
                    if stop.is_set():
                        raise _Stopped from exc
                    failures += 1
                    self._outage_retries.add(1, {"consumer": consumer})
                    if failures == 1:
                        log.warning("%s: paused, waiting out an outage: %s", consumer, fault)
                        self._paused[consumer] = fault
                        self._paused_metric.add(1, {"consumer": consumer})
                    delay = self._outage_delay(failures)
                    log.info(
                        "%s: still paused (attempt %d failed: %s); next try in %.1f s",
                        consumer,
                        failures,
                        fault,
                        delay,
                    )
                    try:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(delay):
                                await stop.wait()
                    except asyncio.CancelledError:
                        ended = "cancelled while paused,"
                        raise
                    if stop.is_set():
                        raise _Stopped from exc
                else:
                    ended = "resumed"
                    return result
        finally:
            if failures:
                self._paused.pop(consumer, None)
                self._paused_metric.add(-1, {"consumer": consumer})
                log.warning(
                    # Only a try that succeeded resumes: a stop, a cancel or an error of the
                    # try's own ends the pause otherwise, and the line says which.
                    "%s: %s after %.1f s and %d retries",
                    consumer,
                    ended,
                    asyncio.get_running_loop().time() - started,
                    failures,
                )

    def _retry_delay(self, failures: int) -> float:
        """The delay before a message that failed ``failures`` times comes back:
        ``retry_delay_seconds`` doubled per failure after the first, at most
        ``retry_delay_max_seconds`` (the exponent is bounded first: 2 ** 1100 is no float)."""
        return min(
            self._settings.retry_delay_max_seconds,
            self._settings.retry_delay_seconds * 2.0 ** min(failures - 1, 64),
        )

    def _outage_delay(self, failures: int) -> float:
        """Capped exponential back-off with jitter: half the step, plus up to another half."""
        step = min(
            self._settings.outage_retry_max_seconds,
            self._settings.outage_retry_initial_seconds * 2.0 ** min(failures - 1, 30),
        )
        return step / 2 + random.uniform(0, step / 2)

    async def _tally(self, consumer: str, msg: Msg, stop: asyncio.Event) -> Tally:
        """The recorded outcomes of ``msg``'s earlier deliveries to ``consumer``, waiting out
        an outage (``_Stopped`` on a stop meanwhile). A first delivery has none to read."""
        if msg.metadata.num_delivered <= 1:
            return Tally()
        return await self._through_outages(consumer, lambda: self._read_tally(consumer, msg), stop)

    async def _read_tally(self, consumer: str, msg: Msg) -> Tally:
        subject = attempts_subject(consumer, msg.metadata.sequence.stream)
        try:
            raw = await self._js.get_msg(
                self._settings.attempts_stream, subject=subject, direct=True
            )
        except NotFoundError:
            return Tally()
        except nats.errors.NoRespondersError:
            # Nothing answers a direct get of a stream that is not there (NATS lost its
            # store, or it was deleted): made again here where this bus may, waited for as
            # an outage elsewhere (``StreamMissingError``); tried again either way.
            await self._restore_streams()
            raise
        return Tally.from_json(raw.data, _msg_id(msg), raw.seq or 0)

    async def _record(
        self, consumer: str, msg: Msg, *, failures: int = 0, waits: int = 0, handed_back: int = 0
    ) -> None:
        """Add the outcome of ``msg``'s present delivery to its tally in the attempts stream,
        once: a delivery the tally already counts is not added again. The write says which
        record it follows (``EXPECTED_LAST_HEADER``); if another was written since (a replica
        that held the message before, a record of a lost stream's message of that sequence,
        or this very write, stored though its acknowledgement was lost and it was tried
        again), the tally is read again and the outcome added to it unless it is there."""
        subject = attempts_subject(consumer, msg.metadata.sequence.stream)
        delivery = self._delivery_ids.setdefault(id(msg), uuid.uuid4().hex[:DELIVERY_ID_CHARS])
        tally = self._tallies.get(id(msg))
        for attempt in range(RECORD_TRIES):
            if tally is None:
                tally = await self._read_tally(consumer, msg)
            if delivery in tally.deliveries:
                self._tallies[id(msg)] = tally
                return
            new = replace(
                tally,
                failures=tally.failures + failures,
                waits=tally.waits + waits,
                handed_back=tally.handed_back + handed_back,
                deliveries=(*tally.deliveries, delivery)[-RECORDED_DELIVERIES_KEPT:],
            )
            try:
                ack = await self._js.publish(
                    subject,
                    new.to_json(_msg_id(msg)),
                    timeout=self._settings.publish_timeout_seconds,
                    headers={EXPECTED_LAST_HEADER: str(tally.revision)},
                )
            except nats.js.errors.NoStreamResponseError:
                await self._restore_streams()  # as in ``_read_tally``
                raise
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE_ERR_CODE or attempt == RECORD_TRIES - 1:
                    raise
                tally = None
                continue
            self._tallies[id(msg)] = replace(new, revision=ack.seq)
            return

    @asynccontextmanager
    async def _kept_in_progress(
        self, consumer: str, messages: Sequence[Msg]
    ) -> AsyncIterator[None]:
        """While the batch is in hand, tell JetStream every third of ``ack_wait`` that each
        message not yet settled is still being worked on, so it is not redelivered. A
        message still unsettled when the batch leaves hand is handed back (``_hand_back``):
        the consumer was cancelled (its service's stop grace ran out while an attempt waited
        on a dependency), and the message goes at once to the next process instead of after
        ``ack_wait``."""
        interval = max(self._settings.ack_wait_seconds / 3, 0.05)

        async def beat() -> None:
            while True:
                await asyncio.sleep(interval)
                for msg in messages:
                    if id(msg) not in self._settled:  # not acked, nak'ed or terminated
                        with contextlib.suppress(Exception):  # NATS away: nothing to tell
                            await msg.in_progress()

        task = asyncio.create_task(beat(), name="in-progress")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            try:
                for msg in messages:
                    if id(msg) not in self._settled:
                        await self._hand_back(consumer, msg)
            finally:
                self._settled.difference_update(id(msg) for msg in messages)
                for msg in messages:
                    self._tallies.pop(id(msg), None)
                    self._delivery_ids.pop(id(msg), None)

    async def _settle(self, msg: Msg, outcome: Awaitable[None]) -> None:
        """Tell JetStream ``msg``'s outcome (``msg.ack()``, ``msg.nak(...)``, ``msg.term()``)
        and, once told, remember it settled: no more in-progress beats, no hand-back. An
        outcome that could not be told leaves it unsettled, as nats-py does."""
        await outcome
        self._settled.add(id(msg))

    async def _ack(self, msg: Msg) -> None:
        try:
            await self._settle(msg, msg.ack())
        except Exception as exc:
            if infrastructure_fault(exc) is None:
                raise
            # Handled and committed; the message comes back after ack_wait and the
            # consumer's inbox (or the handler's own idempotency) makes that harmless.
            log.warning("ack of message %d lost: %s", msg.metadata.sequence.stream, exc)

    async def _hand_back(self, consumer: str, msg: Msg) -> None:
        """Give the message back now for the next process (stopping, cancelled, ``NotNow``):
        recorded as handed back (``Tally``), so this delivery counts as no failure and not as
        one without an outcome; never dead-lettered. While NATS is away nothing can be
        recorded nor told: it comes back after ``ack_wait``, as if the process had died."""
        if self._nc.is_connected:
            try:
                async with asyncio.timeout(self._settings.publish_timeout_seconds):
                    await self._record(consumer, msg, handed_back=1)
            except Exception as exc:  # the message goes back all the same
                log.log(
                    logging.INFO if infrastructure_fault(exc) else logging.WARNING,
                    "%s: could not record message %d as handed back (it counts as a delivery "
                    "without an outcome): %s",
                    consumer,
                    msg.metadata.sequence.stream,
                    error_text(exc),
                )
        try:
            await self._settle(msg, msg.nak())
        except Exception as exc:
            if infrastructure_fault(exc) is None:
                raise
            log.info("message %d goes back after ack_wait", msg.metadata.sequence.stream)

    def _counters_from_zero(self, consumer: str) -> None:
        """Report ``consumer``'s dead letters of every kind, its outage retries and whether it
        is paused, 0 until they happen (``DEAD_LETTER_KINDS``)."""
        self._outage_retries.add(0, {"consumer": consumer})
        self._paused_metric.add(0, {"consumer": consumer})
        for kind in DEAD_LETTER_KINDS:
            self._dead_letters.add(0, {"consumer": consumer, "kind": kind})

    async def _dead_letter(self, consumer: str, msg: Msg, reason: str) -> bool:
        """Copy ``msg`` to the consumer's dead letters and terminate it: True; False when a
        stop came while the dead-letter stream could not be written (handed back). A lost
        dead-letter stream is made again where this bus may (``_restore_streams``)."""
        seq = msg.metadata.sequence.stream
        reason = " ".join(reason.split())[:1000]  # one header line
        original = dict(msg.headers or {})
        subject = msg.subject
        if subject == redrive_subject(consumer):  # failed again after a redrive
            subject = original.get(ORIGINAL_SUBJECT_HEADER) or subject
        copied = {k: v for k, v in original.items() if not k.startswith(("Nats-", "Trainyard-"))}
        ours = {
            REASON_HEADER: reason,
            ORIGINAL_SUBJECT_HEADER: subject,
            CONSUMER_HEADER: consumer,
            ORIGINAL_SEQUENCE_HEADER: str(seq),
            DELIVERIES_HEADER: str(msg.metadata.num_delivered),
        }
        if MSG_ID_HEADER in original:
            ours[ORIGINAL_MSG_ID_HEADER] = original[MSG_ID_HEADER]
        letter_id = f"deadletter:{consumer}:{seq}"
        letter_msg_id = self.msg_id(deadletter_subject(consumer), letter_id)
        body, headers = _fit(msg.data, copied, ours, letter_msg_id, self.max_payload)

        async def publish() -> None:
            try:
                await self.publish_raw(deadletter_subject(consumer), body, letter_id, headers)
            except nats.js.errors.NoStreamResponseError:
                # No stream took it: the dead-letter stream was lost (deleted by hand). Made
                # again here where this bus may, waited for elsewhere, as in ``_read_tally``.
                await self._restore_streams()
                raise

        try:
            await self._through_outages(
                consumer, publish, self._stops.get(consumer) or asyncio.Event()
            )
        except _Stopped:
            await self._hand_back(consumer, msg)
            return False
        await self._settle(msg, msg.term())
        kind = reason.split(" ", 1)[0].rstrip(":")
        self._dead_letters.add(1, {"consumer": consumer, "kind": kind})
        log.error("%s: dead-lettered message %d from %s: %s", consumer, seq, subject, reason)
        return True


def _utc_now() -> datetime:
    return datetime.now(UTC)


def headers_size(headers: Mapping[str, str]) -> int:
    """The bytes ``headers`` take in a NATS message (``NATS/1.0``, a ``key: value`` line
    each, a blank line), which count against the server's ``max_payload`` with the body."""
    if not headers:
        return 0
    lines = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(b"NATS/1.0\r\n\r\n") + lines


_FIT_MARGIN = 64
"""Bytes left free under ``max_payload`` when a dead letter's body is cut (the protocol line
is not counted there)."""


MAX_HEADERS_BYTES = 64 * 1024
"""The most a message's headers may take in JetStream (it refuses more: error 10097)."""
_FIT_VALUE_CHARS = 256
"""Longest value of a dead letter's own header when its message's headers had to go (the
original ``Nats-Msg-Id`` is the sender's to choose)."""


def _fit(
    body: bytes, copied: dict[str, str], ours: dict[str, str], msg_id: str, limit: int
) -> tuple[bytes, dict[str, str]]:
    """A dead letter's body and headers (the message's ``copied`` ones, then ``ours``) within
    ``limit`` with the message id's header, and its headers within ``MAX_HEADERS_BYTES``: as
    they are when they fit; else the body cut to its start, and, when the headers alone
    leave no room or are more than JetStream takes, without the copied headers and with each
    of ours cut to ``_FIT_VALUE_CHARS``; ``TRUNCATED_HEADER`` (the body's original size) says
    it is not the message as it came. A message as large as the server takes, copied with
    its reason and origin, exceeded the first limit: the server refused the publish and
    closed the connection, which read as an outage, and the consumer waited for ever; one
    with headers near JetStream's limit exceeded the second, and the refusal ended the
    consumer, at every start again."""
    headers = {**copied, **ours}

    def room(kept: dict[str, str]) -> int:
        return limit - headers_size({**kept, "Nats-Msg-Id": msg_id}) - _FIT_MARGIN

    def headers_fit(kept: dict[str, str]) -> bool:
        return headers_size({**kept, "Nats-Msg-Id": msg_id}) + _FIT_MARGIN <= MAX_HEADERS_BYTES

    if len(body) <= room(headers) and headers_fit(headers):
        return body, headers
    mark = {TRUNCATED_HEADER: str(len(body))}
    if room({**headers, **mark}) < 0 or not headers_fit({**headers, **mark}):
        headers = {k: v[:_FIT_VALUE_CHARS] for k, v in ours.items()}
    headers |= mark
    return body[: max(0, room(headers))], headers


def _msg_id(msg: Msg) -> str:
    """The id a message was published with (its event's id): what tells a tally of it from one
    of another message at that sequence of a stream made again."""
    return (msg.headers or {}).get(MSG_ID_HEADER, "")


def _reconnects(nc: NatsClient) -> int:
    """How many times ``nc`` has reconnected (nats-py counts them in ``stats``)."""
    return int(getattr(nc, "stats", {}).get("reconnects", 0))


class _LostCancellation:
    """Whether the task that made it was asked to cancel since, though no cancellation came.

    Python 3.11's ``asyncio.wait_for``, which nats-py awaits in every fetch and request,
    returns its result when that is ready as the cancellation comes, and the cancellation is
    lost (CPython gh-86296, fixed in 3.12). The task still counts the request
    (``Task.cancelling``), so a loop that asks after each fetch or failed try, and raises
    ``CancelledError`` itself, stops as it was told to instead of going on for good (a
    consumer cancelled at its service's stop, or under an ``asyncio.timeout``)."""

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._before = task.cancelling()

    def was_asked(self) -> bool:
        return self._task.cancelling() > self._before


class _DurablePull:
    """A pull subscription to a durable consumer that makes the consumer again when it is
    gone (its stream lost with the server's store): the fetch that finds it gone restores
    the streams (``Bus._restore_streams``), binds anew and raises ``ConsumerLostError``, an
    outage the consumer waits out for a moment, so its loop sees the gap.

    It keeps stream order across a consumer that stopped or died with messages in hand:
    binding, it finds them still unacknowledged (``num_ack_pending``, which counts those
    handed back until they are delivered again) and lowers the consumer's
    ``max_ack_pending`` to their number, so the server delivers nothing newer until they
    have come back (at once when handed back, after ``ack_wait`` when a consumer died) and
    been settled; then the limit is the batch again."""

    def __init__(self, bus: Bus, config: api.ConsumerConfig, sub: Pull) -> None:
        self._bus = bus
        self._config = config
        self._sub = sub
        self._holding = False
        self._handed_over = 0
        """The last consumer sequence the server had delivered when bound, or of a message
        this subscription's fetches handed over since (``nothing_waiting``)."""
        self._buffered_at_fetch = 0

    @classmethod
    async def bind(cls, bus: Bus, config: api.ConsumerConfig) -> _DurablePull:
        pull = cls(bus, config, await cls._subscribe(bus, config))
        await pull._hold_newer_while_pending()
        return pull

    async def _hold_newer_while_pending(self) -> None:
        name = self._config.durable_name
        assert name is not None
        info = await self._bus.jetstream.consumer_info(self._bus.settings.stream, name)
        self._handed_over = _delivered(info)
        pending = info.num_ack_pending or 0
        if pending and pending < (self._config.max_ack_pending or 0):
            # The server counts a message handed back (nak) as unacknowledged until it is
            # delivered again, at once: this is no sign of a wait for ack_wait.
            log.info(
                "%s: %d messages delivered before this start are not settled yet: nothing "
                "newer until they are (one handed back on a stop comes at once, one held by "
                "a consumer that died after ack_wait)",
                name,
                pending,
            )
            await self._bus._ensure_consumer(replace(self._config, max_ack_pending=pending))
            self._holding = True

    async def _release_when_settled(self) -> None:
        name = self._config.durable_name
        assert name is not None
        info = await self._bus.jetstream.consumer_info(self._bus.settings.stream, name)
        if not info.num_ack_pending:
            await self._bus._ensure_consumer(self._config)
            self._holding = False

    @staticmethod
    async def _subscribe(bus: Bus, config: api.ConsumerConfig) -> Pull:
        await bus._ensure_consumer(config)
        assert config.durable_name is not None
        return await bus.jetstream.pull_subscribe_bind(
            durable=config.durable_name, stream=bus.settings.stream
        )

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109
        try:
            if self._holding:  # what came before is settled once nothing is pending
                await self._release_when_settled()
            self._buffered_at_fetch = self._sub.pending_msgs
            fetched = await self._sub.fetch(batch, timeout=timeout)
            for msg in fetched:
                self._handed_over = max(self._handed_over, msg.metadata.sequence.consumer)
            return fetched
        except nats.js.errors.ServiceUnavailableError:
            # No one answers for the consumer: NATS is away (waited out), or the consumer
            # is gone with its stream (a server that lost its store): made again here.
            name = self._config.durable_name
            assert name is not None
            if not await self._bus._consumer_gone(name):
                raise
            log.warning("%s: the durable consumer is gone (stream lost?); making it again", name)
            await self._bus._restore_streams()
            old, self._sub = self._sub, await self._subscribe(self._bus, self._config)
            self._handed_over = 0  # a new consumer: its deliveries count from 1
            with contextlib.suppress(Exception):
                await old.unsubscribe()
            raise ConsumerLostError(f"consumer {name} was gone and is made again") from None

    async def nothing_waiting(self, fetched: Sequence[Msg]) -> bool:
        """Whether nothing was left for this consumer once ``fetched`` came back and was
        handled (every message published before the fetch began was in it or an earlier
        one). Fewer messages than asked proves nothing: a fetch that a busy event loop kept
        from reading in time comes back short, or empty, while hundreds wait (seen with a
        pass holding the loop for half a second), and so does one while newer messages are
        held back (``_hold_newer_while_pending``).

        The last message's ``num_pending`` (none undelivered when the server sent it) is
        enough when the fetch asked the server for all it brought. Otherwise (an empty fetch,
        or one that began with messages of an earlier one in the client's buffer, sent before
        it began) the server is asked: none undelivered, and none delivered that this
        subscription has not handed over (its last delivered consumer sequence; so a message
        still on its way, or in the buffer, counts), unless the server holds none delivered
        and unacknowledged: then whatever it delivered elsewhere (a deposed leader still
        fetching after this one bound) was handled and acknowledged there, and a silent
        stream is caught up without waiting for a newer message. The buffer's own size is
        no answer: it also holds the status replies (``408 Request Timeout``) of pull
        requests that expired just after their fetch gave up, as an idle consumer's often
        do. An unanswered question is a no."""
        if fetched and (fetched[-1].metadata.num_pending or not self._buffered_at_fetch):
            return fetched[-1].metadata.num_pending == 0
        try:
            info = await self._sub.consumer_info()
        except Exception:
            return False
        handed_over = _delivered(info) <= self._handed_over
        return info.num_pending == 0 and (handed_over or not info.num_ack_pending)

    async def unsubscribe(self) -> None:
        await self._sub.unsubscribe()


Pull = JetStreamContext.PullSubscription


def _delivered(info: api.ConsumerInfo) -> int:
    """The consumer sequence of the last message the server delivered (0: none yet)."""
    return info.delivered.consumer_seq if info.delivered is not None else 0


def _auth(settings: NatsSettings) -> dict[str, str]:
    """Connect options for the settings' user: its password and its own inbox prefix (a user
    may subscribe only to ``_INBOX.<user>.>``, so no one reads another's replies)."""
    if settings.user is None:
        return {}
    password = settings.password.get_secret_value() if settings.password is not None else ""
    return {"user": settings.user, "password": password, "inbox_prefix": f"_INBOX.{settings.user}"}


def untraced() -> AbstractContextManager[None]:
    """Run the block under no span (an invalid current span, in an otherwise empty context):
    nothing started inside it is recorded or joins the caller's trace."""
    return _current(trace.INVALID_SPAN)


@contextmanager
def _current(span: trace.Span) -> Iterator[None]:
    """Run the block with ``span`` current in an otherwise empty context (no span started)."""
    token = otel_context.attach(trace.set_span_in_context(span, otel_context.Context()))
    try:
        yield
    finally:
        otel_context.detach(token)


def job_of(envelope: Envelope[Payload]) -> str | None:
    """The job an event is about: its payload's ``job_id`` (a grant, a revocation or a batch
    of a job's metrics is routed by its node, yet about one job), else its routing key when
    its type is routed by job (``shared.logs.span_job_id``); None for an event about no one
    job (a heartbeat, a flavor, a budget)."""
    job_id = getattr(envelope.data, "job_id", None)
    return job_id if isinstance(job_id, str) else span_job_id(_attrs(envelope))


def _attrs(envelope: Envelope[Payload]) -> dict[str, str]:
    return {
        "messaging.system": "nats",
        "messaging.destination.name": envelope.nats_subject,
        "messaging.message.id": envelope.id,
        "cloudevents.event_type": envelope.type,
        "cloudevents.event_subject": envelope.subject,
    }
