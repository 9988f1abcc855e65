"""The transactional outbox: events leave the service exactly when their change commits.

Contract:
- ``enqueue(conn, *envelopes)`` must run inside the transaction that makes the change; it
  stores the events with the current trace context (in one statement). A rolled back
  transaction therefore publishes nothing. A statement that inserts outbox rows itself
  (the change and its events in one data-modifying CTE) calls ``enqueued_by(conn)``. ``enqueue_traced`` does the same for events that
  each carry their own trace context (``traced`` takes it).
- Waking the relay: when a connection that enqueued goes back to its pool (its transaction
  has ended by then; ``shared.db.on_release``), every relay of this process is woken. Each process that enqueues runs a relay, so committed rows leave at once; a relay
  that was not woken (a row written by another process, a wake missed) finds them within
  ``idle_poll_s``. Not ``NOTIFY``: PostgreSQL serializes the commits of all transactions
  that notify (a database-wide lock held through the commit's flush), which made every
  submission wait for the ones before it.
- ``OutboxRelay.run`` publishes unpublished events in commit order with ``Nats-Msg-Id`` = the
  bus's keyed id of the event (``Bus.msg_id``) and marks them published. A batch is
  published pipelined (all sent in order, then the acknowledgements awaited together). A crash between publish and mark re-publishes the
  event (once the crashed relay's claim ran out, below); JetStream drops the duplicate
  inside its window, so each event is published once.
- Under load a round gathers several commits: after a round that published something, the
  next one starts no sooner than ``busy_round_s`` (10 ms) after it began, so a busy relay
  pays its fixed cost per round (a pool round, its transaction and statements, one wait on
  the acknowledgements) once for all the rows committed meanwhile, not once for every few
  rows. An idle relay woken by a commit starts at once, and a full batch (a backlog) is
  followed at once: only a busy relay adds that much delay, at most. ``run``'s final flush
  does not wait. A service whose rows come at a high rate may gather longer (the
  submission service: ``outbox_busy_round_s``, 40 ms).
- No connection is held while the relay waits for NATS: a round claims its rows (one short
  transaction), gives its connection back, publishes, and marks them on another (one
  statement). A connection held through the publish would be one fewer for the service's
  requests and handlers for as long as a slow or stalled NATS takes to answer, and a pool of
  a few (``TRAINYARD_DATABASE_POOL_MAX_SIZE``) would starve.
- Several replicas may relay one outbox. A claim (``claimed_by``, ``claimed_until``) lasts
  ``claim_s`` (``default_claim_s``: three publish timeouts, at most half the duplicate
  window); a relay claims only the rows before the first one another relay's live claim
  holds (claims are taken one at a time, under a transaction advisory lock), so no replica
  publishes a row another is publishing, nor one after it: the outbox's order holds across
  replicas, and one replica publishes at a time. A round that ends in a failure gives back
  the rows it could not publish (the next round, any relay's, starts with them), as does a
  round cancelled in the middle (or whose process exits then). A relay gone for good
  (killed, hung) holds its rows until its claim runs out; then another publishes them
  again. JetStream drops what the first had stored (duplicate ids), and as every relay
  sends its rows in order from the oldest unpublished one, the stream keeps the outbox's
  order.
- A row the bus will never accept is *parked*, not retried: larger than the bus's maximum
  payload (body and headers; the server's ``max_payload`` or ``max_payload=`` if smaller),
  or refused for a reason that does not pass (maximum payload exceeded, a permissions
  violation, a bad subject). Its ``parked_at`` and ``parked_reason`` are set, it is logged
  once at error level, and it is skipped from then on; the rows after it are published as
  usual. ``parked_count`` says how many there are (also logged when the relay starts).
- Transient failures (NATS or PostgreSQL unreachable, timeouts) are retried with a growing
  pause; ``run`` never raises for a row or an outage, so the service keeps serving.
- Lost stream: published rows stay for the retention window (``shared.retention``), and the
  relay remembers the identity (``Bus.stream_created``) of the event stream it publishes to
  (table ``outbox_stream``). ``check_stream`` compares them, when ``run`` starts, after
  every failure or NATS reconnect, and at least every ``stream_check_s``: a stream with
  another identity was lost and made again (NATS lost its store, someone deleted it), so
  every retained published row is marked unpublished again, in one transaction with the new
  identity (several replicas: one of them does it), and ``run`` publishes them again in
  their order, same event ids; consumers' inboxes drop what they had applied. While the
  stream is missing (made only by the scheduler's bus) nothing is published. A service that
  first sees a stream records it and re-publishes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from nats.errors import BadHeaderError, BadSubjectError, MaxPayloadError
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from trainyard_platform.shared import db, outages
from trainyard_platform.shared.bus import (
    MSG_ID_HEADER,
    Bus,
    StreamMissingError,
    infrastructure_fault,
)
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.logs import error_text
from trainyard_platform.shared.settings import NatsSettings
from trainyard_platform.shared.telemetry import inject

log = logging.getLogger(__name__)
DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""NATS's default ``max_payload``; used when neither the server nor the settings name one."""
_PERMANENT_MARKERS = (
    "maximum payload",
    "max payload",
    "permissions violation",
    "message size exceeds maximum",
)
_PERMANENT_JS_ERRORS = frozenset({10054})  # JSStreamMessageExceedsMaximumErr
_STREAM_MISSING_RETRY_S = 2.0

