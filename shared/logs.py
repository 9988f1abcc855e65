"""One logging set-up for every service process: JSON lines with trace ids, or plain text.

Contract:
- ``configure_logging(service, level, log_format)`` replaces the root handlers with one
  stderr handler. ``TRAINYARD_LOG_FORMAT=json`` (``ServiceSettings.log_format``; what
  deploy/ sets) writes one JSON object per line:
  ``time`` (UTC, ISO 8601), ``level``, ``service``, ``logger``, ``message``, ``trace_id`` and
  ``span_id`` of the span current when the record was made (absent outside a span),
  ``job_id`` when known, and ``exception`` (the formatted traceback) when there is one.
  ``text`` (the default, for a developer's terminal) writes the same facts on one line:
  line breaks and other control characters in the message (a job names its metrics, and
  the runner's warnings quote them) are written escaped (``\\n``, ``\\x1b``), so no text of
  a tenant can start a line that looks like the platform's own; only a traceback follows on
  lines of its own.
- The job id is taken from the record's ``job_id`` attribute (``log.info(..., extra={"job_id":
  ...})``), else from the innermost job scope (``job_scope(job_id)``: a context variable, so
  it holds in the block and in every task and thread started from it, whatever the sampler:
  the bus opens one for the event a consumer handles (``bus.job_of``: its payload's job, also
  for a node-routed grant, revocation or batch of metrics); the HTTP middleware one for a
  request whose route names a job (``http_tracing``); the runner wraps a job's grant,
  revocation, recovery and its stop in a drain in one; the scheduler's sweeps and passes and
  the registry's batches one per job they log about), else from the current span: its ``trainyard.job_id`` or ``job.id`` attribute (the
  scheduler's spans about a job), or the routing key of the event it publishes or handles
  (``cloudevents.event_subject``, or the runner's ``trainyard.subject``) when that event's
  type is routed by its job id (docs/events.md: every type but the node-, flavor- and
  team-routed ones), so a line logged while handling a job's event carries it without each
  call saying so.
- ``Throttle`` keeps a failure that every request or retry meets while it lasts (a
  dependency away) to one log line per reason a minute, with the count of those held back.
- ``chain_text`` says an exception and its causes on one line, for a line about an outage
  (no traceback).
"""

from __future__ import annotations

import copy
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, Literal

from opentelemetry import trace

from trainyard_platform.shared.events.payloads import EVENT_TYPES
from trainyard_platform.shared.events.trust import routing_key_of

JOB_ATTRIBUTES: Final = ("trainyard.job_id", "job.id")
"""Span attributes a job id is read from, in order."""
EVENT_TYPE_ATTRIBUTE: Final = "cloudevents.event_type"
ROUTING_KEY_ATTRIBUTES: Final = ("cloudevents.event_subject", "trainyard.subject")
"""Span attributes an event's routing key is read from, in order."""


def _routed_by_job() -> frozenset[str]:
    """The event types whose routing key is their job id (``trust.routing_key_of``: an
    event built with only a job id has that routing key; the others need a node, a flavor
    or a team)."""
    probe = "job"
    routed: set[str] = set()
    for event_type, payload in EVENT_TYPES.items():
        try:
            if routing_key_of(payload.model_construct(job_id=probe)) == probe:
                routed.add(event_type)
        except AttributeError:  # routed by a field the probe has not: not by its job
            pass
    return frozenset(routed)


ROUTED_BY_JOB: Final = _routed_by_job()


_job_scope: ContextVar[str | None] = ContextVar("trainyard_job_scope", default=None)


@contextmanager
def job_scope(job_id: str) -> Iterator[None]:
    """Log lines made in the block, and in tasks and threads started from it (they copy the
    context), carry ``job_id`` (see the module)."""
    token = _job_scope.set(job_id)
    try:
        yield
    finally:
        _job_scope.reset(token)


def span_job_id(attributes: Mapping[str, Any]) -> str | None:
    """The job a span is about, from its attributes (see the module), or None."""
    for name in JOB_ATTRIBUTES:
        if name in attributes:
            return str(attributes[name])
    if attributes.get(EVENT_TYPE_ATTRIBUTE) in ROUTED_BY_JOB:
        for name in ROUTING_KEY_ATTRIBUTES:
            if name in attributes:
                return str(attributes[name])
    return None


