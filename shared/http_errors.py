"""The one error shape of every Trainyard HTTP API, and the Litestar handlers that answer it.

Contract:
- Every error is JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``.
- 422 for invalid input: ``RequestInvalid`` (from ``parse_body`` or a service's own checks)
  or Litestar's validation of path and query parameters; every bad field is named by its
  path (``quotas.a100.nominal``, ``args[2]``; ``body`` for the body as a whole; a bad key
  of a mapping: the mapping, its message naming the key, ``key 'H100': ...``), all at once.
  Each message says what is wrong in plain words (``plain_message``: ``must be an integer``,
  ``must be at most 64``, ``unknown field``), a parameter's as a body field's, never
  pydantic's or msgspec's phrasing (``Input should be ...``, ``Expected `int`, got `str```).
- A refusal for what a request meets rather than for its shape (``Refused``: a conflict
  with the current state, 409; a limit reached, 429 with ``Retry-After``; a conditional
  request whose condition is false, 412) answers its status with its message as the detail
  and one error naming the field it is about (a body field, a path parameter, a header) and
  why: the field is a required argument, so no such answer has an empty ``errors``. So do
  ``NameTaken`` (a new name that differs only by case from one that exists, where names
  are unique regardless of case: docs/security.md; 409) and ``PreconditionFailed`` (a
  conditional request, ``If-Match: *`` or ``If-None-Match: *``, whose condition is false
  for the resource now: ``shared.http_app.Preconditions``; 412 naming the header and why;
  nothing changed).
- Litestar's HTTP errors keep their status and detail; a 401 adds ``WWW-Authenticate:
  Bearer``.
- A service's own exceptions answer the status it maps them to, their message as the detail
  (a ``Refused`` one: its detail and errors);
  every service answers ``shared.identity.Denied`` with 403, ``IdentityUnavailable``
  (user tokens cannot be checked now) with 503, and ``IdentityRateLimited`` (the user's own
  rate limit, which each check of the token spends) with 429 and its ``Retry-After``.
- A failure of what the service stands on, by the rule that waits out an event handler's
  (``bus.infrastructure_fault``: PostgreSQL, NATS or the object store unreachable, shutting
  down, starting up or out of connections; a connection lost, even one asyncpg left
  mid-operation; a timeout), raised or in the chain of a 5xx (an exception group's members
  too), answers 503 ``temporarily unavailable (<what>), try again`` with ``Retry-After``,
  ``<what>`` naming the dependency (``the database is not answering``: asyncpg timed out;
  ``the database is unavailable``, ``the event bus is not answering`` (the NATS client
  timed out), ``the event bus is unavailable``, ``the object store is unavailable``) and nothing of the error; a bare OS error or timeout of unknown origin says
  ``temporarily unavailable, try again``. The caller may simply retry (a transaction that
  failed stored nothing). The log has the failure in one line, the exception chain's types
  and texts with no traceback (``logs.chain_text``: an outage is no bug, and its errors'
  texts name the host), once per fault and minute (``logs.Throttle``, per app).
- Anything else, and every other 5xx, is ``internal error``: the traceback goes to the log,
  never to the user.
- ``check_json`` screens a JSON body before any model sees it: UTF-8, well formed, no
  duplicate keys, bounded nesting, numbers that fit 64 bits or a finite double, and no
  control characters (nor lone surrogates, nor bidirectional overrides) in any key or
  string, except tab, newline, carriage return and bidirectional formatting in the strings a
  caller names as free text. Each problem is a 422 naming its field.
- ``check_parameters`` holds every path and query parameter to the same rules: no control
  characters (a NUL, which PostgreSQL text cannot hold, among them), and no integer beyond
  64 bits where the route reads one (whatever bound the route declares, none reaches
  PostgreSQL or NATS); 422 naming each. On a documented route it also refuses a query
  parameter the route does not declare (``stauts=RUNNING`` would otherwise be ignored and
  list every job) and one given more than once that the route reads as a single value
  (which of them would count is not the caller's guess): ``unknown query parameter (the
  declared ones)``, ``given more than once``. The declared parameters are those of the
  route's OpenAPI operation, read from the app (``declare_query_parameters``). A header
  the route reads as one value (``Idempotency-Key``) given twice is refused the same way.
  ``shared.http_app.service_app`` runs it before every handler, after the guard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap
from pydantic import BaseModel, Field, ValidationError

from trainyard.patterns import pattern_message
from trainyard_platform.shared.bus import (
    NATS_NOT_ANSWERING,
    POSTGRES_NOT_ANSWERING,
    infrastructure_fault,
)
from trainyard_platform.shared.events.payloads import NOT_IN_A_NAME, NOT_IN_FREE_TEXT
from trainyard_platform.shared.identity import Denied, IdentityRateLimited, IdentityUnavailable
from trainyard_platform.shared.logs import Throttle, chain_text, held_back

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
AnyRequest = Request[Any, Any, Any]

_OWN_FIELD = re.compile(r"[\w.-]+")

RETRY_AFTER_S = 5


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """Every error response: a summary and, for invalid requests, one entry per field."""

    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class RequestInvalid(Exception):
    """A request failed validation; answered with 422, ``detail`` and ``errors``."""

    def __init__(self, errors: Sequence[FieldError], detail: str = "invalid request") -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors)

    @classmethod
    def one(cls, field: str, message: str) -> RequestInvalid:
        return cls([FieldError(field=field, message=message)])


class Refused(Exception):
    """A request refused for what it meets (the state of things, a limit), not for its
    shape (``RequestInvalid``): answered with ``status``, ``detail`` and ``errors`` naming
    the field it is about (a body field, a path parameter, a header such as
    ``Idempotency-Key`` or ``Authorization``) and why, with ``headers``. The field is a
    required argument: no such refusal answers an empty ``errors``. A service's own
    subclass may be mapped to another status (``exception_handlers``' ``statuses``).
    A ``message`` other than the detail is said within it, word for word (``f"{reason}:
    what to do"``, ``message=reason``): the CLI prints a field error whose message the
    detail holds once (``trainyard.client.TrainyardError``), and one reworded twice."""

    status: ClassVar[int] = 409

    def __init__(
        self,
        detail: str,
        *,
        field: str,
        message: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = [FieldError(field=field, message=message or detail)]
        self.headers = dict(headers or {})


class Conflicting(Refused):
    """The request contradicts the current state (answered 409)."""

    status = 409


class RateLimited(Refused):
    """A rate or concurrency limit is reached (answered 429, ``Retry-After: retry_after``
    whole seconds); ``field`` is what the limit counts by (``Authorization``: the token's
    user or team)."""

    status = 429

    def __init__(self, detail: str, *, retry_after: int, field: str, message: str) -> None:
        super().__init__(
            detail, field=field, message=message, headers={"Retry-After": str(retry_after)}
        )


class NameTaken(Refused):
    """A new name that differs only by case from the existing ``existing`` (where names are
    unique regardless of case: docs/security.md); answered with 409 and ``errors`` naming
    ``field``. Its text: ``<field>: a <kind> named '<existing>' exists[ in <where>]; names
    differ from it only by case``."""

    status = 409

    def __init__(self, field: str, kind: str, existing: str, where: str = "") -> None:
        place = f" in {where}" if where else ""
        self.field = field
        self.message = (
            f"a {kind} named {existing!r} exists{place}; names differ from it only by case"
        )
        super().__init__(f"{field}: {self.message}", field=field, message=self.message)


class PreconditionFailed(Refused):
    """A conditional request's ``header`` (``If-Match`` or ``If-None-Match``) is false for
    the resource now (``shared.http_app.Preconditions``): answered 412 with ``errors``
    naming ``header`` and ``message`` (why), and left as it is. Its text:
    ``<header>: <message>``."""

    status = 412

    def __init__(self, header: str, message: str) -> None:
        super().__init__(f"{header}: {message}", field=header, message=message)
        self.field = header
        self.message = message


# --- validation into field errors ------------------------------------------------------------


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a JSON body against ``model``, strictly; raise ``RequestInvalid`` naming
    every bad field.

    Strict for every model, whatever its own config: a value of the wrong JSON type is
    refused, never coerced (``{"version": "3"}`` is not version 3, nor ``3.0`` or ``true``).
    What JSON can only say as a string still reads as pydantic's strict JSON mode allows
    (decimal strings, ISO 8601 times, enum values)."""
    try:
        return model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise RequestInvalid(field_errors(exc)) from None


def field_errors(exc: ValidationError) -> list[FieldError]:
    """One ``FieldError`` per error of ``exc``, with the field's path and a short message.

    A model-level check may name the field it is about by starting its message with
    ``<field>: `` (``"lending_limit: must not exceed nominal"``); the error is then reported
    on that field, below the model's own path."""
    errors = []
    for err in exc.errors(include_url=False):
        loc, message = err["loc"], plain_message(err)
        if len(loc) >= 2 and loc[-1] == "[key]":
            # A mapping's key, not its value: pydantic's loc ("labels", "-bad", "[key]") read
            # as the path "labels.-bad.[key]" (and an empty key "hyperparameters..[key]").
            # The mapping is the field, the message names the key, as the CLI says it.
            key = repr(str(loc[-2]))
            loc, message = loc[:-2], message if key in message else f"key {key}: {message}"
        tag = _union_tag(err["type"], err.get("ctx"))
        if tag is not None:
            # A tagged union (``code``) whose tag names no form: the tag's field is the
            # mistake, not the union ("Unable to extract tag using discriminator 'kind'").
            loc, message = (*loc, tag[0]), tag[1]
        path = field_path(loc)
        head, sep, rest = message.partition(": ")
        if err["type"] == "value_error" and sep and _OWN_FIELD.fullmatch(head):
            path, message = (f"{path}.{head}" if path != "body" else head), rest
        errors.append(FieldError(field=path, message=message))
    return errors


_TAG_FIELD = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")


def _union_tag(kind: str, context: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The tag's field and what to say of it, for a union whose tag is missing or names
    none of its forms; None for any other error (or a tag pydantic does not name)."""
    if kind not in ("union_tag_not_found", "union_tag_invalid") or context is None:
        return None
    named = _TAG_FIELD.fullmatch(str(context.get("discriminator")))
    if named is None:
        return None
    if kind == "union_tag_not_found":
        return named.group(1), "field required"
    return named.group(1), f"must be one of {context.get('expected_tags')}"


def field_path(loc: Sequence[int | str]) -> str:
    """``("args", 2)`` -> ``args[2]``; ``("hyperparameters", "lr")`` -> ``hyperparameters.lr``;
    the whole body -> ``body``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path or "body"


def plain_message(err: Mapping[str, Any]) -> str:
    """What is wrong with a field, in plain words, for one pydantic error (``err``, as
    ``ValidationError.errors`` gives it): ``must be an integer``, ``must be at most 64``,
    never pydantic's own phrasing (``Input should be ...``, ``Value error, ...``)."""
    kind, message = str(err["type"]), str(err["msg"])
    context: Mapping[str, Any] = err.get("ctx") or {}
    if kind == "string_pattern_mismatch":
        # In words where the pattern has them (``trainyard.patterns``), not as a regex.
        pattern = str(context.get("pattern"))
        return pattern_message(pattern) or f"must match the pattern {pattern}"
    if kind in ("value_error", "assertion_error"):
        # The model's own words: pydantic prefixes them.
        return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    said = _PLAIN.get(kind)
    if said is not None:
        return said(context) + _hint(kind, err.get("input"))
    for prefix, kinds in _PLAIN_FAMILIES:
        if kind.startswith(prefix):
            return kinds + _reason(context)
    return _plain_fallback(message)


def _number(value: Any) -> str:
    """A bound as a user writes it: ``1000000000000000`` and ``1000``, not ``Decimal('1E+15')``
    nor ``1000.0`` (pydantic gives a ``Decimal`` bound as its repr)."""
    text = str(value)
    found = re.fullmatch(r"Decimal\('([^']*)'\)", text)
    try:
        number = Decimal(found.group(1) if found else text)
    except ArithmeticError:
        return text
    if number.is_finite() and number == number.to_integral_value() and abs(number) < 10**30:
        return str(int(number))
    return text if found is None else format(number, "f")


def _count(n: Any, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _items(context: Mapping[str, Any]) -> tuple[str, str]:
    """What a list (``items``) or a mapping (``entries``) holds, one and many."""
    if str(context.get("field_type", "")).startswith("Dict"):
        return "entry", "entries"
    return "item", "items"


def _reason(context: Mapping[str, Any]) -> str:
    """Why a date, time or URL did not parse (pydantic's ``error`` context), in brackets."""
    error = context.get("error")
    return f" ({error})" if error else ""


_PLAIN: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "missing": lambda _: "field required",
    "extra_forbidden": lambda _: "unknown field",
    "model_type": lambda _: "must be a JSON object",
    "model_attributes_type": lambda _: "must be a JSON object",
    "dataclass_type": lambda _: "must be a JSON object",
    "dict_type": lambda _: "must be a JSON object",
    "mapping_type": lambda _: "must be a JSON object",
    "list_type": lambda _: "must be a list",
    "tuple_type": lambda _: "must be a list",
    "set_type": lambda _: "must be a list",
    "frozen_set_type": lambda _: "must be a list",
    "iterable_type": lambda _: "must be a list",
    "set_item_not_hashable": lambda _: "must hold only strings, numbers or booleans",
    "string_type": lambda _: "must be a string",
    "string_unicode": lambda _: "must be valid Unicode text",
    "string_not_ascii": lambda _: "must be ASCII",
    "string_too_short": lambda c: (
        f"must be at least {_count(c.get('min_length'), 'character', 'characters')}"
    ),
    "string_too_long": lambda c: (
        f"must be at most {_count(c.get('max_length'), 'character', 'characters')}"
    ),
    "bytes_type": lambda _: "must be a string",
    "bytes_too_short": lambda c: f"must be at least {_count(c.get('min_length'), 'byte', 'bytes')}",
    "bytes_too_long": lambda c: f"must be at most {_count(c.get('max_length'), 'byte', 'bytes')}",
    "bytes_invalid_encoding": lambda _: "must be validly encoded",
    "too_short": lambda c: f"must have at least {_count(c.get('min_length'), *_items(c))}",
    "too_long": lambda c: f"must have at most {_count(c.get('max_length'), *_items(c))}",
    "int_type": lambda _: "must be an integer",
    "int_parsing": lambda _: "must be an integer",
    "int_from_float": lambda _: "must be an integer",
    "int_parsing_size": lambda _: _TOO_LARGE,
    "float_type": lambda _: "must be a number",
    "float_parsing": lambda _: "must be a number",
    "finite_number": lambda _: "must be a finite number",
    "decimal_type": lambda _: "must be a decimal number",
    "decimal_parsing": lambda _: "must be a decimal number",
    "decimal_max_digits": lambda c: (
        f"must have at most {_count(c.get('max_digits'), 'digit', 'digits')}"
    ),
    "decimal_max_places": lambda c: (
        f"must have at most {_count(c.get('decimal_places'), 'digit', 'digits')} "
        "after the decimal point"
    ),
    "decimal_whole_digits": lambda c: (
        f"must have at most {_count(c.get('whole_digits'), 'digit', 'digits')} "
        "before the decimal point"
    ),
    "is_instance_of": lambda c: (
        "must be a decimal number" if c.get("class") == "Decimal" else "has the wrong type"
    ),
    "bool_type": lambda _: "must be true or false",
    "bool_parsing": lambda _: "must be true or false",
    "none_required": lambda _: "must be null",
    "greater_than": lambda c: f"must be greater than {_number(c.get('gt'))}",
    "greater_than_equal": lambda c: f"must be at least {_number(c.get('ge'))}",
    "less_than": lambda c: f"must be less than {_number(c.get('lt'))}",
    "less_than_equal": lambda c: f"must be at most {_number(c.get('le'))}",
    "multiple_of": lambda c: f"must be a multiple of {_number(c.get('multiple_of'))}",
    "enum": lambda c: f"must be {c.get('expected')}",
    "literal_error": lambda c: f"must be {c.get('expected')}",
    "timezone_naive": lambda _: "must not name a time zone",
    "timezone_aware": lambda _: "must name its time zone (Z or an offset such as +01:00)",
    "timezone_offset": lambda c: f"must have the time zone offset {c.get('tz_expected')} seconds",
    "datetime_past": lambda _: "must be in the past",
    "datetime_future": lambda _: "must be in the future",
    "date_past": lambda _: "must be in the past",
    "date_future": lambda _: "must be in the future",
    "url_scheme": lambda c: f"must be a URL of scheme {c.get('expected_schemes')}",
    "url_too_long": lambda c: (
        f"must be a URL of at most {_count(c.get('max_length'), 'character', 'characters')}"
    ),
    "json_invalid": lambda c: "must be valid JSON" + _reason(c),
    "json_type": lambda _: "must be a JSON string",
    "recursion_loop": lambda _: "is nested too deeply",
    "recursion_depth_exceeded": lambda _: "is nested too deeply",
}
"""Each pydantic error type (``pydantic_core.ErrorType``) a request body can meet, said in
plain words from its context. Types a body cannot meet (Python objects, call arguments) fall
back to pydantic's message, reworded (``_plain_fallback``)."""

_PLAIN_FAMILIES: tuple[tuple[str, str], ...] = (
    ("datetime_", "must be a date and time in ISO 8601, such as 2026-01-31T09:30:00Z"),
    ("date_", "must be a date in ISO 8601, such as 2026-01-31"),
    ("time_delta_", "must be a duration, in seconds or ISO 8601 (PT1H30M)"),
    ("time_", "must be a time of day in ISO 8601, such as 09:30:00"),
    ("url_", "must be a URL"),
    ("uuid_", "must be a UUID"),
)
"""The rest of a family of types (``datetime_parsing``, ``date_type``), by the prefix of its
name, in the order they are tried; pydantic's reason the value did not parse follows."""


def _hint(kind: str, value: Any) -> str:
    """How to write ``value`` where the fix is plain, as the CLI says it of a spec file
    (``trainyard.spec``): a number sent as a string, a string sent as a number."""
    if kind in ("int_type", "float_type", "decimal_type") and isinstance(value, str):
        text = value.strip()
        wanted = _DIGITS if kind == "int_type" else _DECIMAL
        if wanted.fullmatch(text) and math.isfinite(float(text)):
            return f" (remove the quotes: {text})"
    if kind == "string_type" and isinstance(value, bool | int | float):
        return f' (quote it: "{json.dumps(value)}")'
    return ""


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _plain_fallback(message: str) -> str:
    """Pydantic's message for a type no request body should meet, in the same voice as the
    rest: ``Input should be a valid X`` -> ``must be a valid X``."""
    for theirs, ours in (("Input should be ", "must be "), ("Input should ", "must ")):
        if message.startswith(theirs):
            return ours + message.removeprefix(theirs)
    return message[:1].lower() + message[1:]


# --- screening raw JSON -----------------------------------------------------------------------

MAX_JSON_DEPTH = 16
"""How deeply a request body may nest objects and arrays."""
_INT64 = 2**63
_CONTROL = NOT_IN_A_NAME
"""Refused outside free text (``NOT_IN_A_NAME``); free text may hold the bidirectional
marks (right-to-left prose)."""
_CONTROL_BUT_WHITESPACE = NOT_IN_FREE_TEXT


class _Bad:
    """A value ``json.loads`` produced that no body may hold (the walk names its field)."""

    def __init__(self, message: str) -> None:
        self.message = message


class _Object(dict[str, Any]):
    duplicates: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    obj.duplicates = [] if len(obj) == len(pairs) else _repeated([k for k, _ in pairs])
    return obj


def _repeated(keys: list[str]) -> list[str]:
    seen: set[str] = set()
    return [k for k in keys if k in seen or seen.add(k)]  # type: ignore[func-returns-value]


def _int(text: str) -> int | _Bad:
    if len(text.lstrip("-")) > 19:  # before int(): Python refuses to parse very long ints
        return _Bad("number too large (at most 64-bit integers)")
    return int(text)


def _constant(text: str) -> _Bad:
    return _Bad(f"{text} is not JSON; must be a finite number")


def check_json(
    body: bytes, free_text: Callable[[str], bool] = lambda _: False, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """The parsed ``body``, or ``RequestInvalid`` naming each field that breaks the module's
    rules (see the contract). ``free_text(path)`` says whether the string at ``path`` may hold
    tab, newline and carriage return."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestInvalid.one("body", f"must be UTF-8 encoded JSON ({exc.reason})") from None
    try:
        value = json.loads(
            text, object_pairs_hook=_object, parse_int=_int, parse_constant=_constant
        )
    except json.JSONDecodeError as exc:
        message = f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise RequestInvalid.one("body", message) from None
    except RecursionError:
        raise RequestInvalid.one(
            "body", f"nested too deeply (at most {max_depth} levels)"
        ) from None
    except ValueError as exc:
        raise RequestInvalid.one("body", f"invalid JSON: {exc}") from None
    errors = _screen(value, free_text, max_depth)
    if errors:
        raise RequestInvalid(errors)
    return value


def _screen(value: Any, free_text: Callable[[str], bool], max_depth: int) -> list[FieldError]:
    # ``value`` comes from ``json.loads`` with the hooks above, so every node is exactly one
    # of _Object, list, str, int, float, bool, None or _Bad: dispatching on ``type`` keeps
    # this walk cheap (it runs on every JSON body).
    errors: list[FieldError] = []
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        path, item, depth = stack.pop()
        kind = type(item)
        if kind is str:
            # Most strings hold no control character at all: ask ``free_text`` (a regex match
            # on the path) only for one that does.
            found = _CONTROL.search(item)
            if found and free_text(path):
                allowed = "tab, newline and carriage return only"
                found = _CONTROL_BUT_WHITESPACE.search(item)
            else:
                allowed = "none"
            if found:
                message = (
                    f"must not contain control characters (found U+{ord(found.group()):04X}; "
                    f"allowed: {allowed})"
                )
                errors.append(FieldError(field=path or "body", message=message))
        elif kind is _Object or kind is list:
            if depth >= max_depth:
                message = f"nested too deeply (at most {max_depth} levels)"
                errors.append(FieldError(field=path or "body", message=message))
            elif kind is list:
                stack.extend(reversed([(f"{path}[{i}]", c, depth + 1) for i, c in enumerate(item)]))
            else:
                for key in item.duplicates:
                    errors.append(FieldError(field=_join(path, key), message="duplicate key"))
                children = []
                for key, child in item.items():
                    if _CONTROL.search(key):
                        message = "field name must not contain control characters"
                        errors.append(FieldError(field=_join(path, key), message=message))
                        continue
                    children.append((f"{path}.{key}" if path else key, child, depth + 1))
                stack.extend(reversed(children))
        elif kind is _Bad:
            errors.append(FieldError(field=path or "body", message=item.message))
        elif kind is int and not -_INT64 <= item < _INT64:
            message = "number too large (at most 64-bit integers)"
            errors.append(FieldError(field=path or "body", message=message))
        elif kind is float and not math.isfinite(item):
            message = "number too large (must be a finite double)"
            errors.append(FieldError(field=path or "body", message=message))
    return errors


async def check_parameters(request: Request[Any, Any, Any]) -> None:
    """Raise ``RequestInvalid`` naming each path or query parameter whose value holds a
    control character or a lone surrogate, or that the route reads as an integer and is
    beyond 64 bits (see the contract). A coroutine although it waits for nothing: Litestar
    runs a plain function given as ``before_request`` in a worker thread, a thread hop on
    every request."""
    scope = request.scope
    declared = _declared(scope.get("route_handler"))
    if declared is not None and declared[2]:
        _no_header_twice(request, declared[2])
    if not scope.get("path_params") and not scope.get("query_string"):
        return  # nothing to screen (most writes): no query string parsed into a MultiDict
    values = [*request.path_params.items(), *request.query_params.multi_items()]
    errors = []
    for name, value in values:
        if isinstance(value, str):
            found = _CONTROL.search(value)
            if found:
                message = f"must not contain control characters (found U+{ord(found.group()):04X})"
                errors.append(FieldError(field=_join("", name), message=message))
            elif (
                len(value) > 18  # shorter ones fit 64 bits: most requests stop here
                and _beyond_int64(value)
                and name in _integer_queries(scope.get("route_handler"))
            ):
                errors.append(FieldError(field=name, message=_TOO_LARGE))
        elif type(value) is int and not -_INT64 <= value < _INT64:  # a path's {name:int}
            errors.append(FieldError(field=name, message=_TOO_LARGE))
    if declared is not None and scope.get("query_string"):
        errors.extend(_undeclared(request, declared[0], declared[1]))
    if errors:
        raise RequestInvalid(errors)


def declare_query_parameters(
    handler: Any,
    names: set[str],
    repeatable: set[str],
    single_headers: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Record that ``handler`` takes the query parameters ``names`` (as a caller sends
    them), of which ``repeatable`` may come more than once, and reads the headers
    ``single_headers`` as one value each; ``check_parameters`` refuses any other query
    parameter, and such a header given twice (Litestar would read the values joined with
    ", "). A handler never declared is not checked."""
    known, many, headers = _DECLARED_QUERIES.get(handler, (frozenset(), frozenset(), ()))
    _DECLARED_QUERIES[handler] = (
        known | names,
        many | repeatable,
        tuple(sorted(set(headers) | set(single_headers))),
    )


def _declared(handler: Any) -> tuple[frozenset[str], frozenset[str], tuple[str, ...]] | None:
    """What ``declare_query_parameters`` recorded of ``handler``, or None."""
    if handler is None:
        return None
    try:
        return _DECLARED_QUERIES.get(handler)
    except TypeError:  # Litestar's own OPTIONS handlers are slotted: no weak reference
        return None


def _no_header_twice(request: Request[Any, Any, Any], names: tuple[str, ...]) -> None:
    errors = [
        FieldError(field=name, message="given more than once")
        for name in names
        if len(request.headers.getall(name, [])) > 1
    ]
    if errors:
        raise RequestInvalid(errors)


def _undeclared(
    request: Request[Any, Any, Any], known: frozenset[str], repeatable: frozenset[str]
) -> list[FieldError]:
    errors = []
    query = request.query_params
    for name in sorted(set(query.keys())):
        shown = _join("", name)
        if name not in known:
            listed = ", ".join(sorted(known)) or "this route takes none"
            errors.append(FieldError(field=shown, message=f"unknown query parameter ({listed})"))
        elif name not in repeatable and len(query.getall(name)) > 1:
            errors.append(FieldError(field=shown, message="given more than once"))
    return errors


_DECLARED_QUERIES: weakref.WeakKeyDictionary[
    Any, tuple[frozenset[str], frozenset[str], tuple[str, ...]]
] = weakref.WeakKeyDictionary()
_TOO_LARGE = "number too large (at most 64-bit integers)"
_DIGITS = re.compile(r"[+-]?[0-9]+")
_INTEGER_QUERIES: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def _beyond_int64(text: str) -> bool:
    """Whether ``text`` is an integer (as Litestar would parse it) outside 64 bits."""
    if not _DIGITS.fullmatch(text):
        return False  # not an integer at all: the route's own validation says so
    digits = text.lstrip("+-").lstrip("0")  # int() refuses over 4300 digits, zeros too
    if len(digits) > 19:
        return True
    return int(digits or "0") >= (_INT64 + 1 if text.startswith("-") else _INT64)


def _integer_queries(handler: Any) -> frozenset[str]:
    """The query parameters (by the name a caller sends) ``handler`` reads as integers:
    beyond 64 bits no column, NATS sequence or cursor holds them, whatever bound the
    route forgot to declare. Computed once per handler."""
    if handler is None:
        return frozenset()
    try:
        known = _INTEGER_QUERIES.get(handler)
    except TypeError:  # Litestar's own OPTIONS handlers are slotted: no weak reference
        return _integer_names(handler)
    if known is None:
        known = _INTEGER_QUERIES[handler] = _integer_names(handler)
    return known


def _integer_names(handler: Any) -> frozenset[str]:
    names = set()
    dependencies = handler.resolve_dependencies()
    for name, field in handler.parsed_fn_signature.parameters.items():
        kinds = [field.annotation, *(a.annotation for a in field.inner_types)]
        if name not in dependencies and any(kind is int for kind in kinds):
            alias = getattr(field.kwarg_definition, "query", None)
            names.add(alias or name)
    return frozenset(names)


def _join(path: str, key: str) -> str:
    shown = _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", key)
    return f"{path}.{shown}" if path else shown


# --- exception handlers -----------------------------------------------------------------------


def exception_handlers(
    statuses: Mapping[type[Exception], int] | None = None,
) -> ExceptionHandlersMap:
    """The handlers of an app: the shared ones, plus each of the service's own exceptions
    answered with its status (``{NotFound: 404, Conflict: 409}``). The app's 503s for a
    dependency are logged through one ``logs.Throttle`` of its own."""
    throttle = Throttle()

    def http(request: AnyRequest, exc: HTTPException) -> Response[ErrorBody]:
        return _http(request, exc, throttle)

    def crash(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
        return _crash(request, exc, throttle)

    handlers: ExceptionHandlersMap = {
        RequestInvalid: _invalid,
        Refused: _refused,
        ValidationException: _litestar_invalid,
        HTTPException: http,
        Denied: status_handler(403),
        IdentityUnavailable: status_handler(503),
        IdentityRateLimited: _rate_limited,
        Exception: crash,
    }
    for kind, status in (statuses or {}).items():
        handlers[kind] = status_handler(status)
    return handlers


def status_handler(status: int) -> Callable[[AnyRequest, Exception], Response[ErrorBody]]:
    """A handler answering ``status`` with the exception's message as the detail (a
    ``Refused``: its detail, errors and headers)."""

    def handle(_: AnyRequest, exc: Exception) -> Response[ErrorBody]:
        if isinstance(exc, Refused):
            return _error(status, exc.detail, exc.errors, exc.headers)
        return _error(status, str(exc))

    return handle


def _error(
    status: int,
    detail: str,
    errors: Sequence[FieldError] = (),
    headers: Mapping[str, str] | None = None,
) -> Response[ErrorBody]:
    body = ErrorBody(detail=detail, errors=list(errors))
    return Response(body, status_code=status, headers=headers or None)


def _rate_limited(_: AnyRequest, exc: IdentityRateLimited) -> Response[ErrorBody]:
    # As submission's own 429 (``RateLimited``): the limit counts by the token's user.
    why = FieldError(field="Authorization", message=str(exc))
    return _error(429, str(exc), [why], headers={"Retry-After": exc.retry_after})


def _refused(_: AnyRequest, exc: Refused) -> Response[ErrorBody]:
    return _error(exc.status, exc.detail, exc.errors, exc.headers)


def _invalid(_: AnyRequest, exc: RequestInvalid) -> Response[ErrorBody]:
    return _error(422, exc.detail, exc.errors)


def _litestar_invalid(request: AnyRequest, exc: ValidationException) -> Response[ErrorBody]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    errors = []
    for e in extra:
        if isinstance(e, dict):
            field = str(e.get("key") or "body")
            said = _parameter_message(str(e.get("message", "invalid")), request, field)
            errors.append(FieldError(field=field, message=said))
    missing = _MISSING.match(str(exc.detail))
    if not errors and missing is not None:
        # Litestar says it in its detail alone, with the request's path and query: the
        # parameter is named as any other bad one, and nothing of the request repeated.
        what = f"required (a {missing.group(1)} parameter of this route)"
        errors.append(FieldError(field=missing.group(2), message=what))
    return _error(422, "invalid request", errors)


_MISSING = re.compile(r"Missing required (\w+) parameter '([^']*)'")


_PARAMETER_TYPES = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a JSON object",
    "datetime": "a date and time in ISO 8601, such as 2026-01-31T09:30:00Z",
    "date": "a date in ISO 8601, such as 2026-01-31",
    "uuid": "a UUID",
}
_BOUNDS = {">=": "at least", "<=": "at most", ">": "greater than", "<": "less than"}
_EXPECTED_TYPE = re.compile(r"Expected `(\w+)`, got `\w+`")
_EXPECTED_BOUND = re.compile(r"Expected `(\w+)` (>=|<=|>|<) (\S+)")
_EXPECTED_LENGTH = re.compile(r"Expected `(\w+)` of length (>=|<=|>|<) (\d+)")
_EXPECTED_PATTERN = re.compile(r"Expected `str` matching regex '(.*)'")
_BAD_ENUM = re.compile(r"Invalid enum value (.*)")
_BAD_ENCODING = re.compile(r"Invalid (?:RFC3339 encoded )?(\w+)")


def _parameter_message(message: str, request: AnyRequest, name: str) -> str:
    """Litestar's (msgspec's) words for a bad path or query parameter, said as a body's
    errors are (``must be an integer``, ``must be at most 100``), never ``Expected `int`,
    got `str```."""
    if found := _EXPECTED_TYPE.fullmatch(message):
        return f"must be {_PARAMETER_TYPES.get(found.group(1), found.group(1))}"
    if found := _EXPECTED_LENGTH.fullmatch(message):
        unit = "characters" if found.group(1) == "str" else "items"
        return f"must be {_BOUNDS[found.group(2)]} {found.group(3)} {unit}"
    if found := _EXPECTED_BOUND.fullmatch(message):
        return f"must be {_BOUNDS[found.group(2)]} {_number(found.group(3))}"
    if found := _EXPECTED_PATTERN.fullmatch(message):
        pattern = found.group(1)
        return pattern_message(pattern) or f"must match the pattern {pattern}"
    if found := _BAD_ENUM.fullmatch(message):
        choices = _choices(request.scope.get("route_handler"), name)
        said = f"{found.group(1)} is not one of the values it takes"
        return said if not choices else f"must be one of {', '.join(map(repr, choices))}"
    if found := _BAD_ENCODING.fullmatch(message):  # "Invalid RFC3339 encoded datetime"
        kind = found.group(1).lower()
        return f"must be {_PARAMETER_TYPES.get(kind, f'a valid {kind}')}"
    return message.replace("`", "")


def _choices(handler: Any, name: str) -> list[str]:
    """The values of the enumeration the parameter ``name`` (as a caller sends it) of
    ``handler`` is read as; empty when it is none."""
    if handler is None:
        return []
    for key, field in handler.parsed_fn_signature.parameters.items():
        alias = getattr(field.kwarg_definition, "query", None)
        if (alias or key) != name:
            continue
        for kind in (field.annotation, *(a.annotation for a in field.inner_types)):
            if isinstance(kind, type) and issubclass(kind, Enum):
                return [str(member.value) for member in kind]
    return []


def _http(request: AnyRequest, exc: HTTPException, throttle: Throttle) -> Response[ErrorBody]:
    if exc.status_code >= 500 and _lost_connection(exc):
        return _unavailable(request, exc, throttle)
    if exc.status_code >= 500:
        # Litestar wraps failures in dependencies; the cause is in the chain, for the log only.
        log.error("HTTP %d: %s", exc.status_code, exc.detail, exc_info=exc)
        return _error(exc.status_code, "internal error")
    headers = dict(exc.headers or {})
    if exc.status_code == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return _error(exc.status_code, exc.detail, headers=headers)


def _crash(request: AnyRequest, exc: Exception, throttle: Throttle) -> Response[ErrorBody]:
    if _lost_connection(exc):
        return _unavailable(request, exc, throttle)
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error")


_UNAVAILABLE: tuple[tuple[str, str], ...] = (
    (POSTGRES_NOT_ANSWERING, "the database is not answering"),
    ("PostgreSQL", "the database is unavailable"),
    (NATS_NOT_ANSWERING, "the event bus is not answering"),
    ("NATS", "the event bus is unavailable"),
    ("object store", "the object store is unavailable"),
)
"""What a 503's detail says of the dependency, by how ``infrastructure_fault`` names it (the
rest of its text, the error, is for the log only)."""


def unavailable_detail(fault: str | None) -> str:
    """The detail of a 503 for ``fault`` (``infrastructure_fault``'s answer): the dependency
    that failed, when it is known, and nothing of the error."""
    for prefix, what in _UNAVAILABLE:
        if fault is not None and fault.startswith(prefix):
            return f"temporarily unavailable ({what}), try again"
    return "temporarily unavailable, try again"


def _lost_connection(exc: BaseException) -> bool:
    """Whether a dependency failed, not the request (``bus.infrastructure_fault``, the rule
    by which a handler's failure is waited out: PostgreSQL, NATS or the object store
    unreachable, a connection lost, a timeout): answered 503, try again."""
    return infrastructure_fault(exc) is not None


def _unavailable(
    request: AnyRequest, exc: BaseException, throttle: Throttle
) -> Response[ErrorBody]:
    """503 for a dependency that failed. Logged in one line, the exception chain without a
    traceback (``logs.chain_text``), the first time for each fault, then once a minute with
    the count held back (``logs.Throttle``): while a database does not answer, every request
    meets it, and each logged its traceback."""
    fault = infrastructure_fault(exc)
    repeats = throttle.due(fault or repr(exc))
    if repeats is not None:
        log.warning(
            "%s %s: a dependency is unavailable%s: %s: %s",
            request.method,
            request.url.path,
            held_back(repeats),
            fault,
            chain_text(exc),
        )
    return _error(
        503,
        unavailable_detail(fault),
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def read_body(request: Request[Any, Any, Any], limit: int, too_large: str) -> bytes:
    """The request's body, refused with 413 (``too_large`` as the detail) when its
    ``Content-Length`` announces, or its stream delivers, more than ``limit`` bytes; the
    stream is cut off there, so a chunked upload never fills memory past the limit."""
    announced = request.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > limit:
        raise HTTPException(status_code=413, detail=too_large)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise HTTPException(status_code=413, detail=too_large)
    return bytes(data)


async def spool_body(
    request: Request[Any, Any, Any], path: Path, limit: int, too_large: str
) -> str:
    """Write the request's body to the new file ``path`` as it streams in, refused like
    ``read_body`` past ``limit`` bytes; its sha256 (hex). For bodies too large to hold in
    memory (code bundles): the service keeps no more than one chunk of it at a time."""
    announced = request.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > limit:
        raise HTTPException(status_code=413, detail=too_large)
    digest, size = hashlib.sha256(), 0
    with path.open("xb") as sink:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(status_code=413, detail=too_large)
            digest.update(chunk)
            sink.write(chunk)
    return digest.hexdigest()


async def read_json_body(
    request: Request[Any, Any, Any],
    limit: int,
    free_text: Callable[[str], bool],
    media_types: Sequence[str] = ("application/json",),
) -> bytes:
    """The body of a JSON request: 415 unless its ``Content-Type`` is one of ``media_types``
    (UTF-8; no other ``charset``), 413 past ``limit`` bytes (``read_body``), then screened by
    ``check_json`` (``free_text``: the paths whose strings may hold tab, newline, CR)."""
    media, _, params = request.headers.get("content-type", "").partition(";")
    charset = re.search(r"charset\s*=\s*\"?([^\";\s]+)", params, re.IGNORECASE)
    if media.strip().lower() not in media_types or (
        charset is not None and charset.group(1).lower() not in ("utf-8", "utf8")
    ):
        raise HTTPException(
            status_code=415,
            detail="unsupported media type: send the body as JSON with "
            f"Content-Type: {' or '.join(media_types)} (UTF-8)",
        )
    body = await read_body(request, limit, json_too_large(limit))
    check_json(body, free_text=free_text)
    return body


def json_too_large(limit: int) -> str:
    return (
        f"request body too large: this endpoint accepts at most {limit} bytes "
        f"({limit // 1024} KiB) of JSON"
    )
