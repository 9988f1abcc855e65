"""Billing's price book, cost estimate and budget routes.

- ``GET /v1/prices[?flavor=&limit=&after=]`` (any user): the prices of the book (per
  GPU-hour, per CPU-hour, per GiB-hour of memory), dated, a page at a time
  (``shared.paging``: ``limit`` 1 to ``PRICES_PAGE_MAX``, default 100, the next page in the
  ``Link`` header).
  ``GET /v1/prices/{flavor}`` (any user): every price of the flavor's book, with its
  ``ETag`` (``price_tag``: of the prices, not of which is in force now); 404 when it has
  none. ``PUT /v1/prices/{flavor}`` (operators): new prices (any of the three, at least
  one), conditional (``shared.http_app.Preconditions``, judged under the flavor's prices'
  lock): ``If-Match: <that ETag>`` proceeds only while its book is as it was read (412
  naming what changed when another operator priced it since), ``If-None-Match: *`` only
  for its first price, ``If-Match: *`` only when it has one; its answer carries the new
  ``ETag``. From
  ``effective_from`` (default: now as the change is made, under the flavor's prices' lock,
  after every bill being made by them has committed, or the latest end of the flavor's
  usage billed already when that is later; a time before either is refused: usage already
  made or billed keeps its price, so the ledger never disagrees with the book). A flavor's first
  price, without ``effective_from``, applies from the beginning (nothing of it was billed). The flavor must be in
  the scheduler's catalogue as billing learned it (``flavor.declared``), or priced already
  (the settings' bootstrap); else 422 naming ``flavor``. The book holds at most
  ``MAX_PRICED_FLAVORS`` flavors with a GPU price (each budget that reserves says the
  rates of every one in its ``budget.updated``): a new flavor's first GPU price past them
  is 422 naming ``flavor``; any price set while a budget reserves, under a book priced
  past them before the bound (``budget_watch.BookTooLarge``), is 409 naming ``flavor``,
  the book's size and what to do, and nothing is kept.
- ``POST /v1/costs/estimate`` (any user): what a job spec costs at most, from its GPUs,
  flavor, maximum runtime and restarts and the prices in force (422 naming ``gpu_flavor``
  when it has no price).
- ``GET /v1/budgets?team&limit&after`` (users: their team's; operators: every team's, or
  ``?team=``; a page at a time, ``shared.paging``, the next page in the ``Link`` header),
  ``GET|PUT|PATCH|DELETE /v1/budgets/{team}`` and ``/v1/budgets/{team}/{project}``: reads
  for the team's users, writes for its admins and operators. Another team's answers 404.
  ``PUT`` creates (201) or replaces (200) the whole budget, what its body leaves out taking
  its default; ``PATCH`` (a JSON Merge Patch of the ``PUT`` body) changes only the fields
  it names, read and written under the budget's lock, so two admins changing different
  fields at once both keep their change (404 when there is none: a patch never creates).
  ``PUT``, ``PATCH`` and ``DELETE`` are conditional (``shared.http_app.Preconditions``,
  judged under the budget's lock): the ``GET`` of a budget, and the answer of its ``PUT``
  or ``PATCH``, carries ``ETag`` (``budget_tag``: of what a write sets, not of the
  spending); ``If-Match: <that ETag>`` proceeds only while the budget is as it was read
  (412 naming what changed), ``If-None-Match: *`` only when there is no budget (412 when
  there is: a ``PUT`` only creates), ``If-Match: *`` only when there is one (412 for a
  ``PUT`` when there is none; a ``PATCH`` or ``DELETE`` of none is 404 as ever). A change
  says the budget's state (``budget.updated``) and any threshold the month's spending has
  reached already (``budget.threshold_crossed``), through the outbox; a budget that
  reserves under a book past ``MAX_PRICED_FLAVORS`` (``budget_watch.BookTooLarge``) cannot
  be said: its ``PUT`` or ``PATCH`` is 409 naming ``policy``, the book's size and what to
  do, and nothing is kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from typing import Annotated, Any

import asyncpg
from litestar import Request, Response, delete, get, patch, post, put
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import PathParameter, QueryParameter

from trainyard_platform.services.billing import budget_watch
from trainyard_platform.services.billing import budgets_repository as budgets_repo
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing.budgets import (
    Budget,
    BudgetRequest,
    forecast,
    month_label,
    month_start,
    request_of,
)
from trainyard_platform.services.billing.domain import UnknownFlavor
from trainyard_platform.services.billing.governance_schemas import (
    BudgetView,
    Estimate,
    EstimateRequest,
    PriceRequest,
    PriceView,
)
from trainyard_platform.services.billing.prices import BEGINNING, RESOURCES
from trainyard_platform.services.billing.report_api import (
    Caller,
    Clock,
    check_parameters,
    team_to_read,
    utc_now,
)
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.access import Teams, needs, only_reads
from trainyard_platform.shared.events.payloads import MAX_PRICED_FLAVORS
from trainyard_platform.shared.http_app import (
    ETAG,
    Conditions,
    Preconditions,
    entity_tag,
    error_responses,
    json_request_body,
    merge_patch_request_body,
    patched,
    read_merge_patch,
    tagged,
)
from trainyard_platform.shared.http_errors import (
    Conflicting,
    RequestInvalid,
    parse_body,
    read_json_body,
)
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.worst_case import attempt_seconds

PRICE_FIELD = {
    "gpu": "price_per_gpu_hour",
    "cpu": "price_per_cpu_hour",
    "memory": "price_per_memory_gib_hour",
}
"""The request's and the view's field of each resource's price."""
PRICE_FIELDS = tuple(PRICE_FIELD.values())

