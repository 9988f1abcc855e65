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

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import asyncpg
from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, OpenAPIType, Operation, Schema
from litestar.params import PathParameter, QueryParameter

from trainyard_platform.services.billing import costs_repository as repo
from trainyard_platform.services.billing.costs import CostQuery, Dimension, Granularity
from trainyard_platform.services.billing.costs_schemas import (
    CostReport,
    JobCost,
    cost_report,
    csv_text,
    job_cost,
)
from trainyard_platform.shared.http_app import error_responses
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid
from trainyard_platform.shared.identity import Principal

Caller = NamedDependency[Principal]
Name = Annotated[str | None, QueryParameter(min_length=1, max_length=200)]
QUERY_PARAMETERS = frozenset(
    {
        "group_by",
        "granularity",
        "from",
        "to",
        "team",
        "project",
        "user",
        "queue",
        "flavor",
        "job",
        "format",
        "limit",
    }
)
MAX_ROWS = 100_000
Clock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def check_parameters(
    request: Request[Any, Any, Any], known: frozenset[str] = QUERY_PARAMETERS
) -> None:
    """422 naming every query parameter not in ``known`` or given more than once."""
    errors = []
    for name in sorted(set(request.query_params.keys())):
        if name not in known:
            listed = f" ({', '.join(sorted(known))})" if known else " (this takes none)"
            errors.append(FieldError(field=name, message=f"unknown query parameter{listed}"))
        elif len(request.query_params.getall(name)) > 1:
            errors.append(FieldError(field=name, message="given more than once"))
    if errors:
        raise RequestInvalid(errors)


def wants_csv(request: Request[Any, Any, Any], fmt: str | None) -> bool:
    if fmt is not None:
        return fmt == "csv"
    accept = request.headers.get("accept", "")
    return "text/csv" in accept and "application/json" not in accept


@dataclass
class JsonOrCsvOperation(Operation):
    """The report's operation: its 200 answer is JSON or, when asked for, ``text/csv``."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse) and ok.content is not None:
            ok.content["text/csv"] = OpenAPIMediaType(
                schema=Schema(
                    type=OpenAPIType.STRING,
                    description="a header row, then one row per report row (docs/billing.md)",
                )
            )


def cost_routes(pool: asyncpg.Pool, clock: Clock = _utc_now) -> list[HTTPRouteHandler]:
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
        group_by: Annotated[
            str | None,
            QueryParameter(
                max_length=100,
                description="comma-separated: team, project, user, queue, flavor, job",
            ),
        ] = None,
        granularity: Annotated[
            Granularity | None, QueryParameter(description="UTC buckets; none: the whole range")
        ] = None,
        start: Annotated[
            str | None,
            QueryParameter(
                name="from",
                format="date-time",
                max_length=40,
                description="ISO 8601, a whole UTC hour; default: the current month's start",
            ),
        ] = None,
        end: Annotated[
            str | None,
            QueryParameter(
                name="to",
                format="date-time",
                max_length=40,
                description="ISO 8601, a whole UTC hour; default: the end of from's month",
            ),
        ] = None,
        team: Name = None,
        project: Name = None,
        user: Name = None,
        queue: Name = None,
        flavor: Name = None,
        job: Name = None,
        format: Annotated[
            Literal["json", "csv"] | None, QueryParameter(description="default: by Accept")
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_ROWS)] = 10_000,
    ) -> Response[Any]:
        check_parameters(request)
        if not principal.is_operator:
            team = team or principal.team
            if team is None or not principal.may_see_team(team):
                raise NotFoundException(f"no costs of team {team!r} for you to read")
        filters: dict[Dimension, str | None] = {
            "team": team,
            "project": project,
            "user": user,
            "queue": queue,
            "flavor": flavor,
            "job": job,
        }
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
            return Response(csv_text(report), media_type="text/csv")
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
            raise NotFoundException(f"no billed cost of job {job_id!r}")
        return job_cost(job_id, entries)

    return [costs, cost_of_job]
