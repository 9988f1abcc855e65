"""Dead letters: what a consumer gave up on, for operators to list, inspect, redrive or discard.

Contract:
- A consumer's dead letters are the messages of ``deadletter.<consumer>`` in the dead-letter
  stream (``NatsSettings.deadletter_stream``), each the original message's bytes with the
  reason, its origin (subject, stream sequence, ``Nats-Msg-Id``) and its deliveries in headers
  (``shared.bus``). A dead letter is named by its sequence in the dead-letter stream.
- ``DeadLetters(bus, consumer)`` reads and changes only that consumer's dead letters: a
  sequence that belongs to another consumer is "not found".
- ``redrive`` republishes the original bytes and trace headers, with the subject it first
  came on (``ORIGINAL_SUBJECT_HEADER``, by which its consumer judges it again: a forgery
  stays one), to ``trainyard.redrive.<consumer>`` (read by that consumer alone: the event's
  other consumers handled it already) under the id ``redrive:<consumer>:<sequence>`` (its ``Nats-Msg-Id`` is
  the bus's keyed one, ``Bus.msg_id``), then deletes the
  dead letter. The event keeps its id, so the consumer's inbox still applies it at most once;
  redriving the same dead letter twice inside the duplicate window publishes it once. If it
  fails again it comes back as a new dead letter with the new reason. A consumer whose
  filter does not take its redrive subject cannot be redriven to (``CannotRedrive``, 409),
  nor can a dead letter whose body was cut to fit the bus's message size with its headers
  (``TRUNCATED_HEADER``: garbage as large as NATS takes): the dead letter stays.
- ``discard`` deletes the dead letter. Both are idempotent: the second call finds nothing.
- ``deadletter_routes(bus, consumer, audit_pool=pool)`` serves the same to operators over
  HTTP (each route declares ``opt=needs(Role.OPERATOR)`` for the app's guard, and checks the
  principal again), recording redrives and discards in the service's audit log when given its
  pool, else (a service without a database: the runner) in one log line each:

  * ``GET /v1/deadletters?after=<seq>&limit=<n>&reason=<text>``: a page, oldest first;
  * ``GET /v1/deadletters/{seq}``: one, with its headers and body;
  * ``POST /v1/deadletters/{seq}/redrive``: redrive it (200; 404; 409 when the consumer
    does not read redrives);
  * ``DELETE /v1/deadletters/{seq}``: discard it (200, or 404).
"""

from __future__ import annotations

import base64
import logging
from datetime import datetime
from typing import Annotated, Any, Literal

import asyncpg
from litestar import delete, get, post
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, QueryParameter
from nats.js import api
from nats.js.errors import NotFoundError
from pydantic import BaseModel

from trainyard_platform.shared import audit
from trainyard_platform.shared.access import needs
from trainyard_platform.shared.bus import (
    CONSUMER_HEADER,
    DELIVERIES_HEADER,
    ORIGINAL_MSG_ID_HEADER,
    ORIGINAL_SEQUENCE_HEADER,
    ORIGINAL_SUBJECT_HEADER,
    REASON_HEADER,
    REDRIVEN_FROM_HEADER,
    TRUNCATED_HEADER,
    Bus,
    deadletter_subject,
    redrive_subject,
)
from trainyard_platform.shared.events import EventParseError, parse_envelope
from trainyard_platform.shared.http_app import error_responses
from trainyard_platform.shared.http_errors import Conflicting
from trainyard_platform.shared.identity import Principal, Role

log = logging.getLogger(__name__)

MAX_PAGE = 500
"""Most dead letters one page holds."""
MAX_SCAN = 5000
"""Most dead letters one page request reads while filtering by reason."""


class DeadLetter(BaseModel):
    """One dead letter, as listed."""

    sequence: int
    """Its sequence in the dead-letter stream: how it is named."""
    consumer: str
    dead_lettered_at: datetime | None
    reason: str
    original_subject: str
    original_sequence: int | None
    """The message's sequence in the event stream."""
    deliveries: int | None
    event_id: str | None
    """The event's id (``None`` when the bytes are not a valid event)."""
    event_type: str | None
    event_subject: str | None


class DeadLetterDetail(DeadLetter):
    """One dead letter with everything it carries."""

    headers: dict[str, str]
    body: str
    body_encoding: Literal["utf-8", "base64"]


class DeadLetterPage(BaseModel):
    consumer: str
    total: int
    """Dead letters of this consumer now (all pages; before the reason filter)."""
    dead_letters: list[DeadLetter]
    next_after: int | None
    """Pass as ``after`` for the next page; ``None`` when this was the last."""


class Redriven(BaseModel):
    sequence: int
    subject: str
    event_id: str | None
    duplicate: bool
    """True when the server had it already (redriven before, inside the duplicate window)."""


class Discarded(BaseModel):
    sequence: int
    discarded: bool


class CannotRedrive(Exception):
    """The consumer does not read its redrive subject: a redrive would reach no one."""