TeamCheck = NamedDependency[Teams]
AnyRequest = Request[Any, Any, Any]
BODY_MAX_BYTES = 64 * 1024
"""A job spec is read as an estimate's body: the largest a spec file may reasonably be."""
BUDGETS_PAGE_MAX = 500
PRICES_PAGE_MAX = 500
BUDGETS = paging.Cursor("GET /v1/budgets", paging.text, paging.str_or_empty)
PRICES = paging.Cursor("GET /v1/prices", paging.text, paging.instant, paging.integer)
"""The most rows of a page of ``GET /v1/budgets`` and ``GET /v1/prices``."""
FLAVOR = r"^[a-z0-9][a-z0-9-]{0,39}$"
TEAM = r"^[A-Za-z0-9_-]{1,100}$"
"""A team with a budget: no dot, since the team is the routing key of budget events (a NATS
subject token)."""
NAME = r"^[A-Za-z0-9._-]{1,100}$"
TeamPath = Annotated[str, PathParameter(pattern=TEAM, min_length=1, max_length=100)]
ProjectPath = Annotated[str, PathParameter(pattern=NAME, min_length=1, max_length=100)]


async def _body(model: type[Any], request: AnyRequest) -> Any:
    body = await read_json_body(request, BODY_MAX_BYTES, free_text=lambda path: True)
    return parse_body(model, body)


async def _room_for_a_flavor(conn: asyncpg.Connection, flavor: str) -> None:
    """Refuse the first GPU price of ``flavor`` (422 naming ``flavor``) when the book has
    ``MAX_PRICED_FLAVORS`` flavors priced already: every budget that reserves says the rates
    of each in its ``budget.updated``, which holds no more (nor would the bus carry many
    more), so one more would leave every such budget unsaid (``budget_watch.BookTooLarge``)."""
    await catalogue.lock_new_flavors(conn)
    if await catalogue.priced_flavors(conn) >= MAX_PRICED_FLAVORS:
        raise RequestInvalid.one(
            "flavor",
            f"cannot price flavor {flavor}: the price book has {MAX_PRICED_FLAVORS} flavors "
            "priced already, the most it holds (each budget that reserves says the rates of "
            "every one in one event)",
        )


def _book_too_large(exc: budget_watch.BookTooLarge, field: str) -> Conflicting:
    """The 409 of a change whose budget state cannot be said (a budget that reserves, under
    a book priced past ``MAX_PRICED_FLAVORS`` before the bound): naming ``field`` (a
    budget's ``policy``, which may reserve no more; a price's ``flavor``), the book's size
    and what to do. The transaction is rolled back: nothing of the change is kept."""
    return Conflicting(f"{field}: {exc}", field=field, message=str(exc))


