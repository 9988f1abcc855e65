"""The HTTP API: ``create_app`` wires controllers, authentication and error shapes.

Contract:
- Every ``/v1`` route needs ``Authorization: Bearer <token>``; without a valid one the answer
  is 401 before anything else is looked at.
- Every error is JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``:
  422 for invalid input (every bad field named, nothing stored), 401/403/404/409 as usual,
  and 500 with a generic message (the traceback goes to the log, never to the user).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import asyncpg
from litestar import Litestar, Request, Response, Router, get, post
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException, NotAuthorizedException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.params import FromPath, FromQuery, HeaderParameter, QueryParameter

from services.submission import commands
from services.submission.commands import Caller, Conflict, Forbidden, NotFound
from services.submission.config import Settings
from services.submission.domain import JobStatus
from services.submission.schemas import (
    CreateUserRequest,
    ErrorBody,
    FieldError,
    JobSummary,
    JobView,
    RequestInvalid,
    UserCreated,
    parse_body,
    parse_idempotency_key,
    parse_job_request,
)
from shared.auth import bearer_token
from shared.http_tracing import tracing_middleware

log = logging.getLogger(__name__)

Pool = NamedDependency[asyncpg.Pool]
Me = NamedDependency[Caller]
Config = NamedDependency[Settings]
AnyRequest = Request[Any, Any, Any]
IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]
Limit = Annotated[int, QueryParameter(ge=1, le=500)]


@dataclass(frozen=True)
class AppDeps:
    """What the app is built on: the service's pool, and the runtime's health routes."""

    pool: asyncpg.Pool
    health_handlers: Sequence[HTTPRouteHandler] = field(default_factory=tuple)


# --- controllers ---------------------------------------------------------------------


@post("/admin/users", status_code=201)
async def create_user(request: AnyRequest, pool: Pool, caller: Me) -> UserCreated:
    body = parse_body(CreateUserRequest, await request.body())
    return await commands.create_user(pool, caller, body)


@post("/jobs")
async def submit_job(
    request: AnyRequest, pool: Pool, caller: Me, settings: Config, key: IdempotencyKey = None
) -> Response[JobView]:
    job = parse_job_request(await request.body(), settings.flavors)
    view, created = await commands.submit_job(pool, caller, job, parse_idempotency_key(key))
    location = {"Location": f"/v1/jobs/{view.id}"}
    return Response(view, status_code=201 if created else 200, headers=location)


@get("/jobs/{job_id:str}")
async def get_job(job_id: FromPath[str], pool: Pool, caller: Me) -> JobView:
    return await commands.get_job(pool, caller, job_id)


@get("/jobs")
async def list_jobs(
    pool: Pool, caller: Me, status: FromQuery[JobStatus | None] = None, limit: Limit = 50
) -> list[JobSummary]:
    return await commands.list_jobs(pool, caller, status, limit)


@post("/jobs/{job_id:str}/cancel", status_code=202)
async def cancel_job(job_id: FromPath[str], pool: Pool, caller: Me) -> JobView:
    return await commands.cancel_job(pool, caller, job_id)


# --- authentication --------------------------------------------------------------------


async def resolve_caller(request: AnyRequest, pool: Pool) -> Caller:
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise NotAuthorizedException("missing bearer token (Authorization: Bearer <token>)")
    caller = await commands.authenticate(pool, token)
    if caller is None:
        raise NotAuthorizedException("invalid or revoked token")
    return caller


# --- errors ----------------------------------------------------------------------------


def _error(
    status: int,
    detail: str,
    errors: Sequence[FieldError] = (),
    headers: dict[str, str] | None = None,
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


def _not_found(_: AnyRequest, exc: NotFound) -> Response[ErrorBody]:
    return _error(404, str(exc))


def _forbidden(_: AnyRequest, exc: Forbidden) -> Response[ErrorBody]:
    return _error(403, str(exc))


def _conflict(_: AnyRequest, exc: Conflict) -> Response[ErrorBody]:
    return _error(409, str(exc))


def _crash(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error")


# --- the app ---------------------------------------------------------------------------


def create_app(settings: Settings, deps: AppDeps) -> Litestar:
    """The submission API over ``deps.pool``, with the runtime's health routes."""

    def provide_pool() -> asyncpg.Pool:
        return deps.pool

    def provide_settings() -> Settings:
        return settings

    v1 = Router(
        "/v1",
        route_handlers=[create_user, submit_job, get_job, list_jobs, cancel_job],
        dependencies={"caller": Provide(resolve_caller)},
    )
    return Litestar(
        route_handlers=[*deps.health_handlers, v1],
        dependencies={
            "pool": Provide(provide_pool, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
        },
        middleware=[tracing_middleware],
        exception_handlers={
            RequestInvalid: _invalid,
            ValidationException: _litestar_invalid,
            NotFound: _not_found,
            Forbidden: _forbidden,
            Conflict: _conflict,
            HTTPException: _http,
            Exception: _crash,
        },
        openapi_config=OpenAPIConfig(title="Trainyard submission", version="1.0.0"),
        debug=False,
    )
