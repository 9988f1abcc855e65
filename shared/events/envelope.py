"""The CloudEvents 1.0 envelope (structured JSON mode) that carries every Trainyard event.

Contract:
- ``id`` is unique per event within its source (a UUID, or a deterministic id for an event
  said again); consumers record it with its sender to stay idempotent. The bus publishes
  it under a ``Nats-Msg-Id`` of its own keyed from it (``shared.bus.Bus.msg_id``), so
  JetStream drops a re-publish and no other publisher can have it dropped.
- ``type`` names the payload model and its version (``trainyard.job.submitted.v1``).
- ``subject`` is the routing key (a job id or a node id); the NATS subject is
  ``<type>.<subject>`` so consumers can filter per node or per job (a runner's report on
  its allocation: ``<type>.<subject>.<node>``, ``nats_subject``).
- ``data`` is validated against the payload model registered for ``type``.
- ``dataschema`` is the URI of the JSON Schema of ``data`` (``schema_uri``): the base
  ``TRAINYARD_EVENTS_SCHEMA_BASE`` (default ``https://trainyard.dev/schemas/events``) and
  ``/<type>.json``; the same files are committed in docs/events/. Events written before the
  attribute existed parse without it.
"""

from __future__ import annotations

import functools
import uuid
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard_platform.shared.events.payloads import EVENT_TYPES, Payload
from trainyard_platform.shared.events.trust import nats_subject_for, speaker_of

P = TypeVar("P", bound=Payload)

DEFAULT_SCHEMA_BASE = "https://trainyard.dev/schemas/events"


class EventSchemaSettings(BaseSettings):
    """Where the published JSON Schemas of event payloads live (``dataschema``)."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_EVENTS_")

    schema_base: str = Field(default=DEFAULT_SCHEMA_BASE, pattern=r"^[a-z][a-z0-9+.-]*:\S+[^/]$")
    """An absolute URI without a trailing slash; a deployment that serves the files of
    docs/events/ elsewhere points this at them."""


@functools.cache
def _schema_base() -> str:
    # Read once per process: every event of a process names the same place.
    return EventSchemaSettings().schema_base


def schema_uri(event_type: str, base: str | None = None) -> str:
    """The ``dataschema`` of events of ``event_type``: ``<base>/<type>.json``."""
    return f"{base or _schema_base()}/{event_type}.json"


class EventParseError(ValueError):
    """Raised when bytes on the wire are not a valid Trainyard event; carries the reason."""


class Envelope(BaseModel, Generic[P]):
    """A CloudEvents 1.0 structured-mode event whose ``data`` is a typed payload."""

    # NaN and infinity travel as the strings "NaN", "Infinity" and "-Infinity": bare NaN is
    # not JSON (Node's JSON.parse and most other parsers reject it), and null would lose a
    # diverging loss, a fact to report. Every payload model sets the same (payloads.Payload).
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    source: str
    type: str
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))
    subject: str
    datacontenttype: Literal["application/json"] = "application/json"
    dataschema: str | None = None
    """The URI of the JSON Schema ``data`` follows (``schema_uri``); set by ``wrap``."""
    data: P

    @classmethod
    def wrap(
        cls, payload: P, *, source: str, subject: str, event_id: str | None = None
    ) -> Envelope[P]:
        """Build an envelope for ``payload``; ``event_id`` makes the event deterministic."""
        fields: dict[str, Any] = {
            "source": source,
            "type": payload.event_type(),
            "dataschema": schema_uri(payload.event_type()),
            "subject": subject,
            "data": payload,
        }
        if event_id is not None:
            fields["id"] = event_id
        return cast("type[Envelope[P]]", envelope_model(type(payload)))(**fields)

    @property
    def nats_subject(self) -> str:
        """The NATS subject this event is published on: ``<type>.<subject>``, but
        ``<type>.by-<service>`` for one said on its owner's behalf, ``<type>.<subject>.<node>``
        for a runner's report on its node's allocation (``trust.nats_subject_for``)."""
        return nats_subject_for(self.type, self.source, self.subject, speaker_of(self.data))

    def to_json(self) -> bytes:
        """Serialise to CloudEvents structured JSON (an event without ``dataschema``, one
        written before the attribute existed, leaves it out rather than writing null)."""
        exclude = {"dataschema"} if self.dataschema is None else None
        return self.model_dump_json(exclude=exclude).encode()


@functools.cache
def envelope_model(payload_type: type[Payload]) -> type[Envelope[Payload]]:
    """The envelope class for one payload type, made once (parametrising a generic model is
    costly, and events are wrapped and parsed on every hot path)."""
    return Envelope[payload_type]  # type: ignore[valid-type]


def parse_envelope(raw: bytes) -> Envelope[Payload]:
    """Parse wire bytes into an envelope with its typed payload.

    Raises EventParseError naming the field and the reason when the bytes are not
    JSON, not a CloudEvent, of an unknown type, or carry an invalid payload.
    """
    try:
        head = _Head.model_validate_json(raw)
    except ValidationError as exc:
        raise EventParseError(_describe(exc)) from exc
    payload_model = EVENT_TYPES.get(head.type)
    if payload_model is None:
        raise EventParseError(f"type: unknown event type {head.type!r}")
    try:
        return envelope_model(payload_model).model_validate_json(raw)
    except ValidationError as exc:
        raise EventParseError(_describe(exc)) from exc


class _Head(BaseModel):
    """The envelope's attributes without the payload: enough to find the payload model."""

    specversion: Literal["1.0"]
    id: str
    type: str
    subject: str


def _describe(exc: ValidationError) -> str:
    """Why an event is refused, as the API says a bad field (``http_errors.field_errors``):
    each field by its path (``data.spec.args[1]``; ``event``: the event as a whole) and
    what is wrong in plain words, ``; `` between them."""
    # Imported here: http_errors stands on the bus, which stands on this module.
    from trainyard_platform.shared.http_errors import field_errors

    return "; ".join(
        f"{'event' if e.field == 'body' else e.field}: {e.message}" for e in field_errors(exc)
    )
