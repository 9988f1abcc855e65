"""Billing's cost API: ``GET /v1/costs`` and ``GET /v1/jobs/{job_id}/cost``.

- ``GET /v1/costs?group_by&granularity&from&to&team&project&user&queue&flavor&job&format
  &limit``: cost and GPU-seconds over a time range (default: the current UTC month),
  grouped by any of the dimensions, filtered by any of them, per hour, day or month or
  over the whole range. JSON, or CSV with ``Accept: text/csv`` or ``format=csv``.
- ``GET /v1/jobs/{job_id}/cost``: a job's cost per allocation (attempt and node), 404 when
  nothing of it is billed yet. It takes no query parameter.

Scope: a user (viewer and up) reads only their own team's costs: a report is filtered to
their team, and asking for another team (``team=...``) answers 404, like another team's
job. Operators read every team's. Any query parameter not listed above, or given twice,
answers 422 naming it; a bad value answers 422 naming the field and the reason.
"""

from __future__ import annotations

from typing import Annotated, Any

import asyncpg
from litestar import Request, Response, get
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import PathParameter, QueryParameter

from trainyard_platform.services.billing import costs_repository as repo
from trainyard_platform.services.billing.costs import CostQuery, Granularity
from trainyard_platform.services.billing.costs_schemas import (
    CostReport,
    JobCost,
    cost_report,
    csv_text,
    job_cost,
)
from trainyard_platform.services.billing.report_api import (
    REPORT_PARAMETERS,
    Caller,
    Clock,
    Format,
    From,
    GroupBy,
    JsonOrCsvOperation,
    Name,
    Rows,
    To,
    check_parameters,
    csv_answer,
    dimension_filters,
    team_to_read,
    utc_now,
    wants_csv,
)
from trainyard_platform.shared.http_app import error_responses


def cost_routes(pool: asyncpg.Pool, clock: Clock = utc_now) -> list[HTTPRouteHandler]:
    """The routes of the module docstring, over billing's pool."""

    @get(
        "/v1/costs",
        responses={
            200: ResponseSpec(
                CostReport,
                description="the report (as text/csv with Accept: text/csv or format=csv)",
                generate_examples=False,
            ),
            **error_responses(404, 422),
        },
        operation_class=JsonOrCsvOperation,
    )
    async def costs(
        request: Request[Any, Any, Any],
        principal: Caller,
        group_by: GroupBy = None,
        granularity: Annotated[
            Granularity | None, QueryParameter(description="UTC buckets; none: the whole range")
        ] = None,
        start: From = None,
        end: To = None,
        team: Name = None,
        project: Name = None,
        user: Name = None,
        queue: Name = None,
        flavor: Name = None,
        job: Name = None,
        format: Format = None,
        limit: Rows = 10_000,
    ) -> Response[Any]:
        check_parameters(request, REPORT_PARAMETERS | {"granularity"})
        team = team_to_read(principal, team, "costs")
        filters = dimension_filters(team, project, user, queue, flavor, job)
        query = CostQuery.parse(
            start=start,
            end=end,
            granularity=granularity,
            group_by=group_by,
            filters=filters,
            now=clock(),
        )
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            report = cost_report(query, await repo.report(conn, query), limit)
        if wants_csv(request, format):
            return csv_answer(csv_text(report), report.truncated)
        return Response(report)

    @get("/v1/jobs/{job_id:str}/cost", responses=error_responses(404, 422))
    async def cost_of_job(
        request: Request[Any, Any, Any],
        principal: Caller,
        job_id: Annotated[str, PathParameter(min_length=1, max_length=200)],
    ) -> JobCost:
        check_parameters(request, frozenset())
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            entries = await repo.job_entries(conn, job_id)
        if not entries or not principal.may_see_team(entries[0].team):
            raise NotFoundException(
                f"no billed cost of job {job_id!r} yet: an allocation is billed when it "
                "ends, so a job on its first attempt has none"
            )
        return job_cost(job_id, entries)

    return [costs, cost_of_job]
