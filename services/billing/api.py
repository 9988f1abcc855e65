"""Billing's HTTP app: health, readiness and the operator's usage summary.

``GET /v1/usage?team=<team>`` sums GPU-seconds and cost per team, per user and per job (all
teams without ``team``). It is an operator endpoint (see ``schemas``): like every route but the probes it requires
``Authorization: Bearer <admin_token>`` (``shared.operator_auth``).
"""

from __future__ import annotations

from typing import Annotated

import asyncpg
from litestar import Litestar, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import QueryParameter
from pydantic import SecretStr

from services.billing import repository as repo
from services.billing.schemas import UsageSummary, usage_summary
from shared.http_tracing import tracing_middleware
from shared.operator_auth import admin_guard


def create_app(
    pool: asyncpg.Pool,
    admin_token: SecretStr,
    health_handlers: list[HTTPRouteHandler],
) -> Litestar:
    @get("/v1/usage")
    async def usage(
        team: Annotated[str | None, QueryParameter(description="only this team")] = None,
    ) -> UsageSummary:
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return usage_summary(
                team,
                await repo.usage_by_team(conn, team),
                await repo.usage_by_user(conn, team),
                await repo.usage_by_job(conn, team),
            )

    return Litestar(
        route_handlers=[*health_handlers, usage],
        guards=[admin_guard(admin_token)],
        middleware=[tracing_middleware],
    )
