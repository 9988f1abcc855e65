"""The HTTP API: ``create_app`` wires controllers, authentication and error shapes.

Contract:
- Every route but ``/healthz`` and ``/readyz`` (the ``/v1`` API and the OpenAPI schema) needs
  ``Authorization: Bearer <token>`` of a user; without a valid one the answer is 401 before
  anything else is looked at (an app-level guard, so a new route cannot be left open), or
  429 once its client address has failed too often (below).
- Every error is JSON ``{"detail": ..., "errors": [{"field": ..., "message": ...}]}``
  (``shared.http_errors``): 422 for invalid input (every bad field named, nothing stored),
  401/403/404 as usual, 409 and 429 naming the field they are about and why
  (``shared.http_errors.Refused``: ``Idempotency-Key`` used for another request, with the
  job it made; a path's ``job_id``; ``Authorization`` for a token's spent rate limit), 413
  for a bundle over the limit, and 500 with a generic message (the traceback goes to the
  log, never to the user).
- JSON bodies (``POST /v1/jobs``, ``POST /v1/admin/users``) are limited before they are
  read: 415 unless ``Content-Type: application/json`` (UTF-8), 413 over
  ``JSON_BODY_MAX_BYTES``; then ``shared.http_errors.check_json`` refuses (422, naming the
  field) invalid UTF-8, duplicate keys, deep nesting, numbers beyond 64 bits or a double,
  and control characters in any key or string (tab, newline and carriage return are allowed
  only in the free text of ``args``, ``command`` and hyperparameter values). The bundle
  upload has its own limit (``bundle_max_bytes``).
- ``POST /v1/jobs?dry_run=true`` checks the job exactly as a submission does (the body, the
  flavors, the budgets, the registry's data admission, the bundle, a repeated
  ``Idempotency-Key``) and stores nothing: 200 with the job as it would be submitted (under
  an id no job has; a key used before with the same request: that job), or the very refusal
  the submission would get. It spends a read of the rate limits, not a write
  (``shared.access.only_reads``): the CLI checks a spec so before each submission.
- ``POST /v1/jobs`` with an ``Idempotency-Key`` this user used before (``commands``): the
  same request (``schemas.request_fingerprint``: the same JSON however ordered or spaced, a
  field left out or sent with its default value alike)
  answers 200 with the job the key stored, as it is now, before the budgets or the
  registry are asked (a budget spent or raised since, or one that now refuses new jobs,
  changes nothing of a retry, nor does its flavor retired since), with no budget warning;
  a different request answers 409 naming ``Idempotency-Key``. The body is still checked
  first (422; a retired flavor's refusal stands for a different request). A retry so
  answered spends a read of the rate limits, not a write (``ratelimit.replays_as_read``:
  a client retrying after a lost answer is not pushed into 429 by its own retries);
  anything else under a key (a new job, a different request, a refusal) spends a write,
  as without one, and a job is stored only once its write is spent.
- ``POST /v1/tokens`` with an ``Idempotency-Key`` this user made a token with
  (``identity.replay_token``): the same request answers 200 with that token without its
  secret (``"token": null``; only its hash is stored), a different one 409 naming the
  header; spent as a submission's retry (a read; anything else a write).
- ``POST /v1/tokens/rotate`` with an ``Idempotency-Key``: its retry presents the token the
  rotation revoked, which the guard lets into this route alone, under that key, within
  ``identity.ROTATION_REPLAY_WINDOW`` (``identity.authenticate_rotation_replay``); the
  same request answers 200 with the token the rotation made and a new secret, the lost
  one dead (``identity.replay_rotation``), a different one 409 naming the header. A write
  either way: the retry stores a secret's hash.
- Code bundles are per team: ``HEAD /v1/bundles/{sha256}`` answers 200 when the caller's
  team has uploaded it, else 404; ``PUT /v1/bundles/{sha256}`` stores the body after
  checking that its sha256 is the one in the path and that it is a bundle a runner unpacks
  (``shared.bundle_archive``: else 422 naming ``body`` with the reason; 201 created, 200
  already there).
- Every authenticated request spends a token of its user's bucket (``shared.ratelimit``;
  keyed by the user id the guard resolves, never the token itself nor the client
  address): reads (``GET``, ``HEAD``) and writes (everything else) have buckets and
  settings of their own
  (``read_rate_per_s``/``read_burst``, ``write_rate_per_s``/``write_burst``), and a
  request that stores nothing (a dry run, a retry answered from its ``Idempotency-Key``'s
  job) spends a read, so it never takes a write from the requests that do, and is limited
  all the same; the other
  services check the token of each of their writes with ``POST /v1/me``, a write, and of
  each read with ``GET /v1/me``, so a user's requests to any service share these buckets
  (each of those services also has buckets of its own: ``shared.access``).
  Each request also spends a token of its team's bucket (``team_rate_factor`` times a
  user's rate and burst), so a team's users together, however many its admin creates, are
  limited too. An empty bucket answers 429 with ``Retry-After`` (whole seconds, at least
  1) and the limit in the detail (a dry run's: that it counts as a read), naming
  ``Authorization``; a request refused spends nothing, but for a submission under an
  ``Idempotency-Key`` refused for its write, which keeps the read its key's lookup spent.
  The probes are not limited.
- Where ``failed_auth_burst`` is set (off by default, see its setting), a request whose
  token is missing, malformed or refused (401 in the guard) counts against its client's
  address (as uvicorn gives it; an IPv6 one by its /64: ``failed_auth``): past ``failed_auth_burst`` of them,
  refilled at ``failed_auth_rate_per_s``, the address's requests answer 429 with
  ``Retry-After`` before their token is looked up, but for tokens that authenticated in
  this process lately and were not refused since, so the users sharing an address with a failing client keep working.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, cast

import asyncpg
import httpx
from litestar import Litestar, Request, Response, Router, delete, get, head, patch, post, put
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.enums import MediaType
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, HeaderParameter, PathParameter, QueryParameter
from litestar.types import ASGIApp, Guard, Receive, Scope, Send

from trainyard_platform.services.submission import (
    commands,
    governance,
    identity,
    jobschema,
    known_callers,
)
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.dashboard import dashboard_routes
from trainyard_platform.services.submission.data_admission import DataAdmission, RegistryUnavailable
from trainyard_platform.services.submission.domain import JobStatus
from trainyard_platform.services.submission.errors import Conflict, Forbidden, NotFound
from trainyard_platform.services.submission.failed_auth import FailedAuthentications
from trainyard_platform.services.submission.governance import BUDGET_WARNING_HEADER
from trainyard_platform.services.submission.group_commit import GroupCommit
from trainyard_platform.services.submission.identity import Caller
from trainyard_platform.services.submission.identity_schemas import (
    MeView,
    TeamView,
    TokenCreated,
    TokenRequest,
    TokenView,
    UserView,
)
from trainyard_platform.services.submission.known_callers import (
    KnownCaller,
    KnownCallers,
    month_and_now,
)
from trainyard_platform.services.submission.objects import Objects
from trainyard_platform.services.submission.ratelimit import (
    OwedWrite,
    charged_unless_replayed,
    defers_its_write,
    owe_write,
    owed_write,
    replays_as_read,
)
from trainyard_platform.services.submission.reproduce import reproduce_job
from trainyard_platform.services.submission.schemas import (
    ID_PREFIX_PATTERN,
    IDEMPOTENCY_KEY,
    LABEL_FILTER_PATTERN,
    NAME_PATTERN,
    BundleStored,
    CreateUserRequest,
    JobFilters,
    JobRequest,
    JobSummary,
    JobView,
    LogPage,
    RoleChange,
    UserCreated,
    parse_idempotency_key,
    parse_job_request,
    request_fingerprint,
)
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.access import (
    UNAUTHENTICATED,
    enforce_least_role,
    is_open_probe,
    is_write,
    needs,
    only_reads,
    public_asset,
    remember,
    stores_nothing,
)
from trainyard_platform.shared.audit import audit_route
from trainyard_platform.shared.auth import hash_token, presented_token
from trainyard_platform.shared.bundle_archive import BundleRefused, check_bundle
from trainyard_platform.shared.events.payloads import BUNDLE_SHA256_PATTERN
from trainyard_platform.shared.http_app import (
    ETAG,
    Conditions,
    body_is_work,
    bytes_request_body,
    error_responses,
    head_answer,
    head_of_get,
    json_request_body,
    service_app,
    tagged,
)
from trainyard_platform.shared.http_errors import (
    RateLimited,
    RequestInvalid,
    parse_body,
    read_json_body,
    spool_body,
)
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.ratelimit import COUNTED_AS_READ, UserRateLimits
from trainyard_platform.shared.slots import Slots
from trainyard_platform.shared.storage import ObjectStore

Pool = NamedDependency[asyncpg.Pool]
Me = NamedDependency[Caller]
Config = NamedDependency[Settings]
Store = NamedDependency[Objects]
Admission = NamedDependency[DataAdmission]
AnyRequest = Request[Any, Any, Any]
IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]
DryRun = Annotated[
    bool,
    QueryParameter(
        description="check the job as a submission does (every check, the budgets' and the "
        "registry's included) and store nothing: 200 with the job as it would be submitted "
        "(an id no job has), or the refusal a submission would get; it spends a read of "
        "the rate limits, not a write (only dry_run=true or 1 does)"
    ),
]
Limit = Annotated[int, QueryParameter(ge=1, le=500)]
Cursor = Annotated[str | None, QueryParameter(description="from the Link header's next")]
LogLimit = Annotated[int, QueryParameter(ge=1, le=100)]
IdPrefix = Annotated[
    str | None, QueryParameter(pattern=ID_PREFIX_PATTERN, description="an id's beginning")
]
NameQuery = Annotated[str | None, QueryParameter(min_length=1, max_length=100)]
LabelQuery = Annotated[
    str | None, QueryParameter(pattern=LABEL_FILTER_PATTERN, description="KEY=VALUE")
]
TeamName = Annotated[
    str | None, QueryParameter(pattern=NAME_PATTERN, description="operators: another team")
]
AllTeams = Annotated[
    bool,
    QueryParameter(description="operators: every team's (not with team); anyone else: 403"),
]
UserName = Annotated[
    str | None, QueryParameter(pattern=NAME_PATTERN, description="admins: another user")
]
Sha256 = Annotated[
    str,
    PathParameter(
        description="the bundle's sha256", schema_extra={"pattern": BUNDLE_SHA256_PATTERN}
    ),
]
"""Documented with its pattern; ``_bundle_sha256`` checks it (422 naming ``sha256``)."""

JSON_BODY_MAX_BYTES = 64 * 1024
"""The largest JSON body accepted (a job spec is a few KB; the event that carries it must
stay well under the bus's 1 MiB message limit)."""
_JOB_FREE_TEXT = re.compile(r"(?:args|command)\[\d+\]|hyperparameters\..+")
"""Where a job spec may hold tab, newline and carriage return."""


@dataclass(frozen=True)
class AppDeps:
    """What the app is built on: the service's pool and object store, and the runtime's
    health routes."""

    pool: asyncpg.Pool
    store: ObjectStore
    health_handlers: Sequence[HTTPRouteHandler] = field(default_factory=tuple)
    registry_transport: httpx.AsyncBaseTransport | None = None
    """How admission reaches the registry (``data_admission``); default: HTTP."""
    group_commit: GroupCommit | None = None
    """The writer of remembered callers' submissions (``group_commit``); default: one over
    ``pool``."""


@dataclass(frozen=True)
class Front:
    """What ``POST /v1/jobs`` works with, as one dependency: Litestar resolves several
    dependencies of a handler concurrently, in a task group, on every request."""

    pool: asyncpg.Pool
    objects: Objects
    settings: Settings
    admission: DataAdmission
    known: KnownCallers
    writer: GroupCommit


FrontDoor = NamedDependency[Front]


_SCREENED = "trainyard_screened"
_REMEMBERED = "trainyard_remembered_callers"
_ROTATION_RETRY = "trainyard_rotation_retry"
"""A route's ``opt``: a token revoked by a rotation may call it for that rotation's retry
(``caller_guard``): ``POST /v1/tokens/rotate`` alone."""


def screened(role: Role, remembered: bool = False) -> dict[str, Any]:
    """The ``opt`` of a route that only ``role`` and above may call and that checks a job
    against the flavor catalogue and budgets: the guard reads them with the token. With
    ``middleware=[release_held]`` the guard also keeps its connection for the handler
    (``held_connection``). ``remembered`` (with ``release_held`` only): the guard may let
    a token it remembers in without a query (``known_callers``); the handler must then
    take the ``KnownCaller`` from the request's state and check it again before it acts
    (``submit_job``: in the statement that stores the job)."""
    return {**needs(role), _SCREENED: True, _REMEMBERED: remembered}


_HELD = "trainyard_held_connection"


def release_held(app: ASGIApp) -> ASGIApp:
    """The middleware of every ``screened()`` route: gives back to its pool the connection
    ``caller_guard`` took for the request (``held_connection``), once the request is over
    however it ended (answered, refused by the guard or a check, failed, cancelled). The
    guard runs inside a route's middleware, so no path skips this."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        finally:
            await _give_back(scope.get("state", {}))

    return middleware


async def give_back_held(request: AnyRequest) -> None:
    """Give the connection ``caller_guard`` took back to its pool now (before a wait on
    something else); ``held_connection`` is None from then on."""
    await _give_back(request.scope["state"])


async def _give_back(state: dict[str, Any]) -> None:
    held = state.pop(_HELD, None)
    if held is not None:
        pool, conn = held
        await pool.release(conn)


def held_connection(request: AnyRequest) -> asyncpg.Connection | None:
    """The connection ``caller_guard`` took for a ``screened()`` route (None on others);
    ``release_held`` gives it back."""
    held = request.scope["state"].get(_HELD)
    return None if held is None else held[1]


# --- controllers ---------------------------------------------------------------------


@get("/me")
async def whoami(caller: Me) -> MeView:
    """Who the presented token belongs to (other services check user tokens here)."""
    return caller.me()


@post("/me", status_code=200)
async def whoami_for_write(caller: Me) -> MeView:
    """Who the presented token belongs to, spending one of its user's writes rather than a
    read: the registry, billing and the scheduler check the token of each of their write
    requests here, so those writes have the user's write limit, as submission's own do."""
    return caller.me()


@get("/teams/{team:str}", responses=error_responses(404))
async def team(pool: Pool, team: Annotated[str, PathParameter(pattern=NAME_PATTERN)]) -> TeamView:
    """Whether a team exists (any user: team names are not secret). The registry and billing
    ask with their caller's token before they store a reference to a team."""
    return await identity.team(pool, team)


@post(
    "/admin/users",
    status_code=201,
    request_max_body_size=None,
    opt=needs(Role.ADMIN),
    operation_class=json_request_body(CreateUserRequest),
    responses=error_responses(409, 413, 415),
)
async def create_user(request: AnyRequest, pool: Pool, caller: Me, settings: Config) -> UserCreated:
    body = parse_body(CreateUserRequest, await json_body(request))
    return await identity.create_user(
        pool, caller, body, settings.token_ttl_days, _live_tokens(settings)
    )


@get("/admin/users", opt=needs(Role.ADMIN), responses=error_responses(404))
async def list_users(
    pool: Pool, caller: Me, team: TeamName = None, limit: Limit = 100, after: Cursor = None
) -> Response[list[UserView]]:
    """The team's users by name, a page at a time (the next in the ``Link`` header, as
    ``GET /v1/jobs``)."""
    users, cursor = await identity.list_users(pool, caller, team, limit, after)
    query = {**({"team": team} if team else {}), "limit": str(limit)}
    return paging.listed(users, "/v1/admin/users", query, cursor)


@get(
    "/admin/users/{name:str}",
    response_headers=[ETAG],
    opt=needs(Role.ADMIN),
    responses=error_responses(404),
)
async def get_user(
    name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
    pool: Pool,
    caller: Me,
    team: TeamName = None,
) -> Response[UserView]:
    """A user of the team, with its ``ETag`` (``identity.user_tag``; for ``If-Match`` on its
    role change or disabling)."""
    view = await identity.get_user(pool, caller, _name("name", name), team)
    return tagged(view, identity.user_tag(view.role, view.disabled_at))


@patch(
    "/admin/users/{name:str}",
    request_max_body_size=None,
    opt=needs(Role.ADMIN),
    operation_class=json_request_body(RoleChange),
    responses=error_responses(404, 409, 412, 413, 415),
)
async def change_role(
    name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
    request: AnyRequest,
    pool: Pool,
    caller: Me,
    conditions: Conditions,
    team: TeamName = None,
) -> Response[UserView]:
    """Give a user another role (effective from its tokens' next request); with ``If-Match:
    <ETag>`` (of ``GET``) only while the user is as it was read (412 otherwise, nothing
    changed)."""
    body = parse_body(RoleChange, await json_body(request))
    view = await identity.change_role(
        pool, caller, _name("name", name), team, Role(body.role), conditions
    )
    return tagged(view, identity.user_tag(view.role, view.disabled_at))


@delete(
    "/admin/users/{name:str}",
    status_code=204,
    opt=needs(Role.ADMIN),
    responses=error_responses(404, 409, 412),
)
async def disable_user(
    name: Annotated[str, PathParameter(schema_extra={"pattern": NAME_PATTERN})],
    pool: Pool,
    caller: Me,
    conditions: Conditions,
    team: TeamName = None,
) -> None:
    """Disable the user and revoke its tokens; with ``If-Match: <ETag>`` only while it is
    as it was read (412 otherwise, nothing changed)."""
    await identity.disable_user(pool, caller, _name("name", name), team, conditions)


@get("/tokens", responses=error_responses(404))
async def list_tokens(
    pool: Pool,
    caller: Me,
    user: UserName = None,
    team: TeamName = None,
    limit: Limit = 100,
    after: Cursor = None,
) -> Response[list[TokenView]]:
    """The user's tokens, oldest first, a page at a time (the next in the ``Link`` header)."""
    tokens, cursor = await identity.list_tokens(pool, caller, user, team, limit, after)
    query = {
        **({"user": user} if user else {}),
        **({"team": team} if team else {}),
        "limit": str(limit),
    }
    return paging.listed(tokens, "/v1/tokens", query, cursor)


@post(
    "/tokens",
    status_code=201,
    request_max_body_size=None,
    # A retry answered from its Idempotency-Key's token makes nothing: a read, as a job's.
    opt=replays_as_read(),
    operation_class=json_request_body(TokenRequest),
    responses={
        200: ResponseSpec(
            TokenCreated,
            description="the token this Idempotency-Key already made, with the same request, "
            "without its secret (token: null; shown once, only its hash is stored)",
            generate_examples=False,
        ),
        **error_responses(409, 413, 415),
    },
)
async def create_token(
    request: AnyRequest, pool: Pool, caller: Me, settings: Config, key: IdempotencyKey = None
) -> Response[TokenCreated]:
    """A new token for the caller (201, its secret in ``token``, shown this once). Under an
    ``Idempotency-Key`` the caller made a token with before, the same request answers 200
    with that token and ``token: null`` (``identity.replay_token`` says why), a different
    one 409 naming the header."""
    with charged_unless_replayed(owed_write(request.scope["state"])) as owed:
        body = parse_body(TokenRequest, await json_body(request))
        key = parse_idempotency_key(key)
        if key is not None:
            replayed = await identity.replay_token(pool, caller, body, key)
            if replayed is not None:
                if owed is not None:
                    owed.replayed()
                return Response(replayed, status_code=200)
        if owed is not None:
            owed.spend()  # a new token from here on: a write, before anything is stored
        made, created = await identity.create_token(
            pool, caller, body, settings.token_ttl_days, _live_tokens(settings), key
        )
        if not created and owed is not None:
            owed.replayed()
        return Response(made, status_code=201 if created else 200)


@post(
    "/tokens/rotate",
    status_code=201,
    request_max_body_size=None,
    # The one route a token revoked by a rotation may call: that rotation's retry.
    opt={_ROTATION_RETRY: True},
    operation_class=json_request_body(TokenRequest),
    responses={
        200: ResponseSpec(
            TokenCreated,
            description="the retry of a rotation under its Idempotency-Key, presenting the "
            "token it revoked: the token it made, with a new secret (the lost one dead), or "
            "token: null when that token was revoked or expired since",
            generate_examples=False,
        ),
        **error_responses(409, 413, 415),
    },
)
async def rotate_token(
    request: AnyRequest, pool: Pool, caller: Me, settings: Config, key: IdempotencyKey = None
) -> Response[TokenCreated]:
    """Replace the token presented (201, the new secret in ``token``; the old one revoked).
    Its retry under the same ``Idempotency-Key``, presenting the revoked token, answers 200
    with the token it made and a new secret (``identity.rotate_token`` says why)."""
    body = parse_body(TokenRequest, await json_body(request))
    key = parse_idempotency_key(key)
    if caller.replaced_by is not None:
        assert key is not None  # the guard let it in on its key
        return Response(await identity.replay_rotation(pool, caller, body, key), status_code=200)
    made = await identity.rotate_token(pool, caller, body, settings.token_ttl_days, key)
    return Response(made, status_code=201)


@delete("/tokens/{token_id:int}", status_code=204, responses=error_responses(404))
async def revoke_token(
    token_id: Annotated[int, PathParameter(ge=1, le=2**63 - 1)], pool: Pool, caller: Me
) -> None:
    await identity.revoke_token(pool, caller, token_id)


def _live_tokens(settings: Settings) -> identity.LiveTokens:
    return identity.LiveTokens(settings.live_tokens_per_user, settings.live_tokens_per_team)


def _name(field: str, value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):
        raise RequestInvalid.one(field, "use 1-100 of A-Z a-z 0-9 . _ -")
    return value


@post(
    "/jobs",
    status_code=201,
    request_max_body_size=None,
    # A dry run stores nothing: it spends a read, leaving the writes to submissions; so
    # does a retry answered from its Idempotency-Key's job.
    opt={
        **screened(Role.MEMBER, remembered=True),
        **only_reads(when="dry_run"),
        **replays_as_read(),
    },
    middleware=[release_held],
    operation_class=json_request_body(
        JobRequest,
        example={"name": "digits", "entrypoint": "train", "gpus": 1, "gpu_flavor": "cpu"},
    ),
    responses={
        200: ResponseSpec(
            JobView,
            description="the job this Idempotency-Key already submitted, with the same request; "
            "with dry_run, the job as it would be submitted (nothing stored)",
            generate_examples=False,
        ),
        **error_responses(409, 413, 415),
    },
)
async def submit_job(
    request: AnyRequest, front: FrontDoor, key: IdempotencyKey = None, dry_run: DryRun = False
) -> Response[JobView]:
    # A replay is charged the read the guard spent; anything else a write (``ratelimit``).
    with charged_unless_replayed(owed_write(request.scope["state"])) as owed:
        return await _submit_job(request, front, key, dry_run, owed)


async def _submit_job(
    request: AnyRequest, front: Front, key: str | None, dry_run: bool, owed: OwedWrite | None
) -> Response[JobView]:
    body: bytes | None = None
    known = request.scope["state"].pop(_KNOWN, None)
    if isinstance(known, KnownCaller) and dry_run:
        # A dry run stores nothing, so no statement checks the remembered caller: check the
        # token now, and go the full way.
        await _check_again(request, front)
    elif isinstance(known, KnownCaller):
        # The guard let the request in on what the token's last check read, without a
        # query: the job is stored only if one statement finds all of it unchanged.
        # Otherwise, or on any refusal before that statement, the token is checked again
        # first and the request goes the full way on what that check reads: its answer is
        # the one the caller gets (a revoked token's bad body is a 401, not a 422).
        try:
            body = await json_body(request, _JOB_FREE_TEXT)
            ready = await _prepare_known(request, front, known, body, key)
        except Exception:
            await _check_again(request, front)
            if body is None:
                raise  # refused reading the body, which no caller changes
        else:
            # Its write spent before the job may be stored; where the writes are spent, the
            # full path tells a replay (a read) from a write refused (429).
            if ready is not None and (owed is None or owed.took()):
                job_ready, warnings, checked_key = ready
                done = await commands.submit_prepared_if_known(
                    front.writer, known, job_ready, checked_key
                )
                if done is not None:
                    if not done[1] and owed is not None:
                        owed.replayed()
                    return _submitted(*done, warnings, new_job_id=job_ready.job_id)
            await _check_again(request, front)
    caller = resolve_caller(request)
    screening = await request_screening(request, front.pool, front.settings, caller.team)
    if body is None:
        body = await json_body(request, _JOB_FREE_TEXT)
    try:
        job = parse_job_request(body, screening.flavors)
    except RequestInvalid as refused:
        held = held_connection(request)
        replayed = await commands.replay_despite_flavor(
            front.pool, caller, key, body, refused, held
        )
        if replayed is None:
            raise
        return _replayed(replayed, dry_run, owed)
    key = parse_idempotency_key(key)
    fingerprint = None
    if key is not None:
        # A retry is answered with the job its key stored before anything that could
        # refuse or change a new job (a spent budget, the registry) is asked: what they
        # say may have changed since, and that job was admitted then.
        fingerprint = request_fingerprint(job, team=caller.team)
        held = held_connection(request)
        replayed = await commands.replay(front.pool, caller, key, fingerprint, held)
        if replayed is not None:
            return _replayed(replayed, dry_run, owed)
    if owed is not None:
        owed.spend()  # a new job from here on: a write, before anything is stored
    job, warnings, lowered = screening.admit(job)
    if front.admission.asks_registry(job) or commands.reads_the_store(job):
        # It waits on the registry or the object store (up to their timeouts): no pooled
        # connection is held then, or a stalled one would take every connection of the
        # pool with as many submissions, and every other request would fail meanwhile.
        await give_back_held(request)
    job = await front.admission.admit(job, request.headers.get("authorization", ""))
    if dry_run:
        view = await commands.check_job(
            front.pool,
            front.objects,
            caller,
            job,
            key,
            held_connection(request),
            lowered,
            fingerprint,
        )
        return _checked(view, warnings)
    view, created = await commands.submit_job(
        front.pool,
        front.objects,
        caller,
        job,
        key,
        held=held_connection(request),
        lowered=lowered,
        fingerprint=fingerprint,
    )
    if not created and owed is not None:
        owed.replayed()
    return _submitted(view, created, warnings)


def _replayed(view: JobView, dry_run: bool, owed: OwedWrite | None) -> Response[JobView]:
    """The answer of a request answered from its key's job: charged a read only."""
    if owed is not None:
        owed.replayed()
    return _checked(view, []) if dry_run else _submitted(view, False, [])


def _checked(view: JobView, warnings: list[str]) -> Response[JobView]:
    """The answer of a dry run: 200, the budgets' warnings as a submission's, no
    ``Location`` (no job was made)."""
    headers = {BUDGET_WARNING_HEADER: "; ".join(warnings)} if warnings else {}
    return Response(view, status_code=200, headers=headers)


def _submitted(
    view: JobView | bytes, created: bool, warnings: list[str], new_job_id: str | None = None
) -> Response[JobView]:
    """The answer of ``submit_job``: ``view`` as a ``JobView``, or already encoded as
    Litestar would encode it (``views.submitted_job_json``: bytes go out as they are), the
    new job ``new_job_id``'s. ``Location`` names the job shown: a ``JobView``'s own id (a
    replay's is the earlier job's, not the id the repeated request was prepared with). A
    replay (not ``created``) says no budget warning: nothing was admitted, and the job's
    own history says whether a budget lowered it."""
    if isinstance(view, JobView):
        job_id = view.id
    else:
        assert new_job_id is not None  # bytes are only ever a new job's view
        job_id = new_job_id
    headers = {"Location": f"/v1/jobs/{job_id}"}
    if warnings and created:
        headers[BUDGET_WARNING_HEADER] = "; ".join(warnings)
    status = 201 if created else 200
    if isinstance(view, bytes):
        encoded: Response[Any] = Response(view, status_code=status, headers=headers)
        return cast("Response[JobView]", encoded)
    return Response(view, status_code=status, headers=headers)


async def _prepare_known(
    request: AnyRequest, front: Front, known: KnownCaller, body: bytes, key: str | None
) -> tuple[commands.Prepared, list[str], str | None] | None:
    """The submission's checks on a remembered caller (``known_callers``), as the full path
    makes them, with the checked idempotency key; None where the full path must run (a
    job the registry must admit). Raises the refusal the remembered caller would get."""
    job = parse_job_request(body, known.screening.flavors)
    checked_key = parse_idempotency_key(key)
    # Of the request as sent: a replay compares it, whatever the budgets make of the job.
    fingerprint = None if checked_key is None else request_fingerprint(job, team=known.caller.team)
    job, warnings, lowered = known.screening.admit(job)
    if front.admission.asks_registry(job):
        return None
    prepared = await commands.prepare(
        front.objects, known.caller, job, lowered=lowered, fingerprint=fingerprint
    )
    return prepared, warnings, checked_key


async def _check_again(request: AnyRequest, front: Front) -> None:
    """The guard's check of a ``screened()`` route, made now (its rate limit was spent)."""
    token = presented_token(request.headers)
    if token is None:
        raise NotAuthorizedException(UNAUTHENTICATED)
    await _check_held(
        request,
        request.route_handler,
        front.pool,
        front.settings.flavors,
        front.known,
        hash_token(token),
        None,
    )


@get("/jobs/{job_id:str}", response_headers=[ETAG], responses=error_responses(404))
async def get_job(job_id: FromPath[str], pool: Pool, caller: Me) -> Response[JobView]:
    """The job, with its ``ETag`` (``commands.job_tag``; for ``If-Match`` on its cancel)."""
    view = await commands.get_job(pool, caller, job_id)
    return tagged(view, commands.job_tag(view))


@get("/schemas/job.v1.json", opt=public_asset(), include_in_schema=False, sync_to_thread=False)
def job_schema() -> Response[str]:
    """The JSON Schema of a job spec file, for editors (``$schema=<API>/v1/schemas/job.v1.json``);
    a file shipped with the code, open to anyone."""
    return Response(jobschema.render(), media_type="application/schema+json")


@get("/jobs", responses=error_responses(404))
async def list_jobs(
    pool: Pool,
    caller: Me,
    status: FromQuery[JobStatus | None] = None,
    limit: Limit = 50,
    after: FromQuery[str | None] = None,
    id_prefix: IdPrefix = None,
    user: NameQuery = None,
    project: NameQuery = None,
    experiment: NameQuery = None,
    label: LabelQuery = None,
    team: TeamName = None,
    all_teams: AllTeams = False,
) -> Response[list[JobSummary]]:
    """The team's jobs, newest first, a page at a time; ``id_prefix``, ``user``, ``project``,
    ``experiment`` and ``label`` (``KEY=VALUE``) narrow the list (all that are given must
    hold). Operators list another team's with ``team`` (anyone else: 404, as for a team that
    does not exist) or every team's with ``all_teams=true`` (anyone else: 403); each job
    names its team. When more follow, the
    answer has ``Link: </v1/jobs?...&after=CURSOR>; rel="next"`` (same filters); the body
    stays a plain list. A cursor this endpoint did not give is a 422 on ``after``."""
    filters = JobFilters(
        id_prefix=id_prefix, user=user, project=project, experiment=experiment, label=label
    )
    jobs, cursor = await commands.list_jobs(
        pool, caller, status, limit, after, filters, team=team, all_teams=all_teams
    )
    query = {
        "limit": str(limit),
        **({"status": str(status)} if status else {}),
        **filters.query(),
        **({"team": team} if team else {}),
        **({"all_teams": "true"} if all_teams else {}),
    }
    return paging.listed(jobs, "/v1/jobs", query, cursor)


@post(
    "/jobs/{job_id:str}/cancel",
    status_code=202,
    opt=needs(Role.MEMBER),
    responses=error_responses(404, 409, 412),
)
async def cancel_job(
    job_id: FromPath[str], pool: Pool, caller: Me, conditions: Conditions
) -> Response[JobView]:
    """Ask for the job's cancel; with ``If-Match: <ETag>`` (of ``GET``) only while the job
    is where it was read in its life (412 naming what changed: it was requeued, restarted,
    its cancel already asked); nothing changed on a 412."""
    view = await commands.cancel_job(pool, caller, job_id, conditions)
    return tagged(view, commands.job_tag(view), status_code=202)


@get("/jobs/{job_id:str}/logs", responses=error_responses(404), opt=body_is_work())
async def job_logs(
    job_id: FromPath[str],
    pool: Pool,
    objects: Store,
    caller: Me,
    settings: Config,
    after: FromQuery[str | None] = None,
    limit: LogLimit = 20,
) -> LogPage:
    return await commands.job_logs(
        pool, objects, caller, job_id, after, limit, settings.log_page_max_bytes
    )


@head_of_get("/jobs/{job_id:str}/logs")
async def job_logs_head(
    job_id: FromPath[str],
    pool: Pool,
    caller: Me,
    after: FromQuery[str | None] = None,
    limit: LogLimit = 20,
) -> Response[None]:
    """``GET``'s status and type without reading a log (``commands.job_logs_head``)."""
    await commands.job_logs_head(pool, caller, job_id, after)
    return head_answer(MediaType.JSON)


async def json_body(request: AnyRequest, free_text: re.Pattern[str] | None = None) -> bytes:
    """The body of a JSON request, read up to ``JSON_BODY_MAX_BYTES`` (``read_json_body``;
    ``free_text``: the paths whose strings may hold tab, newline, CR)."""
    return await read_json_body(
        request,
        JSON_BODY_MAX_BYTES,
        free_text=lambda path: bool(free_text and free_text.fullmatch(path)),
    )


# --- code bundles ----------------------------------------------------------------------


class UploadsUnderWay:
    """How many bundle uploads each team has under way (``held_by``): at most
    ``per_team`` at once across every replica of the service (places held in its database,
    ``shared.slots``); one more is refused (429) before its body is read."""

    def __init__(self, per_team: int, places: Slots) -> None:
        self.per_team = per_team
        self.places = places

    @asynccontextmanager
    async def held_by(self, caller: Caller) -> AsyncIterator[None]:
        """A place for ``caller``'s team while the block runs; ``RateLimited`` (429 with
        ``Retry-After``) when the team has ``per_team`` under way."""

        def refused() -> RateLimited:
            return RateLimited(
                f"too many bundle uploads at once: team {caller.team} has "
                f"{self.per_team} under way, the most a team may "
                f"(TRAINYARD_SUBMISSION_BUNDLE_UPLOADS_PER_TEAM); retry after "
                f"{UPLOAD_RETRY_AFTER_S} s",
                retry_after=UPLOAD_RETRY_AFTER_S,
                field="Authorization",
                message=f"the token's team has {self.per_team} bundle uploads under way, "
                "the most a team may",
            )

        async with self.places.held(f"team:{caller.team_id}", self.per_team, refused):
            yield


UPLOAD_RETRY_AFTER_S = 5
Uploads = NamedDependency[UploadsUnderWay]


@head(
    "/bundles/{sha256:str}",
    responses={404: ResponseSpec(None, description="the caller's team has no such bundle")},
)
async def bundle_stored(sha256: Sha256, objects: Store, caller: Me) -> Response[None]:
    size = await objects.bundle_size(caller.team, _bundle_sha256(sha256))
    return Response(content=None, status_code=404 if size is None else 200)


@put(
    "/bundles/{sha256:str}",
    status_code=201,
    request_max_body_size=None,
    opt=needs(Role.MEMBER),
    operation_class=bytes_request_body("the bundle (.tar.gz) whose sha256 the path names"),
    responses={
        200: ResponseSpec(
            BundleStored, description="the team had it already", generate_examples=False
        ),
        **error_responses(413),
    },
)
async def upload_bundle(
    request: AnyRequest,
    sha256: Sha256,
    objects: Store,
    caller: Me,
    settings: Config,
    uploads: Uploads,
) -> Response[BundleStored]:
    sha256 = _bundle_sha256(sha256)
    limit = settings.bundle_max_bytes
    # Spooled to a file as it comes, never held whole; each upload under way takes up to
    # ``limit`` of the service's disk, so a team has at most its share of them at once.
    async with uploads.held_by(caller):
        stored = await _store_bundle(request, sha256, objects, caller, limit)
    return Response(stored, status_code=201 if stored.created else 200)


async def _store_bundle(
    request: AnyRequest, sha256: str, objects: Objects, caller: Caller, limit: int
) -> BundleStored:
    with tempfile.TemporaryDirectory(prefix="trainyard-bundle-") as folder:
        path = Path(folder) / "bundle.tar.gz"
        digest = await spool_body(
            request,
            path,
            limit,
            f"bundle too large: this server accepts at most {limit} bytes "
            f"({limit / 2**20:.1f} MiB); leave large files out with .trainyardignore",
        )
        if digest != sha256:
            raise RequestInvalid.one(
                "body", f"the body's sha256 is {digest}, not the {sha256} named in the path"
            )
        try:  # the runner's own rule, so what is stored is what a runner unpacks
            await asyncio.to_thread(_check_bundle_file, path)
        except BundleRefused as exc:
            raise RequestInvalid.one("body", f"not a code bundle a runner unpacks: {exc}") from None
        created = await objects.put_bundle(caller.team, sha256, path)
        size = path.stat().st_size
    return BundleStored(sha256=sha256, size_bytes=size, team=caller.team, created=created)


def _check_bundle_file(path: Path) -> None:
    with path.open("rb") as archive:
        check_bundle(archive)


def _bundle_sha256(value: str) -> str:
    if not re.fullmatch(BUNDLE_SHA256_PATTERN, value):
        raise RequestInvalid.one("sha256", "must be 64 lowercase hex digits (a sha256)")
    return value


# --- authentication --------------------------------------------------------------------


class RateLimits(UserRateLimits):
    """The buckets of reads and of writes, per user and per team (see the module), and how
    a submission's request spends them."""

    def check(
        self,
        connection: ASGIConnection[Any, Any, Any, Any],
        handler: BaseRouteHandler,
        caller: Caller,
    ) -> None:
        """Spend a token of ``caller``'s bucket of writes or of reads
        (``shared.access.is_write`` says which the request spends), and one of its team's;
        429 when either is empty, and then neither is spent. The team's bucket is asked
        second: a user past its own limit spends nothing of its teammates'. The 429 of a
        request that is no read but spends one (a dry run) says that it counts as a read.
        A write to a ``ratelimit.replays_as_read()`` route under an ``Idempotency-Key``
        spends a read and owes its write (``ratelimit.owed_write``), or, where the reads
        are spent, the write now."""
        reads, writes = self.reads, self.writes
        user, team = caller.user_id, caller.team_id
        write = is_write(connection, handler)
        if (
            write
            and defers_its_write(handler.opt, connection.headers)
            # Where the reads are spent, the write is charged now, as for any submission.
            and reads.take(user, team) is None
        ):
            owe_write(connection.scope["state"], OwedWrite(reads, writes, user, team))
            return
        why = COUNTED_AS_READ if stores_nothing(connection, handler) else ""
        refused = self.take(write, user, team, why)
        if refused is not None:
            raise refused


def caller_guard(
    pool: asyncpg.Pool,
    limits: RateLimits | None = None,
    flavors: Sequence[str] = (),
    known: KnownCallers | None = None,
    failures: FailedAuthentications | None = None,
) -> Guard:
    """The app-level guard: every route but the probes (``shared.access.OPEN_PATHS``),
    the OpenAPI schema included, needs a valid user token; the caller is kept for
    ``resolve_caller``, and spends a token of ``limits`` (429 when there is none). On a
    route marked ``screened()`` (submissions) the same query also reads the team's
    ``governance.Screening`` (``flavors``: the bootstrap list), kept for ``screening_of``;
    on such a route marked ``remembered`` (with ``release_held``), a token ``known``
    remembers is let in on what it remembers, without a query (``known_callers``: the
    handler checks it all again). Each of its 401s is counted against the client's address
    in ``failures`` (``failed_auth``), which answers 429 before any lookup once the address
    has failed too often."""
    known = KnownCallers() if known is None else known

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        if is_open_probe(connection):
            return
        token = presented_token(connection.headers)  # two Authorization headers: nobody's
        token_hash = None if token is None else hash_token(token)
        if failures is None:
            await authenticated(connection, handler, token, token_hash)
            return
        address = _client_address(connection)
        refused = failures.refusal(address, token_hash)
        if refused is not None:
            raise refused
        try:
            await authenticated(connection, handler, token, token_hash)
        except NotAuthorizedException:
            failures.failed(address, token_hash)
            raise
        if token_hash is not None:
            failures.succeeded(token_hash)

    async def authenticated(
        connection: ASGIConnection[Any, Any, Any, Any],
        handler: BaseRouteHandler,
        token: str | None,
        token_hash: str | None,
    ) -> None:
        if token is None or token_hash is None:
            raise NotAuthorizedException(UNAUTHENTICATED)
        # The scope's own dict: ``connection.state`` wraps it in a new ``State`` each time.
        state = connection.scope["state"]
        if handler.opt.get(_SCREENED):
            # The submission's own statement runs on this connection too: one pool round
            # (about as costly as the query itself) per request instead of two. Only on a
            # route with ``release_held``, which gives it back whatever happens next.
            if release_held in (handler.middleware or ()):
                remembered = known.get(token_hash) if handler.opt.get(_REMEMBERED) else None
                if _let_in_known(connection, handler, remembered, limits):
                    return
                await _check_held(connection, handler, pool, flavors, known, token_hash, limits)
                return
            found = await identity.authenticate_screened(pool, token, flavors)
            if found is None:
                raise NotAuthorizedException(UNAUTHENTICATED)
            caller, state[_SCREENING] = found
        else:
            plain = await identity.authenticate(pool, token)
            if plain is None and handler.opt.get(_ROTATION_RETRY):
                plain = await _rotation_retry(connection, pool, token)
            if plain is None:
                raise NotAuthorizedException(UNAUTHENTICATED)
            caller = plain
        if limits is not None:
            limits.check(connection, handler, caller)
        enforce_least_role(caller.principal, connection, handler)
        state[_CALLER] = caller
        remember(connection, caller.principal)

    return guard


def _client_address(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The client's address as uvicorn gives it: the TCP peer's, or, when the peer is one of
    ``FORWARDED_ALLOW_IPS`` (uvicorn's own variable; loopback only by default), the address
    its ``X-Forwarded-For`` names. No other header is read. ``failed_auth`` keys it
    (``shared.ratelimit.client_key``: an IPv6 address by its /64)."""
    client = connection.client
    return client.host if client is not None else "unknown"


async def _rotation_retry(
    connection: ASGIConnection[Any, Any, Any, Any], pool: asyncpg.Pool, token: str
) -> identity.Caller | None:
    """The caller of a token that is not valid, on ``POST /v1/tokens/rotate`` alone, when
    the request is the retry of the rotation that revoked it under its ``Idempotency-Key``
    (``identity.authenticate_rotation_replay``); None otherwise (a key that is not one
    included: the 401 of any token that is not valid)."""
    key = connection.headers.get("Idempotency-Key")
    if key is None or not IDEMPOTENCY_KEY.fullmatch(key):
        return None
    return await identity.authenticate_rotation_replay(pool, token, key)


_CALLER = "trainyard_caller"
_SCREENING = "trainyard_screening"
_KNOWN = "trainyard_known_caller"


def _let_in_known(
    connection: ASGIConnection[Any, Any, Any, Any],
    handler: BaseRouteHandler,
    known: KnownCaller | None,
    limits: RateLimits | None,
) -> bool:
    """Let a request in on a remembered caller (its rate limit spent, its role as
    remembered); False, with nothing spent, where the full check must decide (nothing
    remembered, a month or expiry passed, or any refusal: its answer is the full check's)."""
    if known is None or not known.usable(*month_and_now()):
        return False
    try:
        enforce_least_role(known.caller.principal, connection, handler)
    except Exception:
        return False
    if limits is not None:
        try:
            limits.check(connection, handler, known.caller)
        except RateLimited:
            # A refused take spends nothing: the full check takes (and refuses) again.
            return False
    state = connection.scope["state"]
    state[_KNOWN], state[_CALLER], state[_SCREENING] = known, known.caller, known.screening
    remember(connection, known.caller.principal)
    return True


async def _check_held(
    connection: ASGIConnection[Any, Any, Any, Any],
    handler: BaseRouteHandler,
    pool: asyncpg.Pool,
    flavors: Sequence[str],
    known: KnownCallers,
    token_hash: str,
    limits: RateLimits | None,
) -> None:
    """The full check of a ``screened()`` route with ``release_held``: the token, caller
    and screening read on a connection held for the request (401 when the token is not
    valid), ``limits`` spent (none: already spent), the role enforced. What it read is
    remembered for the token's next request (``known_callers``), audited callers aside.

    The connection is held only once the request's body is in (``_body_in``): a client
    sending its body slowly must not hold a connection of the pool meanwhile, or as many
    such requests as the pool has connections would take them all. A body that cannot be
    read here (no ``Content-Length``, or one past ``JSON_BODY_MAX_BYTES``) is checked on a
    connection given back at once; the route then takes its own for its statement."""
    state = connection.scope["state"]
    held = state.get(_HELD)
    if held is None and await _body_in(connection):
        held = state[_HELD] = (pool, await pool.acquire())
    if held is not None:
        found = await known_callers.check(held[1], token_hash, flavors)
    else:
        async with pool.acquire() as conn:
            found = await known_callers.check(conn, token_hash, flavors)
    if found is None:
        known.forget(token_hash)
        raise NotAuthorizedException(UNAUTHENTICATED)
    if audit.must_record(found.caller.principal):
        known.forget(token_hash)
    else:
        known.remember(found)
    caller = found.caller
    state[_SCREENING] = found.screening
    if limits is not None:
        limits.check(connection, handler, caller)
    enforce_least_role(caller.principal, connection, handler)
    state[_CALLER] = caller
    remember(connection, caller.principal)


async def _body_in(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """Read the request's whole body now, kept for the route (``Request.body``), when its
    ``Content-Length`` announces at most ``JSON_BODY_MAX_BYTES``: the server delivers no
    more than that, so no more is held in memory than the route would read. False (nothing
    read) for any other body, which the route reads and refuses itself. True when the
    route read the body already (a token checked again after it)."""
    if not isinstance(connection, Request):
        return False
    if not connection.is_connected:
        return True  # the body's stream was read to its end
    announced = connection.headers.get("content-length", "")
    if not announced.isdigit():
        return False
    if int(announced) > JSON_BODY_MAX_BYTES:
        return False
    await connection.body()
    return True


async def request_screening(
    request: AnyRequest, pool: asyncpg.Pool, settings: Settings, team: str
) -> governance.Screening:
    """The ``Screening`` the guard read for a ``screened`` route (read now otherwise)."""
    found = request.scope["state"].get(_SCREENING)
    if isinstance(found, governance.Screening) and found.team == team:
        return found
    return await governance.screening(pool, settings.flavors, team)


def resolve_caller(request: AnyRequest) -> Caller:
    """The caller ``caller_guard`` authenticated (it runs before any handler)."""
    caller = request.scope["state"].get(_CALLER)
    if not isinstance(caller, Caller):
        raise NotAuthorizedException(UNAUTHENTICATED)
    return caller


# --- the app ---------------------------------------------------------------------------


def create_app(settings: Settings, deps: AppDeps) -> Litestar:
    """The submission API over ``deps.pool``, with the runtime's health routes."""

    def provide_pool() -> asyncpg.Pool:
        return deps.pool

    def provide_settings() -> Settings:
        return settings

    objects = Objects(deps.store)
    admission = DataAdmission(settings.registry_url, deps.registry_transport)

    def provide_objects() -> Objects:
        return objects

    def provide_admission() -> DataAdmission:
        return admission

    # Closed when the app stops (``on_shutdown``): a place held then is given back, and no
    # renewer runs on until the process exits.
    upload_places = Slots(deps.pool, "submission.bundle_uploads")
    uploads = UploadsUnderWay(settings.bundle_uploads_per_team, upload_places)

    def provide_uploads() -> UploadsUnderWay:
        return uploads

    known = KnownCallers()
    writer = deps.group_commit or GroupCommit(deps.pool)
    front = Front(deps.pool, objects, settings, admission, known, writer)

    def provide_front() -> Front:
        return front

    v1 = Router(
        "/v1",
        route_handlers=[
            whoami,
            whoami_for_write,
            team,
            create_user,
            list_users,
            get_user,
            change_role,
            disable_user,
            list_tokens,
            create_token,
            rotate_token,
            revoke_token,
            submit_job,
            get_job,
            list_jobs,
            cancel_job,
            reproduce_job,
            job_logs,
            job_logs_head,
            bundle_stored,
            upload_bundle,
            job_schema,
        ],
        dependencies={"caller": Provide(resolve_caller, sync_to_thread=False)},
    )
    return service_app(
        "submission",
        [
            *deps.health_handlers,
            v1,
            audit_route(deps.pool, "submission"),
            *dashboard_routes(settings),
        ],
        caller_guard(
            deps.pool,
            RateLimits.of(settings),
            settings.flavors,
            known,
            (
                FailedAuthentications(settings.failed_auth_rate_per_s, settings.failed_auth_burst)
                if settings.failed_auth_burst
                else None  # off (the default): see ``Settings.failed_auth_burst``
            ),
        ),
        statuses={NotFound: 404, Forbidden: 403, Conflict: 409, RegistryUnavailable: 503},
        errors=(429,),
        dependencies={
            "pool": Provide(provide_pool, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
            "objects": Provide(provide_objects, sync_to_thread=False),
            "admission": Provide(provide_admission, sync_to_thread=False),
            "uploads": Provide(provide_uploads, sync_to_thread=False),
            "front": Provide(provide_front, sync_to_thread=False),
        },
        on_shutdown=[upload_places.close],
    )
