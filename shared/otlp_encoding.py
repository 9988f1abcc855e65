"""Finished spans as the bytes of an OTLP ``ExportTraceServiceRequest``, written directly.

Contract: ``encode_request(spans)`` returns bytes that parse to a request equal, field for
field, to what the OTLP exporter's own encoder (``encode_spans(spans)``) serializes: spans
grouped by resource, then by instrumentation scope, in the order each first appears; the
same attributes (strings, booleans, integers, floats, bytes, sequences and mappings of them;
None as an empty value), events, links, status, flags and dropped counts. A value of
another type is left out with its key, as the exporter's encoder leaves it out.

Why: the exporter's encoder builds a protobuf object for every span, attribute and value and
hashes the resource (a JSON dump of its attributes) once per span; in a busy service that is
about as much CPU as making the span. Here each resource and scope is encoded once per
request, attribute keys once per process (and the last 256 long database statements, the
only long string attributes kept), and a span is a join of byte strings.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

# Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
_KINDS = {
    SpanKind.INTERNAL: b"\x30\x01",  # field 6 (kind), varint
    SpanKind.SERVER: b"\x30\x02",
    SpanKind.CLIENT: b"\x30\x03",
    SpanKind.PRODUCER: b"\x30\x04",
    SpanKind.CONSUMER: b"\x30\x05",
}
# Field 16 (flags, fixed32): SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, plus IS_REMOTE.
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)
_LINK_FLAGS_LOCAL = b"\x35" + struct.pack("<I", 0x100)  # Link field 6
_LINK_FLAGS_REMOTE = b"\x35" + struct.pack("<I", 0x300)
_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans`` (see the module)."""
    # Grouped by equal resources, as the exporter's encoder groups them, but looked up by
    # identity (a provider's spans share one resource object, whose hash is a JSON dump).
    groups: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    by_identity: dict[int, dict[InstrumentationScope | None, list[bytes]]] = {}
    for span in spans:
        resource = span.resource
        scopes = by_identity.get(id(resource))
        if scopes is None:
            scopes = by_identity[id(resource)] = groups.setdefault(resource, {})
        scopes.setdefault(span.instrumentation_scope or None, []).append(_span(span))
    out = []
    for resource, scopes in groups.items():
        body = [_len(1, _attributes(1, resource.attributes))]
        for scope, encoded in scopes.items():
            scope_body = [_len(1, _scope(scope)), *(_len(2, s) for s in encoded)]
            if scope is not None and scope.schema_url:
                scope_body.append(_string(3, scope.schema_url))
            body.append(_len(2, b"".join(scope_body)))
        if resource.schema_url:
            body.append(_string(3, resource.schema_url))
        out.append(_len(1, b"".join(body)))
    return b"".join(out)