class DeadLetters:
    """The dead letters of one consumer (see the module docstring)."""

    def __init__(self, bus: Bus, consumer: str) -> None:
        self._bus = bus
        self._js = bus.jetstream
        self._stream = bus.settings.deadletter_stream
        self.consumer = consumer
        self._subject = deadletter_subject(consumer)

    async def count(self) -> int:
        info = await self._js.stream_info(self._stream, subjects_filter=self._subject)
        return int((info.state.subjects or {}).get(self._subject, 0))

    async def page(
        self, after: int = 0, limit: int = 100, reason: str | None = None
    ) -> DeadLetterPage:
        """Up to ``limit`` dead letters with a sequence above ``after``, oldest first; with
        ``reason``, only those whose reason contains it (case-insensitive)."""
        limit = max(1, min(limit, MAX_PAGE))
        found: list[DeadLetter] = []
        seq, scanned, last = after, 0, None
        while len(found) < limit and scanned < MAX_SCAN:
            raw = await self._next(seq + 1)
            if raw is None:
                last = None
                break
            seq = last = int(raw.seq or 0)
            scanned += 1
            letter = _letter(raw)
            if reason is None or reason.lower() in letter.reason.lower():
                found.append(letter)
        else:
            last = seq if await self._next(seq + 1) is not None else None
        return DeadLetterPage(
            consumer=self.consumer, total=await self.count(), dead_letters=found, next_after=last
        )

    async def get(self, sequence: int) -> DeadLetterDetail | None:
        raw = await self._raw(sequence)
        if raw is None:
            return None
        data = raw.data or b""
        try:
            body, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(data).decode("ascii"), "base64"
        return DeadLetterDetail(
            **_letter(raw).model_dump(),
            headers=dict(raw.headers or {}),
            body=body,
            body_encoding=encoding,
        )

    async def reads_redrives(self) -> bool:
        """Whether the consumer's filter takes its redrive subject."""
        try:
            info = await self._js.consumer_info(self._bus.settings.stream, self.consumer)
        except NotFoundError:
            return False
        config = info.config
        filters = config.filter_subjects or (
            [config.filter_subject] if config.filter_subject else []
        )
        target = redrive_subject(self.consumer)
        return not filters or any(_matches(f, target) for f in filters)

    async def redrive(self, sequence: int) -> Redriven | None:
        """Republish the dead letter for its consumer and delete it; None if there is none.
        Raises ``CannotRedrive`` (and keeps the dead letter) when the consumer would not
        read it."""
        raw = await self._raw(sequence)
        if raw is None:
            return None
        truncated = (raw.headers or {}).get(TRUNCATED_HEADER)
        if truncated is not None:
            raise CannotRedrive(
                f"its body was cut to fit the bus's message size (from {truncated} bytes): it "
                "is not the message any more; the dead letter stays"
            )
        if not await self.reads_redrives():
            raise CannotRedrive(
                f"consumer {self.consumer} does not read {redrive_subject(self.consumer)}; "
                "the dead letter stays"
            )
        headers = {
            k: v
            for k, v in (raw.headers or {}).items()
            if not k.startswith(("Nats-", "Trainyard-"))
        }
        original = raw.headers or {}
        headers[ORIGINAL_SUBJECT_HEADER] = original.get(ORIGINAL_SUBJECT_HEADER, "")
        headers[REDRIVEN_FROM_HEADER] = str(sequence)
        subject = redrive_subject(self.consumer)
        ack = await self._bus.publish_raw(
            subject, raw.data or b"", f"redrive:{self.consumer}:{sequence}", headers
        )
        await self._delete(sequence)
        return Redriven(
            sequence=sequence,
            subject=subject,
            event_id=_letter(raw).event_id,
            duplicate=bool(ack.duplicate),
        )

    async def discard(self, sequence: int) -> bool:
        """Delete the dead letter; False if there is none."""
        if await self._raw(sequence) is None:
            return False
        return await self._delete(sequence)

    async def _delete(self, sequence: int) -> bool:
        try:
            return bool(await self._js.delete_msg(self._stream, sequence))
        except NotFoundError:
            return False  # deleted meanwhile (a concurrent redrive or discard)

    async def _raw(self, sequence: int) -> api.RawStreamMsg | None:
        if sequence < 1:
            return None
        try:
            raw = await self._js.get_msg(self._stream, seq=sequence)
        except NotFoundError:
            return None
        return raw if raw.subject == self._subject else None

    async def _next(self, sequence: int) -> api.RawStreamMsg | None:
        """This consumer's first dead letter at ``sequence`` or after it."""
        try:
            return await self._js.get_msg(
                self._stream, seq=sequence, subject=self._subject, next=True
            )
        except NotFoundError:
            return None


