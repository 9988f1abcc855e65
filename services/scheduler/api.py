"""The scheduler's HTTP app: health, readiness with the election role, the operator's queue
view and the admin API.

Contract:
- ``GET /v1/queue`` and every ``/v1/admin/...`` route are operator endpoints: when the
  ``admin_token`` setting is set they require ``Authorization: Bearer <admin_token>`` (401
  otherwise). Set it in production.
- They read and write PostgreSQL directly, so they work on every replica, leader or not.
- Admin routes: ``GET /v1/admin/flavors``, ``GET|PUT /v1/admin/flavors/{name}``, and the
  same for ``cohorts``, ``queues`` and ``priority-classes``. ``PUT`` creates (201) or
  replaces (200) and returns the resource.
- Errors are JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``: 422 for
  invalid input (every bad field named, nothing stored), 401/404/409 as usual, 500 with a
  generic message (the traceback goes to the log).
- ``GET /readyz`` adds ``role`` (``leader`` or ``follower``); a follower is ready (it serves
  reads and stands by).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from litestar import Litestar, Request, Response, Router, get, put
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException, ValidationException
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.params import FromPath
from litestar.types import Guard
from pydantic import SecretStr

from services.scheduler import admin
from services.scheduler import admin_repository as admin_repo
from services.scheduler import repository as repo
from services.scheduler.admin import Conflict, NotFound
from services.scheduler.admin_schemas import (
    CohortRequest,
    CohortView,
    ErrorBody,
    FieldError,
    FlavorRequest,
    FlavorView,
    PriorityClassRequest,
    PriorityClassView,
    QueueConfigView,
    QueueRequest,
    RequestInvalid,
    parse_body,
)
from services.scheduler.schemas import QueueView, queue_view
from shared.auth import bearer_token
from shared.http_tracing import tracing_middleware

log = logging.getLogger(__name__)

AnyRequest = Request[Any, Any, Any]
Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
"""(ready, body) of ``GET /readyz``."""


def admin_guard(token: SecretStr | None) -> Guard:
    """A Litestar guard that checks the admin bearer token (a no-op when none is set)."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if token is None:
            return
        presented = bearer_token(connection.headers.get("authorization"))
        if presented is None or not secrets.compare_digest(
            presented.encode(), token.get_secret_value().encode()
        ):
            raise NotAuthorizedException("operator endpoint: Authorization: Bearer <admin token>")

    return guard


def _created(view: Any, created: bool) -> Response[Any]:
    return Response(view, status_code=201 if created else 200)


def admin_router(pool: asyncpg.Pool, guard: Guard) -> Router:
    @get("/flavors")
    async def list_flavors() -> list[FlavorView]:
        return await admin.list_flavors(pool)

    @get("/flavors/{name:str}")
    async def get_flavor(name: FromPath[str]) -> FlavorView:
        return await admin.get_flavor(pool, name)

    @put("/flavors/{name:str}")
    async def put_flavor(name: FromPath[str], request: AnyRequest) -> Response[FlavorView]:
        return _created(*await admin.put_flavor(pool, name, await _body(FlavorRequest, request)))

    @get("/cohorts")
    async def list_cohorts() -> list[CohortView]:
        return await admin.list_cohorts(pool)

    @get("/cohorts/{name:str}")
    async def get_cohort(name: FromPath[str]) -> CohortView:
        return await admin.get_cohort(pool, name)

    @put("/cohorts/{name:str}")
    async def put_cohort(name: FromPath[str], request: AnyRequest) -> Response[CohortView]:
        return _created(*await admin.put_cohort(pool, name, await _body(CohortRequest, request)))

    @get("/queues")
    async def list_queues() -> list[QueueConfigView]:
        return await admin.list_queues(pool)

    @get("/queues/{name:str}")
    async def get_queue(name: FromPath[str]) -> QueueConfigView:
        return await admin.get_queue(pool, name)

    @put("/queues/{name:str}")
    async def put_queue(name: FromPath[str], request: AnyRequest) -> Response[QueueConfigView]:
        return _created(*await admin.put_queue(pool, name, await _body(QueueRequest, request)))

    @get("/priority-classes")
    async def list_classes() -> list[PriorityClassView]:
        return await admin.list_priority_classes(pool)

    @get("/priority-classes/{name:str}")
    async def get_class(name: FromPath[str]) -> PriorityClassView:
        return await admin.get_priority_class(pool, name)

    @put("/priority-classes/{name:str}")
    async def put_class(name: FromPath[str], request: AnyRequest) -> Response[PriorityClassView]:
        body = await _body(PriorityClassRequest, request)
        return _created(*await admin.put_priority_class(pool, name, body))

    return Router(
        "/v1/admin",
        guards=[guard],
        route_handlers=[
            list_flavors,
            get_flavor,
            put_flavor,
            list_cohorts,
            get_cohort,
            put_cohort,
            list_queues,
            get_queue,
            put_queue,
            list_classes,
            get_class,
            put_class,
        ],
    )


async def _body(model: type[Any], request: AnyRequest) -> Any:
    return parse_body(model, await request.body())


def readiness_handler(readiness: Readiness) -> HTTPRouteHandler:
    @get("/readyz", include_in_schema=False)
    async def readyz() -> Response[dict[str, Any]]:
        ready, body = await readiness()
        return Response(body, status_code=200 if ready else 503)

    return readyz


def create_app(
    pool: asyncpg.Pool,
    admin_token: SecretStr | None,
    health_handlers: Sequence[HTTPRouteHandler] = (),
) -> Litestar:
    """The scheduler's app over ``pool`` with the given health routes (see the module)."""
    guard = admin_guard(admin_token)

    @get("/v1/queue", guards=[guard])
    async def queue() -> QueueView:
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return queue_view(
                await repo.all_nodes(conn),
                await repo.running_allocations(conn),
                await repo.pending_jobs(conn),
                await admin_repo.queues(conn),
                await admin_repo.quotas(conn),
            )

    return Litestar(
        route_handlers=[*health_handlers, queue, admin_router(pool, guard)],
        middleware=[tracing_middleware],
        exception_handlers={
            RequestInvalid: _invalid,
            ValidationException: _litestar_invalid,
            NotFound: _not_found,
            Conflict: _conflict,
            HTTPException: _http,
            Exception: _crash,
        },
        debug=False,
    )


# --- errors ------------------------------------------------------------------------------


def _error(
    status: int,
    detail: str,
    errors: Sequence[FieldError] = (),
    headers: dict[str, str] | None = None,
) -> Response[ErrorBody]:
    return Response(
        ErrorBody(detail=detail, errors=list(errors)), status_code=status, headers=headers
    )


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


def _not_found(_: AnyRequest, exc: NotFound) -> Response[ErrorBody]:
    return _error(404, str(exc))


def _conflict(_: AnyRequest, exc: Conflict) -> Response[ErrorBody]:
    return _error(409, str(exc))


def _http(_: AnyRequest, exc: HTTPException) -> Response[ErrorBody]:
    if exc.status_code >= 500:
        log.error("HTTP %d: %s", exc.status_code, exc.detail, exc_info=exc)
        return _error(exc.status_code, "internal error")
    headers = dict(exc.headers or {})
    if exc.status_code == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return _error(exc.status_code, exc.detail, headers=headers or None)


def _crash(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error")
