"""Billing's waste API: ``GET /v1/waste``.

``GET /v1/waste?group_by&from&to&team&project&user&queue&flavor&job&format&limit``: the
waste figures (``services.billing.waste``) in money and GPU-seconds over a time range
(default: the current UTC month), grouped and filtered by the dimensions of
``GET /v1/costs``, with unattributed spend and the job success rate per day, team and
queue. JSON, or the rows as CSV with ``Accept: text/csv`` or ``format=csv``.

Scope: a user (viewer and up) reads only their own team's figures (another team answers
404); operators read every team's, and the unallocated GPUs, which belong to no team. Any
query parameter not listed, or given twice, answers 422 naming it; a bad value answers 422
naming the field and the reason; a range covers at most ``WASTE_MAX_RANGE`` (93 days).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec

from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing import costs_repository
from trainyard_platform.services.billing import waste_repository as repo
from trainyard_platform.services.billing import waste_rollups as rollups
from trainyard_platform.services.billing.buckets import floor
from trainyard_platform.services.billing.costs import WASTE_MAX_RANGE, CostQuery
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
from trainyard_platform.services.billing.waste import (
    Piece,
    allocation_pieces,
    holding_pieces,
    queueing_pieces,
    success_lines,
)
from trainyard_platform.services.billing.waste_schemas import WasteReport, waste_csv, waste_report
from trainyard_platform.shared.http_app import error_responses


def waste_routes(
    pool: asyncpg.Pool, currency: str = "USD", clock: Clock = utc_now
) -> list[HTTPRouteHandler]:
    """The route of the module docstring, over billing's pool."""

    @get(
        "/v1/waste",
        responses={
            200: ResponseSpec(
                WasteReport,
                description="the report (its rows as text/csv with Accept: text/csv or format=csv)",
                generate_examples=False,
            ),
            **error_responses(404, 422),
        },
        operation_class=JsonOrCsvOperation,
    )
    async def waste(
        request: Request[Any, Any, Any],
        principal: Caller,
        group_by: GroupBy = None,
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
        check_parameters(request, REPORT_PARAMETERS)
        team = team_to_read(principal, team, "waste")
        filters = dimension_filters(team, project, user, queue, flavor, job)
        now = clock()
        query = CostQuery.parse(
            start=start,
            end=end,
            granularity=None,
            group_by=group_by,
            filters=filters,
            now=now,
            longest=WASTE_MAX_RANGE,
        )
        # Figure 6 from the rollups (fast; the ledger when filtered by job), by every owner
        # they hold; the job is the ledger's own column, checked apart (an empty job id).
        owners = CostQuery(query.start, query.end, None, ("team", "project", "user"), query.filters)
        jobless = CostQuery(
            query.start, query.end, None, ("team", "project", "user"), {**query.filters, "job": ""}
        )
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            book = await catalogue.schedule(conn)
            by_job = "job" in query.group_by or "job" in query.filters
            held, jobs = await repo.facts(conn, query.start, query.end, team, measured=by_job)
            spare = (
                await repo.unallocated(conn, query.start, query.end)
                if principal.is_operator
                else []
            )
            ledger = await costs_repository.report(conn, owners)
            unowned = (
                []
                if query.filters.get("job")
                else await costs_repository.from_ledger(conn, jobless)
            )
            ends = await repo.job_ends(conn, query.start, query.end, team)
            # The allocation figures from the rollups up to the current hour; the hours
            # from it on (and any report by job) from the facts.
            since = max(query.start, min(query.end, floor(now, "hour")))
            rolled = None if by_job else await rollups.read(conn, query, since, book)
            measured = (
                held
                if by_job
                else (await repo.facts(conn, since, query.end, team))[0]
                if since < query.end
                else []
            )
        own = [p for a in measured for p in allocation_pieces(a)]
        pieces: list[Piece] = own if rolled is None else []
        pieces += [p for j in jobs for p in queueing_pieces(j, now)]
        pieces += holding_pieces(held, jobs, now)
        success = success_lines(
            e for e in ends if all(e.owner.value(d) == v for d, v in query.filters.items())
        )
        report = waste_report(
            query,
            pieces=pieces,
            unallocated=spare,
            ledger=ledger,
            jobless=unowned,
            success=success,
            book=book,
            currency=currency,
            now=now,
            limit=limit,
            rolled=rolled,
            edge=own if rolled is not None else (),
            since=since,
        )
        if wants_csv(request, format):
            return csv_answer(waste_csv(report), report.truncated)
        return Response(report)

    return [waste]
