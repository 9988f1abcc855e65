"""The one error shape of every Trainyard HTTP API, and the Litestar handlers that answer it.

Contract:
- Every error is JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``.
- 422 for invalid input: ``RequestInvalid`` (from ``parse_body`` or a service's own checks)
  or Litestar's validation of path and query parameters; every bad field is named by its
  path (``quotas.a100.nominal``, ``args[2]``; ``body`` for the body as a whole), all at once.
- Litestar's HTTP errors keep their status and detail; a 401 adds ``WWW-Authenticate:
  Bearer``.
- A service's own exceptions answer the status it maps them to, their message as the detail.
- Anything else, and every 5xx, is ``internal error``: the traceback goes to the log, never
  to the user.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap
from pydantic import BaseModel, Field, ValidationError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
AnyRequest = Request[Any, Any, Any]

_OWN_FIELD = re.compile(r"[\w.-]+")


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


# --- validation into field errors ------------------------------------------------------------


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a JSON body against ``model``; raise ``RequestInvalid`` naming every bad
    field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise RequestInvalid(field_errors(exc)) from None


def field_errors(exc: ValidationError) -> list[FieldError]:
    """One ``FieldError`` per error of ``exc``, with the field's path and a short message.

    A model-level check may name the field it is about by starting its message with
    ``<field>: `` (``"lending_limit: must not exceed nominal"``); the error is then reported
    on that field, below the model's own path."""
    errors = []
    for err in exc.errors(include_url=False):
        path = field_path(err["loc"])
        message = _message(err["type"], err["msg"])
        head, sep, rest = message.partition(": ")
        if err["type"] == "value_error" and sep and _OWN_FIELD.fullmatch(head):
            path, message = (f"{path}.{head}" if path != "body" else head), rest
        errors.append(FieldError(field=path, message=message))
    return errors


def field_path(loc: Sequence[int | str]) -> str:
    """``("args", 2)`` -> ``args[2]``; ``("hyperparameters", "lr")`` -> ``hyperparameters.lr``;
    the whole body -> ``body``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path or "body"


def _message(kind: str, message: str) -> str:
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "field required"
    if kind == "model_type":
        return "must be a JSON object"
    return message.removeprefix("Value error, ")


# --- exception handlers -----------------------------------------------------------------------


def exception_handlers(
    statuses: Mapping[type[Exception], int] | None = None,
) -> ExceptionHandlersMap:
    """The handlers of an app: the shared ones, plus each of the service's own exceptions
    answered with its status (``{NotFound: 404, Conflict: 409}``)."""
    handlers: ExceptionHandlersMap = {
        RequestInvalid: _invalid,
        ValidationException: _litestar_invalid,
        HTTPException: _http,
        Exception: _crash,
    }
    for kind, status in (statuses or {}).items():
        handlers[kind] = status_handler(status)
    return handlers


def status_handler(status: int) -> Callable[[AnyRequest, Exception], Response[ErrorBody]]:
    """A handler answering ``status`` with the exception's message as the detail."""

    def handle(_: AnyRequest, exc: Exception) -> Response[ErrorBody]:
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


def _invalid(_: AnyRequest, exc: RequestInvalid) -> Response[ErrorBody]:
    return _error(422, exc.detail, exc.errors)


def _litestar_invalid(_: AnyRequest, exc: ValidationException) -> Response[ErrorBody]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    errors = [
        FieldError(field=str(e.get("key") or "body"), message=str(e.get("message", "invalid")))
        for e in extra
        if isinstance(e, dict)
    ]
    return _error(422, "invalid request", errors)


def _http(_: AnyRequest, exc: HTTPException) -> Response[ErrorBody]:
    if exc.status_code >= 500:
        # Litestar wraps failures in dependencies; the cause is in the chain, for the log only.
        log.error("HTTP %d: %s", exc.status_code, exc.detail, exc_info=exc)
        return _error(exc.status_code, "internal error")
    headers = dict(exc.headers or {})
    if exc.status_code == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return _error(exc.status_code, exc.detail, headers=headers)


def _crash(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error")