_CLAIM_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtext('trainyard.outbox.claim:' || current_schema()))"
)
# Claims are taken one relay at a time (the lock ends with the claim's short transaction),
# so each sees the claims made before its own.
_CLAIM = """
WITH head AS (
    SELECT seq, claimed_by IS DISTINCT FROM $2 AND claimed_until > now() AS claimed_by_another
    FROM outbox
    WHERE published_at IS NULL AND parked_at IS NULL
    ORDER BY seq
    LIMIT $1
), free AS (
    SELECT seq FROM head
    WHERE seq < coalesce((SELECT min(seq) FROM head WHERE claimed_by_another),
                         9223372036854775807)
)
UPDATE outbox AS o
SET claimed_by = $2, claimed_until = now() + make_interval(secs => $3)
FROM free
WHERE o.seq = free.seq AND o.published_at IS NULL AND o.parked_at IS NULL
RETURNING o.seq, o.event_id, o.subject, o.body, o.headers
"""
# Only the rows before the first one another relay holds: taking the rows after it would
# publish them before it. A claim that ran out is no one's. A row published or parked
# meanwhile (by a relay whose claim had run out) is checked again by the update and left.
_MARK = """
UPDATE outbox AS o
SET published_at = CASE WHEN r.published THEN now() ELSE o.published_at END,
    parked_at = CASE WHEN r.reason IS NULL THEN o.parked_at ELSE now() END,
    parked_reason = coalesce(r.reason, o.parked_reason),
    claimed_by = NULL,
    claimed_until = NULL
FROM unnest($1::bigint[], $2::boolean[], $3::text[]) AS r(seq, published, reason)
WHERE o.seq = r.seq AND (r.published OR r.reason IS NOT NULL OR o.claimed_by = $4)
"""
# One statement: the round's rows published, parked, or given back (a row left by a failure
# is free for the next round, this relay's or another's; one another relay claimed after
# this one's claim ran out stays its).
_UNCLAIM = """
UPDATE outbox SET claimed_by = NULL, claimed_until = NULL
WHERE seq = ANY($1::bigint[]) AND claimed_by = $2
"""


Traced = tuple[Envelope[Payload], dict[str, str]]
"""An event and the trace context (W3C headers) it is to be published in."""


def traced(envelope: Envelope[Payload]) -> Traced:
    """``envelope`` with the trace context current now."""
    return envelope, inject()


