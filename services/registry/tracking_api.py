"""The registry's tracking API: metrics of a job, experiments and their runs, tags and notes.

- ``GET /v1/jobs/{job_id}/metrics``: the summary of every metric of a job.
- ``GET /v1/jobs/{job_id}/metrics/{key}?max_points&from_step&to_step``: one metric's
  points; more than ``max_points`` are downsampled in SQL keeping each bucket's first, last,
  min and max (``metrics``).
- ``GET /v1/experiments?project&team&limit&after``: the caller's team's experiments (an
  operator's: every team's, or ``?team``), with run counts; a user naming another team
  (``?team``) gets 404, as for a team that does not exist.
- ``GET /v1/experiments/{id}?sort&order&filter&limit&after``: its runs, sorted or filtered
  by a metric's final or best value (``sort=best:loss``, ``filter=final:accuracy>=0.9``).

Both lists come a page at a time (``shared.paging``): at most ``limit`` (experiments: 1 to
``PAGE_MAX``, default 100; runs: 1 to ``RUNS_PAGE_MAX``, default that), and while more
follow, ``next``, the cursor to pass as ``after``. A runs cursor holds its sort: given with
another ``sort`` or ``order`` it answers 422 naming ``after``.
- ``GET /v1/experiments/{id}/compare?keys&jobs&max_points``: runs side by side; a job of
  ``jobs`` that is not a run of the experiment is a 422 naming ``jobs`` and it. A team has
  at most ``COMPARISONS_PER_TEAM`` under way at once, across every replica: one more is a
  429 with ``Retry-After``, before anything is read.
- ``PUT``/``DELETE /v1/jobs/{job_id}/tags/{tag}``, ``PUT /v1/jobs/{job_id}/note``: members.
  ``GET /v1/jobs/{job_id}/note`` answers the run's tags and note with the note's ``ETag``
  (``note_tag``), and ``PUT`` of the note is conditional on it
  (``shared.http_app.Preconditions``, judged with the run's row locked): ``If-Match:
  <ETag>`` replaces the note only while it is as it was read (412 naming what changed
  when another member edited it since); its answer carries the new ``ETag``.
  A run has at most ``MAX_RUN_TAGS`` tags: a new one past them is a 422 naming ``tag``.

A job or experiment of another team answers 404, exactly like one that does not exist.
Non-finite values are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. Invalid query
parameters answer 422 naming the parameter (the platform's rule, ``shared.http_errors``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
from litestar import Request, Response, delete, get, put
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException, NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, PathParameter, QueryParameter

from trainyard_platform.services.registry import metric_curves as curves
from trainyard_platform.services.registry import metrics
from trainyard_platform.services.registry import tracking_repository as repo
from trainyard_platform.services.registry.tracking_query import (
    check_tag,
    comma_names,
    differing,
    parse_filter,
    parse_sort,
    to_run,
)
from trainyard_platform.services.registry.tracking_repository import RunOrder
from trainyard_platform.services.registry.tracking_schemas import (
    Comparison,
    Experiment,
    ExperimentList,
    ExperimentRuns,
    JobMetricList,
    MetricCurve,
    MetricPointRead,
    MetricSummary,
    NoteBody,
    Run,
    RunAnnotations,
    RunMetric,
)
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.access import needs
from trainyard_platform.shared.http_app import (
    ETAG,
    Conditions,
    entity_tag,
    error_responses,
    json_request_body,
    tagged,
)
from trainyard_platform.shared.http_errors import RequestInvalid, parse_body, read_json_body
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.slots import Slots

Caller = NamedDependency[Principal]
MaxPoints = Annotated[
    int, QueryParameter(ge=4, le=100_000, description="downsample beyond this many points")
]
Step = Annotated[int | None, QueryParameter(ge=0, le=2**63 - 1)]
ExperimentId = Annotated[int, PathParameter(ge=1, le=2**63 - 1)]  # the column's bigint
_MAX_COMPARED = 50
COMPARE_POINTS_MAX = 100_000
"""The most points one comparison asks for, all its curves together (a curve gets
``max_points``, or its share of this when that is less; never under 4): 20 keys of 50 runs
at ``max_points`` 10,000 were 1,000 curves of up to 10,000 points each, millions of points
built in the registry's memory for one reader's request. One metric's own route answers
at most 100,000 points too."""
COMPARISONS_PER_TEAM = 2
"""Comparisons one team (the caller's; operators count as one) may have under way at once:
one of 20 keys of 50 runs takes seconds of the registry's event loop and database, so more
would let one reader keep the registry busy for every team."""
COMPARISON_RETRY_AFTER_S = 2
PAGE_MAX = 500
RUNS_PAGE_MAX = 1000
After = Annotated[str | None, QueryParameter(description="the next of the previous page")]
NOTE_BODY_MAX_BYTES = 64 * 1024


EXPERIMENTS = paging.Cursor("GET /v1/experiments", paging.optional(paging.instant), paging.integer)
RUNS = paging.Cursor(
    "GET /v1/experiments/{id} with this sort",
    paging.optional(paging.real),
    paging.instant,
    paging.text,
)
"""A page's position in one experiment's runs in one order (``of``: ``_runs_list``)."""


def _runs_list(experiment_id: int, order: RunOrder | None) -> str:
    """What names a runs list besides its route: the experiment and its sort (newest first
    when none), since a position in one order means nothing in another."""
    if order is None:
        return str(experiment_id)
    return f"{experiment_id} {order.field}:{order.key}:{'desc' if order.descending else 'asc'}"


def tracking_routes(pool: asyncpg.Pool, comparing: Slots) -> list[HTTPRouteHandler]:
    """The routes of the module docstring, over the registry's pool; ``comparing``: the
    comparisons under way, by the caller's team (``COMPARISONS_PER_TEAM``), across every
    replica (``shared.slots``; the app closes it when it stops)."""

    @asynccontextmanager
    async def comparison_of(principal: Principal) -> AsyncIterator[None]:
        team = principal.team

        def refused() -> HTTPException:
            who = "operators" if team is None else f"team {team!r}"
            return HTTPException(
                status_code=429,
                detail=f"too many comparisons at once: {who} has {COMPARISONS_PER_TEAM} "
                f"under way, the most a team may; retry after {COMPARISON_RETRY_AFTER_S} s",
                headers={"Retry-After": str(COMPARISON_RETRY_AFTER_S)},
            )

        scope = "operators" if team is None else f"team:{team}"
        async with comparing.held(scope, COMPARISONS_PER_TEAM, refused):
            yield

    async def visible_job(conn: asyncpg.Connection, job_id: str, principal: Principal) -> None:
        team = await repo.job_team(conn, job_id)
        if team is None or not principal.may_see_team(team):
            raise NotFoundException(f"no job {job_id!r} with tracked runs")

    async def visible_experiment(
        conn: asyncpg.Connection, experiment_id: int, principal: Principal
    ) -> Experiment:
        row = await repo.experiment(conn, experiment_id)
        if row is None or not principal.may_see_team(row["team"]):
            raise NotFoundException(f"no experiment {experiment_id}")
        return Experiment(**dict(row))

    async def as_runs(conn: asyncpg.Connection, rows: Sequence[Any]) -> list[Run]:
        """The rows of ``repo.runs`` as ``Run``s, with their final and best metrics."""
        by_job: dict[str, dict[str, RunMetric]] = {}
        for m in await repo.final_metrics(conn, [r["job_id"] for r in rows]):
            by_job.setdefault(m["job_id"], {})[m["key"]] = RunMetric(
                final=metrics.json_float(m["last_value"]),
                best=metrics.json_float_or_none(m["best_value"]),
                goal=m["goal"],
            )
        now = datetime.now(UTC)
        return [to_run(r, by_job, now) for r in rows]

    @get(
        "/v1/jobs/{job_id:str}/metrics",
        summary="The summary of every metric of a job",
        description="Count, first and last step, last (final) value, min, max and best "
        "(by the metric's goal) of each key. NaN and infinities are the strings "
        '"NaN", "Infinity", "-Infinity". Another team\'s job answers 404.',
        responses=error_responses(404),
    )
    async def job_metrics(job_id: FromPath[str], principal: Caller) -> JobMetricList:
        async with pool.acquire() as conn:
            await visible_job(conn, job_id, principal)
            found = await curves.series_of_job(conn, job_id)
        return JobMetricList(
            job_id=job_id, metrics=[MetricSummary.from_domain(s.key, s.summary) for s in found]
        )

    @get(
        "/v1/jobs/{job_id:str}/metrics/{key:path}",
        summary="The points of one metric of a job",
        description="In step order, between from_step and to_step (inclusive). More than "
        "max_points are downsampled: about max_points/4 buckets of equal width, each "
        "keeping its first, last, min and max point and its first NaN.",
        responses=error_responses(404),
    )
    async def metric_points(
        job_id: FromPath[str],
        key: FromPath[str],
        principal: Caller,
        max_points: MaxPoints = 1000,
        from_step: Step = None,
        to_step: Step = None,
    ) -> MetricCurve:
        key = key.lstrip("/")
        if from_step is not None and to_step is not None and to_step < from_step:
            raise RequestInvalid.one("to_step", "must not be less than from_step")
        async with pool.acquire() as conn:
            await visible_job(conn, job_id, principal)
            found = await curves.series(conn, job_id, key)
            if found is None:
                raise NotFoundException(f"job {job_id!r} reported no metric {key!r}")
            got = await curves.curve(conn, found, max_points, from_step, to_step)
        return MetricCurve(
            job_id=job_id,
            key=key,
            total=got.total,
            downsampled=got.downsampled,
            points=[MetricPointRead.from_domain(p) for p in got.points],
        )

    @get(
        "/v1/experiments",
        summary="The caller's team's experiments",
        description="With their run counts, the one with the newest run first; operators "
        "see every team's (or one: team); a user naming another team gets 404.",
        responses=error_responses(404),
    )
    async def list_experiments(
        principal: Caller,
        project: Annotated[str | None, QueryParameter(min_length=1, max_length=100)] = None,
        team: Annotated[
            str | None,
            QueryParameter(min_length=1, max_length=100, description="operators: one team"),
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)] = 100,
        after: After = None,
    ) -> ExperimentList:
        key = EXPERIMENTS.read(after)
        if not principal.is_operator:
            # Another team answers as one that does not exist (and as billing's costs do).
            if team is not None and not principal.may_see_team(team):
                raise NotFoundException(f"no experiments of team {team!r} for you to read")
            team = principal.team
        async with pool.acquire() as conn:
            fetched = await repo.experiments(conn, team, project, limit + 1, key)
        rows, more = paging.split(fetched, limit)
        last = rows[-1] if more else None
        return ExperimentList(
            experiments=[Experiment(**dict(r)) for r in rows],
            next=EXPERIMENTS.write(last["last_started_at"], last["id"]) if last else None,
        )

    @get(
        "/v1/experiments/{experiment_id:int}",
        summary="An experiment and its runs",
        description="Each run with its status, hyperparameters, labels, tags, note, "
        "duration and the final and best value of every metric; sorted (sort=best:loss, "
        "final:accuracy) or filtered (filter=final:accuracy>=0.9) by a metric.",
        responses=error_responses(404),
    )
    async def get_experiment(
        experiment_id: ExperimentId,
        principal: Caller,
        sort: Annotated[str | None, QueryParameter(description="final:<key> or best:<key>")] = None,
        order: Annotated[
            str | None,
            QueryParameter(
                pattern="^(asc|desc)$", description="default: the metric's better end first"
            ),
        ] = None,
        filter: Annotated[
            str | None, QueryParameter(description="e.g. final:accuracy>=0.9, best:loss<0.5")
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=RUNS_PAGE_MAX)] = RUNS_PAGE_MAX,
        after: After = None,
    ) -> ExperimentRuns:
        run_order, where = parse_sort(sort, order), parse_filter(filter)
        runs_list = _runs_list(experiment_id, run_order)
        key = RUNS.read(after, of=runs_list)
        async with pool.acquire() as conn:
            found = await visible_experiment(conn, experiment_id, principal)
            fetched = await repo.runs(conn, experiment_id, run_order, where, limit + 1, after=key)
            rows, more = paging.split(fetched, limit)
            shown = await as_runs(conn, rows)
        last = rows[-1] if more else None
        return ExperimentRuns(
            experiment=found,
            runs=shown,
            next=RUNS.write(last["sort_value"], last["started_at"], last["job_id"], of=runs_list)
            if last
            else None,
        )

    @get(
        "/v1/experiments/{experiment_id:int}/compare",
        summary="Runs of an experiment side by side",
        description="The hyperparameters that differ, the final metrics and a downsampled "
        "curve per run for each of keys: max_points each, or less where the curves "
        f"together would pass {COMPARE_POINTS_MAX:,} points (each gets its share).",
        responses=error_responses(404),
    )
    async def compare(
        experiment_id: ExperimentId,
        principal: Caller,
        keys: Annotated[
            str | None, QueryParameter(description="metric keys, comma-separated")
        ] = None,
        jobs: Annotated[
            str | None,
            QueryParameter(
                description=f"job ids, comma-separated (default: newest {_MAX_COMPARED})"
            ),
        ] = None,
        max_points: Annotated[int, QueryParameter(ge=4, le=10_000)] = 500,
    ) -> Comparison:
        wanted = comma_names(keys, "keys", 20) or []
        job_ids = comma_names(jobs, "jobs", _MAX_COMPARED)
        async with comparison_of(principal), pool.acquire() as conn:
            found = await visible_experiment(conn, experiment_id, principal)
            shown = await as_runs(
                conn, await repo.runs(conn, experiment_id, limit=_MAX_COMPARED, job_ids=job_ids)
            )
            strangers = [j for j in job_ids or [] if j not in {run.job_id for run in shown}]
            if strangers:  # compared silently without them, a mistyped id compared nothing
                raise RequestInvalid.one(
                    "jobs", f"not runs of experiment {experiment_id}: {', '.join(strangers)}"
                )
            reported = [
                (key, run.job_id, series)
                for key in wanted
                for run in shown
                if (series := await curves.series(conn, run.job_id, key)) is not None
            ]
            # Every curve its share of the comparison's points (COMPARE_POINTS_MAX).
            each = max(4, min(max_points, COMPARE_POINTS_MAX // max(1, len(reported))))
            drawn: dict[str, dict[str, MetricCurve]] = {}
            for key, job_id, series in reported:
                got = await curves.curve(conn, series, each)
                drawn.setdefault(key, {})[job_id] = MetricCurve(
                    job_id=job_id,
                    key=key,
                    total=got.total,
                    downsampled=got.downsampled,
                    points=[MetricPointRead.from_domain(p) for p in got.points],
                )
        return Comparison(
            experiment=found,
            runs=shown,
            differing_parameters=differing(shown),
            final={
                key: {r.job_id: (r.metrics[key].final if key in r.metrics else None) for r in shown}
                for key in wanted or sorted({k for r in shown for k in r.metrics})
            },
            curves=drawn,
        )

    @put(
        "/v1/jobs/{job_id:str}/tags/{tag:str}",
        summary="Tag a run (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        responses=error_responses(404, 422),
    )
    async def put_tag(
        job_id: FromPath[str], tag: FromPath[str], principal: Caller
    ) -> RunAnnotations:
        async def add(conn: asyncpg.Connection) -> bool:
            try:
                return await repo.add_tag(conn, job_id, tag, datetime.now(UTC))
            except repo.TooManyTags:
                raise RequestInvalid.one(
                    "tag",
                    f"run {job_id} has {repo.MAX_RUN_TAGS} tags, the most a run may have: "
                    "remove one first",
                ) from None

        return await retag(job_id, tag, principal, add, "tag run")

    @delete(
        "/v1/jobs/{job_id:str}/tags/{tag:str}",
        summary="Untag a run (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        responses=error_responses(404),
    )
    async def delete_tag(
        job_id: FromPath[str], tag: FromPath[str], principal: Caller
    ) -> RunAnnotations:
        async def remove(conn: asyncpg.Connection) -> bool:
            return await repo.remove_tag(conn, job_id, tag)

        return await retag(job_id, tag, principal, remove, "untag run")

    async def retag(
        job_id: str,
        tag: str,
        principal: Principal,
        change: Callable[[asyncpg.Connection], Awaitable[bool]],
        action: str,
    ) -> RunAnnotations:
        """Apply ``change`` to a run the caller may see; audit it when it changed something
        and the caller's writes are audited; answer the run's tags and note."""
        check_tag(tag)
        async with pool.acquire() as conn, conn.transaction():
            await visible_job(conn, job_id, principal)
            if await change(conn) and audit.must_record(principal):
                await audit.record(conn, principal, action, job_id, {"tag": tag})
            tags, note = await repo.tags_and_note(conn, job_id)
        return RunAnnotations(job_id=job_id, tags=tags, note=note)

    @get("/v1/jobs/{job_id:str}/note", response_headers=[ETAG], responses=error_responses(404))
    async def get_note(job_id: FromPath[str], principal: Caller) -> Response[RunAnnotations]:
        """The run's tags and note, with the note's ``ETag`` (for ``If-Match`` on ``PUT``)."""
        async with pool.acquire() as conn:
            await visible_job(conn, job_id, principal)
            tags, note = await repo.tags_and_note(conn, job_id)
        return tagged(RunAnnotations(job_id=job_id, tags=tags, note=note), note_tag(note))

    @put(
        "/v1/jobs/{job_id:str}/note",
        summary="Replace a run's note (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        operation_class=json_request_body(NoteBody),
        responses=error_responses(404, 412, 413, 415),
    )
    async def put_note(
        job_id: FromPath[str],
        request: Request[Any, Any, Any],
        principal: Caller,
        conditions: Conditions,
    ) -> Response[RunAnnotations]:
        """Replace the run's note; with ``If-Match: <ETag>`` (of ``GET``) only while it is
        as it was read; nothing changed on a 412."""
        # Read by hand, as every JSON body of the platform: bounded, screened (a note may
        # hold tabs and newlines, nothing else of control characters), then validated.
        raw = await read_json_body(request, NOTE_BODY_MAX_BYTES, lambda path: path == "note")
        data = parse_body(NoteBody, raw)
        async with pool.acquire() as conn, conn.transaction():
            await visible_job(conn, job_id, principal)
            current = await repo.note_to_change(conn, job_id)
            conditions.check(f"the note of run {job_id}", note_tag(current))
            await repo.set_note(conn, job_id, data.note)
            if audit.must_record(principal):
                await audit.record(conn, principal, "note run", job_id, {"note": data.note})
            tags, note = await repo.tags_and_note(conn, job_id)
        return tagged(RunAnnotations(job_id=job_id, tags=tags, note=note), note_tag(note))

    return [
        job_metrics,
        metric_points,
        list_experiments,
        get_experiment,
        compare,
        put_tag,
        delete_tag,
        get_note,
        put_note,
    ]


def note_tag(note: str) -> str:
    """The ETag of a run's note."""
    return entity_tag({"note": note})
