"""The HTTP API: ``create_app`` wires controllers, authentication and error shapes.

Contract:
- Every ``/v1`` route needs ``Authorization: Bearer <token>``; without a valid one the answer
  is 401 before anything else is looked at.
- Every error is JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``
  (``shared.http_errors``): 422 for invalid input (every bad field named, nothing stored),
  401/403/404/409 as usual, and 500 with a generic message (the traceback goes to the log,
  never to the user).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import asyncpg
from litestar import Litestar, Request, Response, Router, get, post
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.params import FromPath, FromQuery, HeaderParameter, QueryParameter

from services.submission import commands
from services.submission.commands import Caller, Conflict, Forbidden, NotFound
from services.submission.config import Settings
from services.submission.domain import JobStatus
from services.submission.schemas import (
    CreateUserRequest,
    JobSummary,
    JobView,
    UserCreated,
    parse_idempotency_key,
    parse_job_request,
)
from shared.auth import bearer_token
from shared.http_errors import exception_handlers, parse_body
from shared.http_tracing import tracing_middleware

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
        exception_handlers=exception_handlers({NotFound: 404, Forbidden: 403, Conflict: 409}),
        openapi_config=OpenAPIConfig(title="Trainyard submission", version="1.0.0"),
        debug=False,
    )