def price_tag(rows: list[Any]) -> str | None:
    """The ETag of a flavor's prices (rows of ``catalogue.price_book_page``; none: None):
    of each price, its date and who set it, not of which is in force now."""
    if not rows:
        return None
    fields = ("resource", "effective_from", "price", "currency", "set_by")
    return entity_tag({"prices": [{f: str(r[f]) for f in fields} for r in rows]})


def price_view(r: Any) -> PriceView:
    """A row of ``catalogue.price_book_page`` as the answer shows it."""
    return PriceView(
        flavor=r["flavor"],
        effective_from=r["effective_from"],
        currency=r["currency"],
        set_by=r["set_by"],
        in_force=r["in_force"],
        **{"price_per_gpu_hour": None, PRICE_FIELD[r["resource"]]: r["price"]},
    )


def budget_tag(budget: Budget | None) -> str | None:
    """The ETag of ``budget`` (None: there is none): of what a write of it sets, its amount
    as a number (so ``2000`` and ``2000.000000`` are one), never of its spending."""
    if budget is None:
        return None
    return entity_tag(
        {
            **request_of(budget),
            "amount": f"{budget.amount.normalize():f}",
            "currency": budget.currency,
        }
    )


def budget_view(budget: Budget, spent: Decimal, now: datetime) -> BudgetView:
    runs_out = forecast(budget.amount, spent, now)
    exhausted = spent >= budget.amount
    if exhausted:
        said = "spent: the budget ran out this month"
    elif runs_out is not None:
        said = f"at this rate the budget runs out on {runs_out.date().isoformat()}"
    elif spent > 0:
        said = "at this rate the budget lasts the month"
    else:
        said = "nothing spent this month"
    return BudgetView(
        team=budget.team,
        project=budget.project,
        amount=budget.amount,
        currency=budget.currency,
        thresholds=list(budget.thresholds),
        policy=budget.policy,
        on_exhausted=budget.on_exhausted,
        month=month_label(month_start(now)),
        spent=spent,
        remaining=max(budget.amount - spent, Decimal(0)),
        # Cut, never rounded up: 100.00 only once spent, and a threshold's percent only
        # once it is crossed (``budgets.reached``), as the state beside it says.
        percent_spent=(spent * 100 / budget.amount).quantize(Decimal("0.01"), ROUND_DOWN),
        exhausted=exhausted,
        runs_out_at=runs_out,
        forecast=said,
        updated_by=budget.updated_by,
        updated_at=budget.updated_at,
    )