def trace_fields(record: logging.LogRecord) -> dict[str, str]:
    """``trace_id``, ``span_id`` and ``job_id`` for ``record`` (each only when known)."""
    fields: dict[str, str] = {}
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        fields["trace_id"] = format(ctx.trace_id, "032x")
        fields["span_id"] = format(ctx.span_id, "016x")
    job_id = getattr(record, "job_id", None) or _job_scope.get()
    if job_id is None:
        job_id = span_job_id(getattr(span, "attributes", None) or {})
    if job_id is not None:
        fields["job_id"] = str(job_id)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "message": record.getMessage(),
            **trace_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``time service LEVEL logger: message [trace=... span=... job=...]``."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A copy: other handlers of the same record format its message themselves.
        escaped = copy.copy(record)
        escaped.message = one_line(record.message)
        return super().formatMessage(escaped)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = trace_fields(record)
        if not fields:
            return text
        # Escaped as the message is: a job id can be what a client put in a request's path.
        ids = " ".join(f"{k.removesuffix('_id')}={one_line(v)}" for k, v in fields.items())
        first, _, rest = text.partition("\n")  # keep a traceback below the line it belongs to
        return f"{first} [{ids}]" + (f"\n{rest}" if rest else "")


_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with control characters (C0, DEL, C1) and Unicode line and paragraph
    separators escaped as Python would write them (``\\n``, ``\\x1b``, ``\\u2028``)."""
    return _LINE_BREAKING.sub(lambda m: repr(m.group())[1:-1], text)


def formatter(service: str, log_format: Literal["json", "text"]) -> logging.Formatter:
    return JsonFormatter(service) if log_format == "json" else TextFormatter(service)


def configure_logging(service: str, level: str, log_format: Literal["json", "text"]) -> None:
    """Send the process's log records to stderr in ``log_format`` at ``level`` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(service, log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def error_text(exc: BaseException) -> str:
    """What a log line or a one-line message says of ``exc``: its text on one line, or its
    type's name when it has none (``str(TimeoutError())`` is empty: a line about a database
    that did not answer ended in "failed: " and said nothing)."""
    return " ".join(str(exc).split()) or type(exc).__name__


CHAIN_LIMIT: Final = 8
"""At most this many exceptions of a chain are said (``chain_text``)."""


def chain_text(exc: BaseException) -> str:
    """``exc`` and what it came from (``raise ... from``, or raised while handling), on one
    line: each exception's type and text (``error_text``), the outermost first, joined by
    `` <- ``, at most ``CHAIN_LIMIT`` of them. For a line about an outage, where a
    traceback says nothing more: the host or the call that failed is in the chain's texts
    (``NoServersError: ... <- ConnectionRefusedError: [Errno 111] ...``)."""
    said: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(said) < CHAIN_LIMIT:
        seen.add(id(current))
        text = " ".join(str(current).split())
        said.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return " <- ".join(said)


REPEAT_SECONDS: Final = 60.0
"""A repeated failure is logged again at most this often (``Throttle``)."""


class Throttle:
    """Whether a repeated failure, keyed by its reason, is to be logged now: the first time,
    then at most once every ``interval_s``. ``due`` answers how many times it came since it
    was last logged (0 the first time), or None to hold it back (it is counted). At most
    ``max_reasons`` (``MAX_REASONS``) reasons are kept; past that the oldest are forgotten
    (logged again), so memory stays bounded. ``interval_s`` infinite: once per reason."""

    MAX_REASONS: Final = 256

    def __init__(
        self,
        interval_s: float = REPEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_reasons: int = MAX_REASONS,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_reasons = max_reasons
        self._seen: dict[str, tuple[float, int]] = {}

    def due(self, reason: str) -> int | None:
        now = self._clock()
        seen = self._seen.get(reason)
        if seen is not None and now - seen[0] < self.interval_s:
            self._seen[reason] = (seen[0], seen[1] + 1)
            return None
        self._seen.pop(reason, None)
        if len(self._seen) >= self._max_reasons:
            del self._seen[next(iter(self._seen))]
        self._seen[reason] = (now, 0)
        return 0 if seen is None else seen[1]


def held_back(count: int) -> str:
    """`` (N more times since it was last logged)`` for ``Throttle.due``'s count, or ''."""
    return f" ({count} more times since it was last logged)" if count else ""