async def enqueue(conn: asyncpg.Connection, *envelopes: Envelope[Payload]) -> None:
    """Record ``envelopes`` for publication, in this order, in the current trace context,
    when the surrounding transaction commits."""
    context = inject()
    await enqueue_traced(conn, [(e, context) for e in envelopes])


async def enqueue_traced(conn: asyncpg.Connection, events: Sequence[Traced]) -> None:
    """Record ``events`` for publication, in this order, each in its own trace context, when
    the surrounding transaction commits."""
    if not events:
        return
    await conn.execute(
        "INSERT INTO outbox (event_id, subject, body, headers) "
        "SELECT e.id, e.subject, e.body, e.headers "
        "FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[]) "
        "     WITH ORDINALITY AS e(id, subject, body, headers, n) ORDER BY e.n "
        "ON CONFLICT (event_id) DO NOTHING",
        [e.id for e, _ in events],
        [e.nats_subject for e, _ in events],
        [e.to_json() for e, _ in events],
        [headers for _, headers in events],
    )
    _enqueued_on.add(conn.get_server_pid())


def enqueued_by(conn: asyncpg.Connection) -> None:
    """Note that ``conn`` wrote outbox rows with SQL of its own (one statement that makes the
    change and stores its events, a data-modifying CTE): the relays are woken when it goes
    back to its pool, as after ``enqueue``."""
    _enqueued_on.add(conn.get_server_pid())


_relays: weakref.WeakSet[OutboxRelay] = weakref.WeakSet()
"""The relays running in this process."""
_enqueued_on: set[int] = set()
"""Connections (by server process id, the same through a pool's proxy) that enqueued since
they were last returned to their pool."""


def _wake_relays_after_commit(conn: asyncpg.Connection) -> None:
    if conn.get_server_pid() not in _enqueued_on:
        return
    _enqueued_on.discard(conn.get_server_pid())
    for relay in _relays:
        relay.wake()


db.on_release(_wake_relays_after_commit)