def governance_routes(
    pool: asyncpg.Pool, currency: str, clock: Clock = utc_now
) -> list[HTTPRouteHandler]:
    """The routes of the module docstring, over billing's pool, in ``currency``."""

    @get("/v1/prices", responses=error_responses(422))
    async def list_prices(
        request: AnyRequest,
        flavor: Annotated[str | None, QueryParameter(min_length=1, max_length=100)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=PRICES_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[PriceView]]:
        """A page of the price book by flavor, date and resource (GPU, CPU, memory); the
        next in ``Link: <...>; rel="next"`` (``shared.paging``): every price change adds a
        row, so the book grows without bound."""
        check_parameters(request, frozenset({"flavor", "limit", "after"}))
        key = PRICES.read(after)
        async with pool.acquire() as conn:
            fetched = await catalogue.price_book_page(
                conn, flavor, clock(), limit + 1, (key[0], key[1], key[2]) if key else None
            )
        rows, more = paging.split(fetched, limit)
        views = [price_view(r) for r in rows]
        last = rows[-1] if more else None
        cursor = (
            PRICES.write(last["flavor"], last["effective_from"], last["rank"]) if last else None
        )
        query = {**({"flavor": flavor} if flavor else {}), "limit": str(limit)}
        return paging.listed(views, "/v1/prices", query, cursor)

    @get("/v1/prices/{flavor:str}", response_headers=[ETAG], responses=error_responses(404))
    async def get_prices(
        flavor: Annotated[str, PathParameter(pattern=FLAVOR, min_length=1, max_length=40)],
    ) -> Response[list[PriceView]]:
        """Every price of the flavor's book, by date and resource, with its ``ETag`` (for
        ``If-Match`` on ``PUT /v1/prices/{flavor}``); 404 when it has none."""
        async with pool.acquire() as conn:
            rows = await catalogue.price_book_page(conn, flavor, clock(), None, None)
        tag = price_tag(rows)
        if tag is None:
            raise NotFoundException(f"flavor {flavor} has no price")
        return tagged([price_view(r) for r in rows], tag)

    @put(
        "/v1/prices/{flavor:str}",
        opt=needs(Role.OPERATOR),
        operation_class=json_request_body(PriceRequest, example={"price_per_gpu_hour": "2.75"}),
        responses={
            201: ResponseSpec(PriceView, description="created", generate_examples=False),
            **error_responses(409, 412, 413, 415, 422),
        },
    )
    async def put_price(
        flavor: Annotated[str, PathParameter(pattern=FLAVOR, min_length=1, max_length=40)],
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[PriceView]:
        """New prices of the flavor; with ``If-Match: <ETag>`` (of ``GET
        /v1/prices/{flavor}``) only while its prices are as they were read, with
        ``If-None-Match: *`` only its first, with ``If-Match: *`` only when it has one;
        nothing changed on a 412."""
        body: PriceRequest = await _body(PriceRequest, request)
        prices = body.model_dump(include=set(PRICE_FIELDS), exclude_none=True)
        if not prices:
            raise RequestInvalid.one(
                "price_per_gpu_hour", f"give at least one of {', '.join(PRICE_FIELDS)}"
            )
        async with pool.acquire() as conn, conn.transaction():
            # Under the lock, once every bill made by the flavor's current prices has
            # committed (``catalogue.hold_prices``), and before any other is made: the
            # change's time is taken then, never when the request came, so no bill
            # committed before the change holds time the change reprices.
            await catalogue.lock_prices(conn, flavor)
            now = clock()
            billed = await catalogue.billed_until(conn, flavor, now)
            effective = body.effective_from or billed or now  # in UTC (``UtcInstant``)
            if effective < now:
                raise RequestInvalid.one(
                    "effective_from",
                    f"must not be in the past (now {now.isoformat()}): usage already made "
                    "keeps its price",
                )
            if billed is not None and effective < billed:
                raise RequestInvalid.one(
                    "effective_from",
                    f"must not be before {billed.isoformat()}: usage of flavor {flavor} up "
                    "to then is billed already and keeps its price",
                )
            book = await catalogue.price_book_page(conn, flavor, now, None, None)
            conditions.check(f"the prices of flavor {flavor}", price_tag(book))
            known = await catalogue.flavor(conn, flavor)
            priced = await catalogue.price_rows(conn, flavor)
            if (known is None or known["retired"]) and not priced:
                raise RequestInvalid.one(
                    "flavor",
                    f"unknown flavor {flavor}; an operator declares it first with "
                    f"PUT /v1/admin/flavors/{flavor} on the scheduler",
                )
            if not priced and body.price_per_gpu_hour is not None:
                await _room_for_a_flavor(conn, flavor)
            if not priced and body.effective_from is None:
                # Nothing of the flavor was billed yet: its first price covers all its
                # usage, so releases dead-lettered for want of a price can be redriven.
                effective = BEGINNING
            created = False
            if body.price_per_gpu_hour is not None:
                created |= await catalogue.set_price(
                    conn, flavor, effective, body.price_per_gpu_hour, currency, principal.user, now
                )
            for resource in RESOURCES:
                price = getattr(body, PRICE_FIELD[resource])
                if price is not None:
                    created |= await catalogue.set_resource_price(
                        conn, flavor, resource, effective, price, currency, principal.user, now
                    )
            detail = {
                **{f: str(v) for f, v in prices.items()},
                "effective_from": effective.isoformat(),
            }
            await audit.record(conn, principal, "put price", flavor, detail)
            # The scheduler reserves jobs at the book's highest prices from now on: each
            # budget it reserves against is said again with the changed book.
            try:
                await budget_watch.reserving(conn, now)
            except budget_watch.BookTooLarge as exc:
                raise _book_too_large(exc, "flavor") from None
            tag = price_tag(await catalogue.price_book_page(conn, flavor, now, None, None))
        view = PriceView(
            flavor=flavor,
            effective_from=effective,
            currency=currency,
            set_by=principal.user,
            in_force=effective <= now,
            **{"price_per_gpu_hour": None, **prices},
        )
        return tagged(view, tag or "", status_code=201 if created else 200)

    @post(
        "/v1/costs/estimate",
        status_code=200,
        operation_class=json_request_body(
            EstimateRequest, example={"gpus": 2, "gpu_flavor": "a100", "max_runtime_seconds": 3600}
        ),
        responses=error_responses(413, 415, 422),
        opt=only_reads(),  # computed from the body, nothing stored: a read in rate limits
    )
    async def estimate(request: AnyRequest) -> Estimate:
        body: EstimateRequest = await _body(EstimateRequest, request)
        now = clock()
        async with pool.acquire() as conn:
            # The whole book, not the flavor's: an unpriced flavor's error lists the priced.
            book = await catalogue.schedule(conn)
        # An attempt stopped at its limit holds its GPUs through the kill grace too.
        end = now + timedelta(seconds=attempt_seconds(body.max_runtime_seconds))
        try:
            segments = book.segments(
                body.gpu_flavor,
                body.gpus,
                now,
                end,
                cpus=body.gpus * body.cpus_per_gpu,
                memory_gib=body.gpus * body.memory_gib_per_gpu,
            )
        except UnknownFlavor as exc:
            raise RequestInvalid.one("gpu_flavor", str(exc).removeprefix("gpu_flavor: ")) from None
        one = sum((s.cost for s in segments), Decimal(0))
        # The first attempt and each restart may run to the limit; an attempt that fails
        # through the platform is charged to the platform, so its retries cost nothing.
        return Estimate(
            gpu_flavor=body.gpu_flavor,
            gpus=body.gpus,
            max_runtime_seconds=body.max_runtime_seconds,
            currency=segments[0].currency,
            price_per_gpu_hour=segments[0].price_per_gpu_hour,
            gpu_seconds=sum((s.gpu_seconds for s in segments), Decimal(0)),
            estimated_cost=one,
            worst_case_cost=one * (1 + body.max_restarts),
            priced_at=now,
        )

    @get("/v1/budgets", responses=error_responses(404, 422))
    async def list_budgets(
        request: AnyRequest,
        principal: Caller,
        team: Annotated[str | None, QueryParameter(min_length=1, max_length=100)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=BUDGETS_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="from the Link header")] = None,
    ) -> Response[list[BudgetView]]:
        """A page of budgets; while more follow, ``Link: <...&after=CURSOR>; rel="next"``
        (the body stays a plain list, as ``GET /v1/jobs``'s)."""
        check_parameters(request, frozenset({"team", "limit", "after"}))
        key = BUDGETS.read(after)
        team = team_to_read(principal, team, "budgets")
        now = clock()
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            fetched = await budgets_repo.of_teams(conn, team, limit + 1, key)
            found, more = paging.split(fetched, limit)
            spent = [await budgets_repo.spent(conn, b, month_start(now), now) for b in found]
        views = [budget_view(b, s, now) for b, s in zip(found, spent, strict=True)]
        cursor = BUDGETS.write(found[-1].team, found[-1].project or "") if more else None
        query = {**({"team": team} if team else {}), "limit": str(limit)}
        return paging.listed(views, "/v1/budgets", query, cursor)

    async def _get(principal: Principal, team: str, project: str | None) -> Response[BudgetView]:
        team_to_read(principal, team, "budget")
        now = clock()
        async with pool.acquire() as conn:
            budget = await budgets_repo.get(conn, team, project)
            if budget is None:
                raise NotFoundException(f"no budget of {_scope(team, project)}")
            spent = await budgets_repo.spent(conn, budget, month_start(now), now)
        return tagged(budget_view(budget, spent, now), budget_tag(budget) or "")

    async def _write(
        conn: asyncpg.Connection,
        principal: Principal,
        team: str,
        project: str | None,
        body: BudgetRequest,
        now: datetime,
    ) -> tuple[BudgetView, bool, str]:
        """Store ``body`` as the budget of ``team`` (``project``), under its lock, and say
        its state: its view, whether it was created, and its ETag."""
        budget = Budget(
            team=team,
            project=project,
            amount=body.amount,
            currency=currency,
            thresholds=tuple(body.thresholds),
            policy=body.policy,
            on_exhausted=body.on_exhausted,
            revision=await budgets_repo.next_revision(conn),
            updated_by=principal.user,
            updated_at=now,
        )
        created = await budgets_repo.put(conn, budget)
        await budget_watch.check(conn, budget, [month_start(now)], now)
        try:
            spent = await budget_watch.say_state(conn, budget, now)
        except budget_watch.BookTooLarge as exc:
            raise _book_too_large(exc, "policy") from None
        return budget_view(budget, spent, now), created, budget_tag(budget) or ""

    async def _put(
        request: AnyRequest,
        principal: Caller,
        teams: Teams,
        team: str,
        project: str | None,
        conditions: Preconditions,
    ) -> Response[BudgetView]:
        team_to_read(principal, team, "budget")
        body: BudgetRequest = await _body(BudgetRequest, request)
        if principal.is_operator:  # a user's own team exists; an operator's may not
            await teams.require(team, "team")
        now = clock()
        async with pool.acquire() as conn, conn.transaction():
            await budgets_repo.lock(conn, [(team, project)])  # budget_watch: in turns
            found = await budgets_repo.get(conn, team, project)
            conditions.check(f"the budget of {_scope(team, project)}", budget_tag(found))
            view, created, tag = await _write(conn, principal, team, project, body, now)
            await audit.record(
                conn, principal, "put budget", _scope(team, project), body.model_dump(mode="json")
            )
        return tagged(view, tag, status_code=201 if created else 200)

    async def _patch(
        request: AnyRequest,
        principal: Caller,
        team: str,
        project: str | None,
        conditions: Preconditions,
    ) -> Response[BudgetView]:
        team_to_read(principal, team, "budget")
        changes = await read_merge_patch(request, BODY_MAX_BYTES, free_text=lambda path: True)
        now = clock()
        async with pool.acquire() as conn, conn.transaction():
            # Read and written under the budget's lock, which every change takes: no other
            # change falls between, so one that names other fields is kept, not replaced.
            await budgets_repo.lock(conn, [(team, project)])
            current = await budgets_repo.get(conn, team, project)
            if current is None:
                raise NotFoundException(
                    f"no budget of {_scope(team, project)}; create it with PUT "
                    f"/v1/budgets/{team}{'' if project is None else '/' + project}"
                )
            conditions.check(f"the budget of {_scope(team, project)}", budget_tag(current))
            body = patched(BudgetRequest, request_of(current), changes)
            view, _, tag = await _write(conn, principal, team, project, body, now)
            await audit.record(conn, principal, "patch budget", _scope(team, project), changes)
        return tagged(view, tag)

    async def _delete(
        principal: Principal, team: str, project: str | None, conditions: Preconditions
    ) -> None:
        team_to_read(principal, team, "budget")
        now = clock()
        async with pool.acquire() as conn, conn.transaction():
            await budgets_repo.lock(conn, [(team, project)])
            budget = await budgets_repo.get(conn, team, project)
            if budget is None:
                raise NotFoundException(f"no budget of {_scope(team, project)}")
            conditions.check(f"the budget of {_scope(team, project)}", budget_tag(budget))
            await budgets_repo.delete(conn, team, project)
            await budget_watch.say_state(conn, budget, now, deleted=True)
            await audit.record(conn, principal, "delete budget", _scope(team, project), {})

    put_responses = {
        201: ResponseSpec(BudgetView, description="created", generate_examples=False),
        **error_responses(404, 409, 412, 413, 415, 422),
    }
    patch_responses = error_responses(404, 409, 412, 413, 415)
    delete_responses = error_responses(404, 412)
    example = {"amount": "1000", "thresholds": [50, 80, 100], "policy": "warn"}

    @get("/v1/budgets/{team:str}", response_headers=[ETAG], responses=error_responses(404))
    async def get_team_budget(team: TeamPath, principal: Caller) -> Response[BudgetView]:
        """The budget, spent this month, with its ``ETag`` (for ``If-Match``)."""
        return await _get(principal, team, None)

    @get(
        "/v1/budgets/{team:str}/{project:str}",
        response_headers=[ETAG],
        responses=error_responses(404),
    )
    async def get_project_budget(
        team: TeamPath, project: ProjectPath, principal: Caller
    ) -> Response[BudgetView]:
        return await _get(principal, team, project)

    @put(
        "/v1/budgets/{team:str}",
        opt=needs(Role.ADMIN),
        operation_class=json_request_body(BudgetRequest, example=example),
        responses=put_responses,
    )
    async def put_team_budget(
        team: TeamPath,
        request: AnyRequest,
        principal: Caller,
        teams: TeamCheck,
        conditions: Conditions,
    ) -> Response[BudgetView]:
        """Create the budget (201) or replace it whole (200); with ``If-Match: <ETag>`` only
        replace it as it was read, with ``If-None-Match: *`` only create it (412 when it
        exists), with ``If-Match: *`` only replace it (412 when there is none); nothing
        changed on a 412."""
        return await _put(request, principal, teams, team, None, conditions)

    @put(
        "/v1/budgets/{team:str}/{project:str}",
        opt=needs(Role.ADMIN),
        operation_class=json_request_body(BudgetRequest, example=example),
        responses=put_responses,
    )
    async def put_project_budget(
        team: TeamPath,
        project: ProjectPath,
        request: AnyRequest,
        principal: Caller,
        teams: TeamCheck,
        conditions: Conditions,
    ) -> Response[BudgetView]:
        """As ``PUT /v1/budgets/{team}``, of the project's budget."""
        return await _put(request, principal, teams, team, project, conditions)

    @patch(
        "/v1/budgets/{team:str}",
        opt=needs(Role.ADMIN),
        operation_class=merge_patch_request_body(BudgetRequest),
        responses=patch_responses,
    )
    async def patch_team_budget(
        team: TeamPath,
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[BudgetView]:
        """Change only the fields the body names (a JSON Merge Patch, RFC 7396, of the
        ``PUT`` body: ``{"policy": "refuse"}``; ``null`` puts a field back to its default);
        the rest stays, whatever another change made of it meanwhile. 404 when there is no
        budget: a patch never creates one. 412 with ``If-Match: <ETag>`` when it changed
        since it was read, or ``If-None-Match: *`` (the budget exists), nothing changed."""
        return await _patch(request, principal, team, None, conditions)

    @patch(
        "/v1/budgets/{team:str}/{project:str}",
        opt=needs(Role.ADMIN),
        operation_class=merge_patch_request_body(BudgetRequest),
        responses=patch_responses,
    )
    async def patch_project_budget(
        team: TeamPath,
        project: ProjectPath,
        request: AnyRequest,
        principal: Caller,
        conditions: Conditions,
    ) -> Response[BudgetView]:
        """As ``PATCH /v1/budgets/{team}``, of the project's budget."""
        return await _patch(request, principal, team, project, conditions)

    @delete("/v1/budgets/{team:str}", opt=needs(Role.ADMIN), responses=delete_responses)
    async def delete_team_budget(
        team: TeamPath,
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        """Delete the budget (404 when there is none; 412 with ``If-Match: <ETag>`` when it
        changed since it was read, or ``If-None-Match: *``, the budget existing, nothing
        deleted)."""
        await _delete(principal, team, None, conditions)

    @delete(
        "/v1/budgets/{team:str}/{project:str}",
        opt=needs(Role.ADMIN),
        responses=delete_responses,
    )
    async def delete_project_budget(
        team: TeamPath,
        project: ProjectPath,
        principal: Caller,
        conditions: Conditions,
    ) -> None:
        """As ``DELETE /v1/budgets/{team}``, of the project's budget."""
        await _delete(principal, team, project, conditions)

    return [
        list_prices,
        get_prices,
        put_price,
        estimate,
        list_budgets,
        get_team_budget,
        get_project_budget,
        put_team_budget,
        put_project_budget,
        patch_team_budget,
        patch_project_budget,
        delete_team_budget,
        delete_project_budget,
    ]


def _scope(team: str, project: str | None) -> str:
    return f"team {team}" if project is None else f"project {project} of team {team}"
