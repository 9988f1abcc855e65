"""Authentication of every HTTP endpoint of every service, and the caller it yields.

Contract:
- Every service's app is built with one app-level guard, so a route added later is
  authenticated without anyone remembering to. The only routes open to anyone are the probes
  in ``OPEN_PATHS`` (``/healthz``, ``/readyz``): they say whether the process is alive and
  ready, nothing about the cluster; the Prometheus scrape (``/metrics``: counts by route,
  event type, queue, flavor and state, no user, job or token; ``shared.metrics``); and
  routes declared ``opt=public_asset()``: files that ship with the code (the web dashboard's
  HTML, scripts and styles, and the public URLs of the services it calls), which hold no
  data of anyone. The dashboard then calls the APIs with
  the user's token like any other client.
- ``service_guard`` (scheduler, registry, billing, runner) accepts two credentials in
  ``Authorization: Bearer <token>``:
  * the service's operator token (``TRAINYARD_<SERVICE>_ADMIN_TOKEN``, compared in constant
    time): the caller is ``shared.identity.operator_token_principal()``;
  * a user token, checked with the submission service on every request
    (``shared.identity.IdentityClient``, when the service has an ``identity_url``): the
    caller is that user with its team and role. The check of a ``GET`` or ``HEAD``, of a
    route declared ``opt=only_reads()`` (a ``POST`` that computes an answer from a body
    and stores nothing), or of a dry run of a route declared ``opt=only_reads("dry_run")``
    (``?dry_run=true``: checked as the real request is, nothing stored) spends one of the
    user's reads, of anything else one of its writes (submission's rate limits), so a
    user's writes are limited alike on every service, and a request that writes nothing
    leaves the user's writes to the requests that do. The check names the caller's address
    (``X-Forwarded-For``), against which submission counts a wrong token where it trusts
    this service (``services.submission.failed_auth``).
  A request with a user token then spends a read or a write (as its check did) of that
  user's bucket and its team's at this service (``shared.ratelimit``, built by ``guard_for``
  from the service's ``read_rate_per_s``, ``read_burst``, ``write_rate_per_s``,
  ``write_burst`` and ``team_rate_factor``): past them it is 429 in the shared error shape,
  naming ``Authorization``, the limit and the service, with ``Retry-After``, before its role
  is checked or its handler runs. The user's buckets at submission, which its token check
  spends, are shared by all the services; these bound what one user takes of this one, on
  each of its replicas. A request with the operator token spends a read or a write of the
  token's own buckets at this service (``shared.ratelimit.OperatorRateLimits``, built by
  ``guard_for``: ``operator_rate_factor`` times a user's rates and bursts, generous so
  that operations do not meet them), at the same point: past them it is 429 naming the
  operator token's limit and the service. The probes need no token and spend nothing.
  Anything else is 401; a missing header, a malformed one (a token that is not RFC 6750's
  ``b64token`` or is over 1024 characters, or ``Authorization`` given twice:
  ``shared.auth.presented_token``) and a wrong, revoked or expired token are not told apart. The identity service being down is 503, never an open door.
- Each route declares the least role it needs with ``opt=needs(Role.X)`` (default: any
  authenticated caller, i.e. viewer); the guard refuses a caller below it with 403 before
  the handler runs or the body is read (``enforce_least_role``). Handlers receive the caller
  as the ``principal`` dependency (``principal_dependency``) for finer checks (whose team).
- A handler about to store a reference to another team (a grant, a budget set by an
  operator, a scheduler queue for a team it has not seen) asks the ``teams`` dependency (``Teams.require``): only the submission service
  knows which teams exist, so it is asked with the caller's own user token
  (``IdentityClient.team_exists``). A team that does not exist is a 422 naming the field;
  with the service's operator token there is no user token to ask with, and the reference
  is refused the same way (saying so), never stored unchecked.
- The operator token is a required setting of each operator service: a service started
  without it exits with status 2 naming the variable. No configuration opens an endpoint.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import httpx
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard
from pydantic import SecretStr

from trainyard_platform.shared.auth import presented_token
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.identity import (
    IdentityClient,
    Principal,
    Role,
    operator_token_principal,
)
from trainyard_platform.shared.ratelimit import (
    COUNTED_AS_READ,
    OperatorRateLimits,
    UserRateLimits,
)
from trainyard_platform.shared.settings import GuardedServiceSettings

OPEN_PATHS: Final[frozenset[str]] = frozenset({"/healthz", "/readyz", "/metrics"})
"""Request paths answered without a token: the liveness and readiness probes, and the
Prometheus scrape (counts by route, queue and flavor only: ``shared.metrics``)."""

UNAUTHENTICATED: Final = (
    "missing, invalid, expired or revoked token (Authorization: Bearer <token>)"
)
_PRINCIPAL: Final = "trainyard_principal"
_TEAMS: Final = "trainyard_teams"

TeamExists = Callable[[str], Awaitable[bool]]
"""Whether a team exists, asked for the authenticated caller (``IdentityClient.team_exists``
bound to the caller's token)."""


@dataclass(frozen=True)
class Teams:
    """The ``teams`` dependency: checks a team a request names before it is stored."""

    exists: TeamExists | None
    """None: the caller has no user token to ask with (the service's operator token)."""

    async def require(self, team: str, field: str) -> None:
        """Raise ``RequestInvalid`` (422 naming ``field``) unless ``team`` exists; the
        identity service being down raises ``IdentityUnavailable`` (503)."""
        if self.exists is None:
            raise RequestInvalid.one(
                field,
                f"cannot check that team {team!r} exists with the service's operator token "
                "(teams are known to the submission service, asked with a user's token): "
                "use an operator user's token",
            )
        if not await self.exists(team):
            raise RequestInvalid.one(field, f"no team {team!r}")


_PUBLIC_ASSET: Final = "public_asset"


def public_asset() -> dict[str, Any]:
    """The ``opt`` of a route that serves a file shipped with the code to anyone (see the
    module): no token is asked for. Never for a route that reads the database or the store."""
    return {_PUBLIC_ASSET: True}


def is_open_probe(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """True when the request is for one of ``OPEN_PATHS`` (exactly: no prefix, no suffix), or
    for a route declared ``public_asset()``."""
    if connection.scope["path"] in OPEN_PATHS:
        return True
    handler = connection.scope.get("route_handler")
    return handler is not None and handler.opt.get(_PUBLIC_ASSET) is True


def service_guard(
    admin_token: SecretStr,
    identity: IdentityClient | None = None,
    limits: UserRateLimits | None = None,
    operator_limits: OperatorRateLimits | None = None,
) -> Guard:
    """An app-level guard: every route but the probes needs the operator token or (with
    ``identity``) a valid user token, whose request spends a read or a write of its user's
    and team's ``limits``, or, with the operator token, of ``operator_limits`` (none: not
    limited here). Raises ``ValueError`` for an empty operator token."""
    expected = admin_token.get_secret_value().encode()
    if not expected.strip():
        raise ValueError("the operator (admin) token must not be empty")

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        if is_open_probe(connection):
            return
        presented = presented_token(connection.headers)
        if presented is None:
            raise NotAuthorizedException(UNAUTHENTICATED)
        principal: Principal | None = None
        teams: TeamExists | None = None
        if secrets.compare_digest(presented.encode(), expected):
            principal = operator_token_principal()
            if operator_limits is not None:
                why = COUNTED_AS_READ if stores_nothing(connection, handler) else ""
                refused = operator_limits.take(is_write(connection, handler), why)
                if refused is not None:
                    raise refused
        elif identity is not None:
            # The caller's address goes with the check: a wrong token is counted against
            # it at the identity service, not against this service's, which every user's
            # check comes from (``IdentityClient.principal``).
            client = connection.client.host if connection.client is not None else None
            write = is_write(connection, handler)
            principal = await identity.principal(presented, write=write, client=client)
            teams = _asking(identity, presented)
            if principal is not None and limits is not None:
                # Keyed by the user the token resolved to (names are unique within a team).
                why = COUNTED_AS_READ if stores_nothing(connection, handler) else ""
                refused = limits.take(write, (principal.team, principal.user), principal.team, why)
                if refused is not None:
                    raise refused
        if principal is None:
            raise NotAuthorizedException(UNAUTHENTICATED)
        enforce_least_role(principal, connection, handler)
        remember(connection, principal, teams)

    return guard


def _asking(identity: IdentityClient, token: str) -> TeamExists:
    """``identity.team_exists`` on behalf of ``token``'s user, asked only when a route needs
    it."""

    async def exists(team: str) -> bool:
        return await identity.team_exists(token, team)

    return exists


@asynccontextmanager
async def guard_for(
    settings: GuardedServiceSettings, http: httpx.AsyncClient | None = None
) -> AsyncIterator[Guard]:
    """The ``service_guard`` of a service's settings: its identity client (when
    ``identity_url`` is set; ``http``: how it reaches it, by default HTTP), closed on exit,
    and its users' and its operator token's rate limits (``UserRateLimits.of`` and
    ``OperatorRateLimits.of`` the settings, named after the service: ``TRAINYARD_REGISTRY_``
    is the registry service)."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    identity = (
        IdentityClient(settings.identity_url, http=http, setting=f"{prefix}IDENTITY_URL")
        if settings.identity_url
        else None
    )
    name = prefix.removeprefix("TRAINYARD_").strip("_").lower()
    to = f" to the {name} service" if name else ""
    limits = UserRateLimits.of(settings, to)
    try:
        yield service_guard(
            settings.admin_token, identity, limits, OperatorRateLimits.of(settings, to)
        )
    finally:
        if identity is not None:
            await identity.aclose()


_READS: Final = frozenset({"GET", "HEAD"})
"""Methods whose token check spends a read of the user's rate limit; any other spends a
write (``IdentityClient.principal``), unless the route is declared ``only_reads()``."""
_ONLY_READS: Final = "only_reads"
_TRUE: Final = frozenset({"true", "1"})
"""The values of a dry-run query parameter that make a request a read here: a subset of
those the route's ``bool`` parameter reads as true, so no request counted as a read is a
real write (``TRUE`` counts as a write, though the route reads it as a dry run)."""


def only_reads(when: str | None = None) -> dict[str, Any]:
    """The ``opt`` of a route whose method is not ``GET`` but which changes nothing (it
    answers from its request body, as a cost estimate does): its calls count as reads in
    the user's rate limits (module docstring). With ``when``, the name of the route's
    ``bool`` query parameter that makes a request a dry run (``dry_run``), only dry runs
    count as reads: a request whose every ``when`` is ``true`` or ``1`` (repeated, the
    route reads one of them); any other spends a write."""
    return {_ONLY_READS: when or True}


def is_write(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> bool:
    """Whether the request spends a write of its user's rate limit: any method but ``GET``
    and ``HEAD``, unless the route is declared ``only_reads()`` (``only_reads(when)``: and
    the request is a dry run)."""
    method = str(connection.scope.get("method", "GET"))
    if method in _READS:
        return False
    declared = handler.opt.get(_ONLY_READS)
    if declared is True:
        return False
    if isinstance(declared, str):
        values = connection.query_params.getall(declared, [])
        return not (values and all(value in _TRUE for value in values))
    return True


def stores_nothing(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> bool:
    """Whether the request is no ``GET`` or ``HEAD`` yet spends a read (``only_reads``):
    a 429 says why such a request met the read limit."""
    return str(connection.scope.get("method", "GET")) not in _READS and not is_write(
        connection, handler
    )


_LEAST_ROLE: Final = "least_role"


def needs(role: Role) -> dict[str, Any]:
    """The ``opt`` of a route that only ``role`` and those above it may call."""
    return {_LEAST_ROLE: role}


def enforce_least_role(
    principal: Principal,
    connection: ASGIConnection[Any, Any, Any, Any],
    handler: BaseRouteHandler,
) -> None:
    """Raise ``Denied`` (403) when ``principal`` ranks below the route's declared role."""
    role = handler.opt.get(_LEAST_ROLE, Role.VIEWER)
    principal.require(role, f"{connection.scope.get('method', '')} {connection.scope['path']}")


def remember(
    connection: ASGIConnection[Any, Any, Any, Any],
    principal: Principal,
    teams: TeamExists | None = None,
) -> None:
    """Keep the authenticated caller for ``principal_dependency`` (guards call this), and
    how to ask whether a team exists on its behalf (``Teams``; None: it cannot be asked)."""
    connection.state[_PRINCIPAL] = principal
    connection.state[_TEAMS] = Teams(teams)


def _principal(request: ASGIConnection[Any, Any, Any, Any]) -> Principal:
    principal = request.state.get(_PRINCIPAL)
    if not isinstance(principal, Principal):
        raise NotAuthorizedException(UNAUTHENTICATED)
    return principal


def _teams(request: ASGIConnection[Any, Any, Any, Any]) -> Teams:
    teams = request.state.get(_TEAMS)
    return teams if isinstance(teams, Teams) else Teams(None)


def principal_dependency() -> dict[str, Provide]:
    """The app dependencies ``principal`` (the caller the guard authenticated) and ``teams``
    (``Teams``, on the caller's behalf)."""
    return {
        "principal": Provide(_principal, sync_to_thread=False),
        "teams": Provide(_teams, sync_to_thread=False),
    }