class OutboxRelay:
    """Moves committed outbox rows to NATS; parks the rows the bus will never take."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        bus: Bus,
        batch: int = 100,
        idle_poll_s: float = 1.0,
        max_payload: int | None = None,
        max_backoff_s: float = 30.0,
        stream_check_s: float = 1.0,
        busy_round_s: float = 0.01,
        claim_s: float | None = None,
    ):
        self._pool = pool
        self._bus = bus
        self._batch = batch
        self._idle_poll_s = idle_poll_s
        self._max_payload = max_payload
        self._max_backoff_s = max(max_backoff_s, idle_poll_s)
        self._stream_check_s = stream_check_s
        self._busy_round_s = busy_round_s
        self._claim_s = claim_s
        self._claimant = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._stream_checked: tuple[float, int] | None = None  # (monotonic time, reconnects)
        self._wake = asyncio.Event()

    @property
    def claim_s(self) -> float:
        """How long this relay's claim on a round's rows lasts (``default_claim_s``)."""
        if self._claim_s is None:
            self._claim_s = default_claim_s(self._bus.settings)
        return self._claim_s

    @property
    def busy_round_s(self) -> float:
        """After a round that published, the next starts no sooner than this after it began."""
        return self._busy_round_s

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set, then flush what is committed and return. Never raises
        for a row or an outage: failures are logged and retried with a growing pause."""
        _relays.add(self)
        try:
            await self._report_parked()
            failures = 0
            loop = asyncio.get_running_loop()
            sent = 0
            round_started = loop.time()
            while not stop.is_set():
                gather = round_started + self._busy_round_s - loop.time()
                if 0 < sent < self._batch and gather > 0:  # busy, no backlog: commits gather
                    await self._sleep(stop, gather, False)
                    if stop.is_set():
                        break
                round_started = loop.time()
                # Cleared before reading, so a commit that lands during the read still wakes us.
                self._wake.clear()
                try:
                    if self._stream_check_due():
                        await self.check_stream()
                    sent = await self.relay_once()
                    failures = 0
                except Exception as exc:
                    self._stream_checked = None  # look at the stream again before publishing
                    sent = 0
                    failures += 1
                    delay = min(self._idle_poll_s * 2 ** min(failures - 1, 16), self._max_backoff_s)
                    if isinstance(exc, StreamMissingError):  # the scheduler makes it soon
                        delay = min(delay, _STREAM_MISSING_RETRY_S)
                    _log_failure(exc, delay)
                    await self._pause(stop, delay)
                    continue
                if sent == 0:
                    await self._sleep(stop, self._idle_poll_s)
            await self._flush()
        finally:
            _relays.discard(self)

    def _stream_check_due(self) -> bool:
        last = self._stream_checked
        if last is None:
            return True
        checked_at, reconnects = last
        return (
            reconnects != _reconnects(self._bus)
            or asyncio.get_running_loop().time() - checked_at >= self._stream_check_s
        )

    async def check_stream(self) -> int:
        """Compare the event stream's identity with the one this outbox published to; if the
        stream was made again (lost), mark every retained published row unpublished, so the
        relay publishes them again in order. Returns how many rows that marked. Raises
        ``StreamMissingError`` while the stream does not exist (nothing may be published)."""
        reconnects = _reconnects(self._bus)
        stream = self._bus.settings.stream
        created = await self._bus.stream_created()
        if created is None:
            raise StreamMissingError(f"stream {stream} does not exist (made by the scheduler)")
        async with self._pool.acquire() as conn:
            seen = await conn.fetchval(
                "SELECT created FROM outbox_stream WHERE stream = $1", stream
            )
        if seen == created:  # the usual answer, read without a lock or a write
            self._stream_checked = (asyncio.get_running_loop().time(), reconnects)
            return 0
        async with self._pool.acquire() as conn, conn.transaction():
            known = await conn.fetchval(
                "SELECT created FROM outbox_stream WHERE stream = $1 FOR UPDATE", stream
            )
            if known is None:
                await conn.execute(
                    "INSERT INTO outbox_stream (stream, created) VALUES ($1, $2) "
                    "ON CONFLICT (stream) DO NOTHING",
                    stream,
                    created,
                )
                marked = 0
            elif known == created:
                marked = 0
            else:
                status = await conn.execute(
                    "UPDATE outbox SET published_at = NULL WHERE published_at IS NOT NULL"
                )
                marked = int(status.split()[-1])  # "UPDATE n"
                await conn.execute(
                    "UPDATE outbox_stream SET created = $2, changed_at = now(), "
                    "replays = replays + 1 WHERE stream = $1",
                    stream,
                    created,
                )
                log.warning(
                    "outbox: the event stream %s was lost and made again (created %s; this "
                    "outbox had published to the one created %s): publishing its %d retained "
                    "events again, in order",
                    stream,
                    created.isoformat(),
                    known.isoformat(),
                    marked,
                )
        self._stream_checked = (asyncio.get_running_loop().time(), reconnects)
        return marked

    async def _flush(self) -> None:
        try:
            while await self.relay_once():
                pass
        except Exception as exc:  # stopping anyway: what is left goes out after the restart
            log.warning("outbox relay: final flush stopped: %s", error_text(exc))

    async def relay_once(self) -> int:
        """Publish up to one batch of committed, unpublished events; return how many rows it
        dealt with (published or parked). Raises on a transient failure before any row was
        dealt with (after it, the rows dealt with are kept and the next call raises). No
        connection is held while it publishes: the rows are claimed first, and marked after."""
        rows = await self._claim()
        if not rows:
            return 0
        try:
            limit = self.max_payload()
            parked: dict[int, str] = {}
            sendable: list[_Message] = []
            for row in rows:
                message = _Message.of(row)
                size = message.size(self._bus)
                if size > limit:
                    parked[message.seq] = f"{size} bytes, more than the bus accepts ({limit} bytes)"
                else:
                    sendable.append(message)
            published, error = await self._publish(sendable, parked)
        except BaseException:  # cancelled, or the process exits: another relay may go on
            await self._unclaim(rows)
            raise
        await self._pool.execute(
            _MARK,
            [r["seq"] for r in rows],
            [r["seq"] in published for r in rows],
            [parked.get(r["seq"]) for r in rows],
            self._claimant,
        )
        if parked:
            total = await parked_count(self._pool)
            for message in (_Message.of(r) for r in rows if r["seq"] in parked):
                log.error(
                    "outbox: parked event %s (%s, %d bytes), it can never be published: %s "
                    "(%d parked rows in all; see outbox.parked_reason)",
                    message.event_id,
                    message.subject,
                    message.size(self._bus),
                    parked[message.seq],
                    total,
                )
        handled = len(published) + len(parked)
        if error is not None and handled == 0:
            raise error
        return handled

    async def _claim(self) -> list[asyncpg.Record]:
        """Claim the next batch for this relay, in order, and return its rows (by ``seq``)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_CLAIM_LOCK)
            rows = await conn.fetch(_CLAIM, self._batch, self._claimant, self.claim_s)
        return sorted(rows, key=lambda r: int(r["seq"]))

    async def _unclaim(self, rows: Sequence[asyncpg.Record]) -> None:
        try:
            await self._pool.execute(_UNCLAIM, [r["seq"] for r in rows], self._claimant)
        except db.DATABASE_FAULTS as exc:  # they are free when the claim runs out
            log.warning(
                "outbox relay: could not give back its claim (free within %.0f s): %s",
                self.claim_s,
                error_text(exc),
            )

    def max_payload(self) -> int:
        """The largest message (body and headers) the bus accepts: the server's limit, or the
        configured one if smaller."""
        server = self._bus.nats.max_payload
        limits = [n for n in (self._max_payload, server) if n is not None and n > 0]
        return min(limits) if limits else DEFAULT_MAX_PAYLOAD

    async def _publish(
        self, messages: Sequence[_Message], parked: dict[int, str]
    ) -> tuple[list[int], Exception | None]:
        """Publish ``messages``; return the seqs published and the transient failure that
        stopped it, if any. A message the bus refuses for good is added to ``parked``."""
        if not messages:
            return [], None
        try:
            await self._bus.publish_many(m.publishable() for m in messages)
            return [m.seq for m in messages], None
        except Exception as exc:
            if len(messages) == 1:
                return self._one_failed(messages[0], exc, parked)
        # Find the culprit: one at a time, in order (a re-publish of what the failed batch
        # stored is dropped by the server as a duplicate).
        published: list[int] = []
        for message in messages:
            try:
                await self._bus.publish_many([message.publishable()])
            except Exception as exc:
                done, error = self._one_failed(message, exc, parked)
                if error is not None:
                    return published, error
                published += done
            else:
                published.append(message.seq)
        return published, None

    def _one_failed(
        self, message: _Message, exc: Exception, parked: dict[int, str]
    ) -> tuple[list[int], Exception | None]:
        reason = permanent_failure(exc, message.subject, self._bus.nats.last_error)
        if reason is None:
            return [], exc
        parked[message.seq] = reason
        return [], None

    async def _report_parked(self) -> None:
        try:
            total = await parked_count(self._pool)
        except db.DATABASE_FAULTS:
            return
        if total:
            log.warning(
                "outbox: %d parked rows can never be published (see outbox.parked_reason)", total
            )

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        """Wait ``seconds`` after a failure, but no longer than until NATS reconnects."""
        reconnects = _reconnects(self._bus)
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while not stop.is_set() and _reconnects(self._bus) == reconnects:
            left = until - loop.time()
            if left <= 0:
                return
            await self._sleep(stop, min(left, 0.25), wake=False)

    def wake(self) -> None:
        """Look for committed rows now instead of after ``idle_poll_s``."""
        self._wake.set()

    async def _sleep(self, stop: asyncio.Event, seconds: float, wake: bool = True) -> None:
        waiters = {asyncio.ensure_future(stop.wait())}
        if wake:
            waiters.add(asyncio.ensure_future(self._wake.wait()))
        _, pending = await asyncio.wait(
            waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()


async def parked_count(pool: asyncpg.Pool) -> int:
    """How many outbox rows are parked (can never be published)."""
    async with pool.acquire() as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL")
        return count


def default_claim_s(settings: NatsSettings) -> float:
    """How long a relay's claim on the rows of a round lasts: three publish timeouts (a round
    waits at most about two on an outage, the batch's and then its first row's), but at most
    half the duplicate window, so that another relay's publish of rows it takes over when a
    claim ran out still reaches the stream as a duplicate it drops."""
    return min(3 * settings.publish_timeout_seconds, settings.duplicate_window_seconds / 2)


def permanent_failure(
    exc: BaseException, subject: str = "", last_error: BaseException | None = None
) -> str | None:
    """Why publishing failed for good (the same message will never be accepted), or None
    when the failure may pass (NATS down, a timeout: retry)."""
    if isinstance(exc, MaxPayloadError):
        return "maximum payload exceeded"
    if isinstance(exc, BadSubjectError | BadHeaderError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, APIError) and exc.err_code in _PERMANENT_JS_ERRORS:
        return f"refused by JetStream: {exc}"
    text = str(exc).lower()
    if any(marker in text for marker in _PERMANENT_MARKERS):
        return str(exc)[:500]
    # A publish the server refuses for permissions is dropped with an asynchronous -ERR; the
    # publisher only sees its acknowledgement time out.
    if isinstance(exc, TimeoutError) and last_error is not None:
        error = str(last_error)
        # The server names the subject in quotes (``... to "trainyard.x"``): only that one,
        # not every subject it begins with (job ``j1`` is the start of job ``j12``).
        named = f'"{subject.lower()}"' in error.lower()
        if "permissions violation" in error.lower() and (not subject or named):
            return error[:500]
    return None


def _reconnects(bus: Bus) -> int:
    """How often the bus's connection has reconnected (a reconnect may hide a lost stream)."""
    stats = getattr(bus.nats, "stats", None) or {}
    return int(stats.get("reconnects", 0))