def _letter(raw: api.RawStreamMsg) -> DeadLetter:
    headers: dict[str, Any] = raw.headers or {}
    event_id = event_type = event_subject = None
    try:
        envelope = parse_envelope(raw.data or b"")
        event_id, event_type, event_subject = envelope.id, envelope.type, envelope.subject
    except (EventParseError, ValueError):
        pass
    return DeadLetter(
        sequence=int(raw.seq or 0),
        consumer=str(headers.get(CONSUMER_HEADER) or (raw.subject or "").partition(".")[2]),
        dead_lettered_at=raw.time,
        reason=str(headers.get(REASON_HEADER, "")),
        original_subject=str(headers.get(ORIGINAL_SUBJECT_HEADER, "")),
        original_sequence=_int(headers.get(ORIGINAL_SEQUENCE_HEADER)),
        deliveries=_int(headers.get(DELIVERIES_HEADER)),
        event_id=event_id or headers.get(ORIGINAL_MSG_ID_HEADER),
        event_type=event_type,
        event_subject=event_subject,
    )


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def deadletter_routes(
    bus: Bus, consumer: str, audit_pool: asyncpg.Pool | None = None
) -> list[HTTPRouteHandler]:
    """The operator routes over ``consumer``'s dead letters (see the module docstring), for
    a service's ``service_app`` route list; redrives and discards go to the audit log of
    ``audit_pool`` when given (services without a database: one line of the service log)."""
    letters = DeadLetters(bus, consumer)

    async def record(principal: Principal, action: str, sequence: int, detail: Any) -> None:
        target = f"deadletter/{consumer}/{sequence}"
        if audit_pool is None:
            # No audit log to hold it (a service without a database: the runner), so an
            # operator's change is at least in the service's log.
            log.info("%s %s by %s: event %s", action, target, principal.actor, detail["event_id"])
            return
        async with audit_pool.acquire() as conn:
            await audit.record(conn, principal, action, target, detail)

    @get("/v1/deadletters", opt=needs(Role.OPERATOR))
    async def list_dead_letters(
        principal: NamedDependency[Principal],
        after: Annotated[
            int,
            QueryParameter(ge=0, le=2**63 - 1, description="dead letters after this sequence"),
        ] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 100,
        reason: Annotated[
            str | None,
            QueryParameter(max_length=200, description="only reasons containing this text"),
        ] = None,
    ) -> DeadLetterPage:
        principal.require(Role.OPERATOR, "reading dead letters")
        return await letters.page(after, limit, reason)

    @get(
        "/v1/deadletters/{sequence:int}",
        opt=needs(Role.OPERATOR),
        responses=error_responses(404),
    )
    async def get_dead_letter(
        principal: NamedDependency[Principal], sequence: FromPath[int]
    ) -> DeadLetterDetail:
        principal.require(Role.OPERATOR, "reading dead letters")
        found = await letters.get(sequence)
        if found is None:
            raise NotFoundException(f"no dead letter {sequence} of {consumer}")
        return found

    @post(
        "/v1/deadletters/{sequence:int}/redrive",
        status_code=200,
        opt=needs(Role.OPERATOR),
        responses=error_responses(404, 409),
    )
    async def redrive_dead_letter(
        principal: NamedDependency[Principal], sequence: FromPath[int]
    ) -> Redriven:
        principal.require(Role.OPERATOR, "redriving dead letters")
        found = await letters.get(sequence)
        if found is None:
            raise NotFoundException(f"no dead letter {sequence} of {consumer}")
        if not await letters.reads_redrives():
            raise Conflicting(
                f"consumer {consumer} does not read {redrive_subject(consumer)}; "
                "the dead letter stays",
                field="sequence",
                message=f"cannot be redriven: consumer {consumer} does not read "
                f"{redrive_subject(consumer)}",
            )
        await record(
            principal,
            "deadletter.redrive",
            sequence,
            {"event_id": found.event_id, "reason": found.reason},
        )
        try:
            redriven = await letters.redrive(sequence)
        except CannotRedrive as exc:
            raise Conflicting(
                str(exc), field="sequence", message=f"cannot be redriven: {exc}"
            ) from None
        if redriven is None:
            raise NotFoundException(f"no dead letter {sequence} of {consumer}")
        return redriven

    @delete(
        "/v1/deadletters/{sequence:int}",
        status_code=200,
        opt=needs(Role.OPERATOR),
        responses=error_responses(404),
    )
    async def discard_dead_letter(
        principal: NamedDependency[Principal], sequence: FromPath[int]
    ) -> Discarded:
        principal.require(Role.OPERATOR, "discarding dead letters")
        found = await letters.get(sequence)
        if found is None:
            raise NotFoundException(f"no dead letter {sequence} of {consumer}")
        await record(
            principal,
            "deadletter.discard",
            sequence,
            {"event_id": found.event_id, "reason": found.reason},
        )
        if not await letters.discard(sequence):
            raise NotFoundException(f"no dead letter {sequence} of {consumer}")
        return Discarded(sequence=sequence, discarded=True)

    return [list_dead_letters, get_dead_letter, redrive_dead_letter, discard_dead_letter]