def _span(span: ReadableSpan) -> bytes:
    context = span.get_span_context()
    assert context is not None  # a finished SDK span always has one
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        parts.append(_string(3, ",".join(f"{k}={v}" for k, v in context.trace_state.items())))
    parent = span.parent
    if parent:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_string(5, span.name))
    parts.append(_KINDS[span.kind])
    if span.start_time:
        parts.append(b"\x39" + _FIXED64.pack(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _FIXED64.pack(span.end_time))
    # The span's own BoundedAttributes, event and link lists where it has them (``span.
    # attributes`` wraps the first in a new read-only proxy at each call, ``span.events``
    # and ``span.links`` copy the others under their lock; a finished span's no longer
    # change).
    attributes = getattr(span, "_attributes", None)
    if type(attributes) is BoundedAttributes:
        dropped = attributes.dropped
    else:
        if attributes is None or not isinstance(attributes, Mapping):
            attributes = span.attributes
        dropped = span.dropped_attributes
    if attributes:
        parts.append(_attributes(9, attributes))
    if dropped:
        parts.append(_varint_field(10, dropped))
    events, dropped_events = _list(span, "_events", "events")
    for event in events:
        event_parts = [b"\x09" + _FIXED64.pack(event.timestamp)] if event.timestamp else []
        if event.name:
            event_parts.append(_string(2, event.name))
        if event.attributes:
            event_parts.append(_attributes(3, event.attributes))
        if event.dropped_attributes:
            event_parts.append(_varint_field(4, event.dropped_attributes))
        parts.append(_len(11, b"".join(event_parts)))
    if dropped_events:
        parts.append(_varint_field(12, dropped_events))
    links, dropped_links = _list(span, "_links", "links")
    for link in links:
        parts.append(_len(13, _link(link.context, link.attributes, link.dropped_attributes)))
    if dropped_links:
        parts.append(_varint_field(14, dropped_links))
    status = span.status
    if status.description or status.status_code.value:
        status_parts = []
        if status.description:
            status_parts.append(_string(2, status.description))
        if status.status_code.value:
            status_parts.append(_varint_field(3, status.status_code.value))
        parts.append(_len(15, b"".join(status_parts)))
    else:
        parts.append(_STATUS_UNSET)
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


def _list(span: ReadableSpan, field: str, public: str) -> tuple[Sequence[Any], int]:
    """A span's events or links and how many were dropped: the SDK's ``BoundedList``'s own
    deque where the span holds one, else the public property's copy."""
    held = getattr(span, field, None)
    if type(held) is BoundedList:
        kept: Sequence[Any] = held._dq  # type: ignore[attr-defined]
        return kept, held.dropped
    if type(held) is tuple or type(held) is list:
        return held, 0
    return getattr(span, public), getattr(span, f"dropped_{public}")


def _link(context: SpanContext, attributes: Mapping[str, Any] | None, dropped: int) -> bytes:
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if attributes:
        parts.append(_attributes(4, attributes))
    if dropped:
        parts.append(_varint_field(5, dropped))
    parts.append(_LINK_FLAGS_REMOTE if context.is_remote else _LINK_FLAGS_LOCAL)
    return b"".join(parts)


@lru_cache(maxsize=64)
def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    parts = [_string(1, scope.name)] if scope.name else []
    if scope.version:
        parts.append(_string(2, scope.version))
    if scope.attributes:
        parts.append(_attributes(3, scope.attributes))
    return b"".join(parts)


def _attributes(field: int, attributes: Mapping[str, Any]) -> bytes:
    """Each attribute as a ``KeyValue`` in repeated field ``field``."""
    tag = _TAGS[field]
    out = []
    for key, value in _items(attributes):
        if type(value) is str:  # the usual case, inlined: KeyValue{key, AnyValue{string}}
            if len(value) < 0x7E:
                text = value.encode("utf-8")
                size = len(text)
                if size < 0x7E:  # the AnyValue (size + 2) and the value fit one-byte lengths
                    body = _key(key) + b"\x12" + bytes((size + 2, 0x0A, size)) + text
                else:
                    body = _key(key) + _len(2, _len(1, text))
            elif key in _STATEMENT_KEYS:
                body = _long_text(key, value)
            else:  # any other text may be a caller's (a path, a message): not kept
                body = _key(key) + _len(2, _len(1, value.encode("utf-8")))
        else:
            try:
                body = _key(key) + _len(2, _value(value))
            except TypeError:
                continue  # the exporter's encoder, too, leaves out a value it cannot encode
        size = len(body)
        out.append(tag + (bytes((size,)) if size < 0x80 else _varint(size)) + body)
    return b"".join(out)


def _items(attributes: Mapping[str, Any]) -> Any:
    """``attributes.items()``, from the SDK's ``BoundedAttributes``' own dict when it is one
    (its ``Mapping`` methods go through ``__getitem__`` once per key, about a third of
    encoding a span's attributes)."""
    inner = getattr(attributes, "_dict", None)
    return inner.items() if type(inner) is dict else attributes.items()


@lru_cache(maxsize=1024)
def _key(key: str) -> bytes:
    return _string(1, key)


_STATEMENT_KEYS = frozenset({"db.statement", "db.query.text"})
"""The attributes whose long strings are kept encoded: a database span's statement (either
semantic conventions' key), written in the code, so few and the same string every time."""


@lru_cache(maxsize=256)
def _long_text(key: str, value: str) -> bytes:
    """A ``KeyValue``'s body for a long statement: kept, as the same statements come back
    (described once per text, the same string every time). Only statements: a long text of
    another attribute can be a caller's (``url.path``, an exception's message), which the
    process would keep after its export, and a stream of them would push the statements
    out."""
    return _key(key) + _len(2, _len(1, value.encode("utf-8")))


def _value(value: Any) -> bytes:
    """An ``AnyValue``'s body; TypeError for a type OTLP has no value for."""
    if value is None:
        return b""
    if isinstance(value, str):
        return _string(1, value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _len(7, value)
    if isinstance(value, Sequence):
        return _len(5, b"".join(_len(1, _value(v)) for v in value))
    if isinstance(value, Mapping):
        return _len(6, _attributes(1, {str(k): v for k, v in value.items()}))
    raise TypeError(f"no OTLP value for a {type(value).__name__}")


def _string(field: int, text: str) -> bytes:
    return _len(field, text.encode("utf-8"))


def _len(field: int, body: bytes) -> bytes:
    size = len(body)
    tag = _TAGS[field]
    return tag + (bytes((size,)) if size < 0x80 else _varint(size)) + body


def _varint_field(field: int, number: int) -> bytes:
    return _varint(field << 3) + _varint(number)


def _varint(number: int) -> bytes:
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


_TAGS = {field: _varint(field << 3 | 2) for field in range(1, 17)}
_STATUS_UNSET = _len(15, b"")