def _log_failure(exc: Exception, delay: float) -> None:
    """An outage of PostgreSQL or the object store: told to ``outages`` (one line while it
    lasts); another outage (``bus.infrastructure_fault``) or a refusal of NATS, one line a
    try; anything else, a query PostgreSQL refuses for good among it, with its traceback
    (the rule of ``db.log_failed_round``)."""
    if outages.report(exc):
        return
    if infrastructure_fault(exc) is not None or isinstance(exc, NatsError | StreamMissingError):
        log.warning("outbox relay: %s; retrying in %.1fs", str(exc) or type(exc).__name__, delay)
    else:
        log.error("outbox relay failed; retrying in %.1fs", delay, exc_info=exc)


@dataclass(frozen=True)
class _Message:
    seq: int
    event_id: str
    subject: str
    body: bytes
    headers: dict[str, str]

    @classmethod
    def of(cls, row: asyncpg.Record) -> _Message:
        return cls(
            row["seq"], row["event_id"], row["subject"], row["body"], _headers(row["headers"])
        )

    def size(self, bus: Bus) -> int:
        """Bytes the server counts against its maximum payload: body and header block, with
        the ``Nats-Msg-Id`` ``bus`` publishes it under (``Bus.msg_id``)."""
        headers = {**self.headers, MSG_ID_HEADER: bus.msg_id(self.subject, self.event_id)}
        block = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        return len(self.body) + len(block.encode())

    def publishable(self) -> tuple[str, bytes, str, dict[str, str]]:
        return self.subject, self.body, self.event_id, self.headers


def _headers(stored: str | dict[str, str] | None) -> dict[str, str]:
    if isinstance(stored, str):  # a pool without the jsonb codec
        loaded: dict[str, str] = json.loads(stored)
        return loaded
    return stored or {}
