"""The scheduler's HTTP app: health, readiness and the operator's queue view.

``GET /v1/queue`` shows nodes (free and used GPUs), live allocations and pending jobs with
their reason and position. It is an operator endpoint (see ``schemas``); when the
``admin_token`` setting is set it requires ``Authorization: Bearer <admin_token>``.
"""

from __future__ import annotations

import secrets
from typing import Any

import asyncpg
from litestar import Litestar, get
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.types import Guard
from pydantic import SecretStr

from services.scheduler import repository as repo
from services.scheduler.schemas import QueueView, queue_view
from shared.auth import bearer_token
from shared.http_tracing import tracing_middleware


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


def create_app(
    pool: asyncpg.Pool,
    admin_token: SecretStr | None,
    health_handlers: list[HTTPRouteHandler],
) -> Litestar:
    @get("/v1/queue", guards=[admin_guard(admin_token)])
    async def queue() -> QueueView:
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return queue_view(
                await repo.all_nodes(conn),
                await repo.running_allocations(conn),
                await repo.pending_jobs(conn),
            )

    return Litestar(route_handlers=[*health_handlers, queue], middleware=[tracing_middleware])
