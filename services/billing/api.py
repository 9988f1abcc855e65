"""Billing's HTTP app: health, readiness, costs, usage and the audit log.

``GET /v1/costs`` and ``GET /v1/jobs/{job_id}/cost`` are the cost reports
(``services.billing.costs_api``); the price book, the cost estimate and budgets are
``services.billing.governance_api``; ``GET /v1/waste``, the waste figures and the job
success rate, is ``services.billing.waste_api``. ``GET /v1/usage?team=<team>``, the older
summary, sums every allocation's current bill per team, per user and per job, over all
time; the per-job rows come a page at a time (``limit``, at most ``USAGE_PAGE_MAX``, and
``after``, the ``next`` of the previous page: ``shared.paging``); any other query parameter
answers 422 naming it.
Users (viewer and up) read their own team's usage: without ``team`` they get their team's,
and another team answers 404. Operators read any team's, or every team's without ``team``.
``GET /v1/audit`` is for operators. Authentication is the shared guard (``shared.access``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import asyncpg
from litestar import Litestar, Request, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import QueryParameter
from litestar.types import Guard

from trainyard_platform.services.billing import repository as repo
from trainyard_platform.services.billing.costs_api import cost_routes
from trainyard_platform.services.billing.governance_api import governance_routes
from trainyard_platform.services.billing.report_api import Caller, check_parameters, team_to_read
from trainyard_platform.services.billing.schemas import UsageSummary, usage_summary
from trainyard_platform.services.billing.waste_api import waste_routes
from trainyard_platform.shared import paging
from trainyard_platform.shared.audit import audit_route
from trainyard_platform.shared.http_app import error_responses, service_app

USAGE_PAGE_MAX = 500
"""The most per-job rows one ``GET /v1/usage`` answers (default 100)."""
USAGE = paging.Cursor(
    "GET /v1/usage",
    paging.text,
    paging.text,
    paging.instant,
    paging.text,
    paging.text,
    paging.text,
)
"""A page's position in the per-job usage: ``repo.JOB_USAGE_KEY`` of its last row."""


def create_app(
    pool: asyncpg.Pool,
    guard: Guard,
    health_handlers: list[HTTPRouteHandler],
    cors_origins: Sequence[str] = (),
    currency: str = "USD",
) -> Litestar:
    """Billing's HTTP app."""

    @get("/v1/usage", responses=error_responses(404, 422))
    async def usage(
        request: Request[Any, Any, Any],
        principal: Caller,
        team: Annotated[
            str | None, QueryParameter(description="only this team", max_length=100)
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=USAGE_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
    ) -> UsageSummary:
        check_parameters(request, frozenset({"team", "limit", "after"}))
        key = USAGE.read(after)
        team = team_to_read(principal, team, "usage")
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            jobs, more = paging.split(await repo.usage_by_job(conn, team, limit + 1, key), limit)
            return usage_summary(
                team,
                await repo.usage_by_team(conn, team),
                await repo.usage_by_user(conn, team),
                jobs,
                USAGE.write(*(jobs[-1][c] for c in repo.JOB_USAGE_KEY)) if more else None,
            )

    return service_app(
        "billing",
        [
            *health_handlers,
            usage,
            *cost_routes(pool),
            *governance_routes(pool, currency),
            *waste_routes(pool, currency),
            audit_route(pool, "billing"),
        ],
        guard,
        cors_origins=cors_origins,
    )
