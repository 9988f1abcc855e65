"""Who is calling, and what each role may do: the one access model of every service.

Contract:
- Roles rank ``viewer < member < admin`` within a team, and ``operator`` above all of them on
  the whole platform (Kubernetes' view/edit/admin/cluster-admin, in that order):
  * viewer: read the team's jobs, logs, metrics, models and costs; manage its own tokens;
  * member: also submit jobs, upload code, cancel its own jobs;
  * admin: also manage the team's users and tokens, and cancel any of the team's jobs;
  * operator: queues, quotas, flavors, priority classes, dead letters, the audit log, and
    every team's data.
- A ``Principal`` is the caller a service authenticated: a user of a team (from a user
  token, which only the submission service can check: it owns users, teams and tokens) or
  the service's own operator credential (``OPERATOR_TOKEN_ACTOR``, no team, no token id).
- ``IdentityClient`` is how every other service checks a user token: it asks the submission
  service ``GET /v1/me`` with that very token, on every request (``POST /v1/me`` for a
  write request, so that the check spends one of the user's writes, not a read: a user's
  writes to any service have the write rate limit). Nothing is cached, so a revoked or
  expired token is refused at once everywhere. It never logs a token.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Final
from urllib.parse import quote

import httpx

from trainyard_platform.shared.logs import Throttle, held_back

log = logging.getLogger(__name__)


class Role(StrEnum):
    VIEWER = "viewer"
    MEMBER = "member"
    ADMIN = "admin"
    OPERATOR = "operator"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK: Final[dict[Role, int]] = {
    Role.VIEWER: 0,
    Role.MEMBER: 1,
    Role.ADMIN: 2,
    Role.OPERATOR: 3,
}

OPERATOR_TOKEN_ACTOR: Final = "operator-token"
"""The actor name of a request made with a service's configured operator token."""


class Denied(Exception):
    """The caller is authenticated but its role does not allow this (answered 403)."""


class IdentityUnavailable(Exception):
    """The identity service (submission) could not be asked (answered 503)."""


class IdentityRateLimited(Exception):
    """The identity service would not check the token now because the caller's own rate
    limit is spent (each check is one of the user's reads): answered 429 with the identity
    service's reason and ``retry_after`` (whole seconds)."""

    def __init__(self, detail: str, retry_after: str) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: ``user`` of ``team`` with ``role``; ``token_id`` names the
    token it used (None for the operator token)."""

    user: str
    team: str | None
    role: Role
    token_id: int | None

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR

    def has(self, role: Role) -> bool:
        """True when this caller's role is ``role`` or ranks above it."""
        return self.role.rank >= role.rank

    def require(self, role: Role, doing: str) -> None:
        """Raise ``Denied`` (403) unless the caller has at least ``role``."""
        if not self.has(role):
            raise Denied(f"{doing} needs the {role} role; you are {self.role}")

    def may_see_team(self, team: str) -> bool:
        """A team's data is visible to its own users and to operators."""
        return self.is_operator or self.team == team

    @property
    def actor(self) -> str:
        """How the audit log names the caller: ``team/user``, or the operator token."""
        return self.user if self.team is None else f"{self.team}/{self.user}"


def operator_token_principal() -> Principal:
    """The caller behind a service's configured operator token."""
    return Principal(user=OPERATOR_TOKEN_ACTOR, team=None, role=Role.OPERATOR, token_id=None)


def _address(client: str | None) -> str | None:
    """``client`` as given, when it is an IP address that a header can carry; else None.
    Not rewritten (``::ffff:203.0.113.9`` stays so): submission keys its bucket by
    ``shared.ratelimit.client_key`` of the address it is given, as it does a client's that
    reaches it directly (``::ffff:203.0.113.9`` as ``203.0.113.9``, an IPv6 one by its
    /64)."""
    if not client or not client.isascii() or not client.isprintable() or " " in client:
        return None  # an IPv6 zone (``%eth0``) may be anything ``ip_address`` takes
    try:
        ipaddress.ip_address(client)
    except ValueError:
        return None
    return client


class IdentityClient:
    """Checks user tokens with the submission service (``GET {base_url}/v1/me``)."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 5.0,
        http: httpx.AsyncClient | None = None,
        *,
        setting: str = "the identity URL",
    ):
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout_s)
        self._where = f"{setting}: {base_url}"
        self._throttle = Throttle()

    def _unavailable(self, reason: str, detail: str = "") -> IdentityUnavailable:
        """The error a request answers 503 with (``reason``), logged for the operator with
        ``detail``: once per reason a minute (``logs.Throttle``), as every request with a
        user token meets it while it lasts."""
        repeats = self._throttle.due(reason)
        if repeats is not None:
            log.warning(
                "user tokens cannot be checked (%s): %s%s; their requests answer 503%s",
                self._where,
                reason,
                f": {' '.join(detail.split())}" if detail else "",
                held_back(repeats),
            )
        return IdentityUnavailable(reason)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def principal(
        self, token: str, *, write: bool = False, client: str | None = None
    ) -> Principal | None:
        """The user behind ``token``, or None when the token is not valid now (unknown,
        revoked, expired, or its user disabled); asked for a write request (``write``), it
        spends one of the user's writes (``POST /v1/me``), else a read (``GET``). Raises
        ``IdentityUnavailable`` when the identity service cannot answer. ``client``: the
        address of the caller that presented ``token``, named in ``X-Forwarded-For`` so
        that the identity service counts a refused token against that caller, not against
        this service's address that every user's check comes from (believed only where
        this service is one of its ``FORWARDED_ALLOW_IPS``: docs/security.md, "Rate
        limits"). Only an IP address is named: a peer in this service's own
        ``FORWARDED_ALLOW_IPS`` may make ``client`` anything, and a value that is none
        (beyond ASCII, with spaces) names no one, so the check goes on as if unnamed."""
        headers = {"Authorization": f"Bearer {token}"}
        forwarded = _address(client)
        if forwarded is not None:
            headers["X-Forwarded-For"] = forwarded
        try:
            if write:
                response = await self._http.post("/v1/me", headers=headers)
                if response.status_code == 405:
                    # A submission service from before POST /v1/me (a rolling upgrade):
                    # checked as before, spending a read.
                    response = await self._http.get("/v1/me", headers=headers)
            else:
                response = await self._http.get("/v1/me", headers=headers)
        except httpx.HTTPError as exc:
            raise self._unavailable(
                f"identity service unreachable ({type(exc).__name__})", str(exc)
            ) from None
        if response.status_code == 401:
            return None
        if response.status_code == 429:
            raise rate_limited(response)
        if response.status_code != 200:
            raise self._unavailable(f"identity service answered {response.status_code}")
        try:
            me = response.json()
            return Principal(
                user=str(me["user"]),
                team=str(me["team"]),
                role=Role(me["role"]),
                token_id=int(me["token_id"]),
            )
        except (ValueError, KeyError, TypeError):
            raise self._unavailable("identity service answered something unexpected") from None

    async def team_exists(self, token: str, team: str) -> bool:
        """Whether the identity service (which owns teams) knows ``team``, asked with the
        caller's own ``token`` (``GET /v1/teams/{team}``). Raises ``IdentityUnavailable``
        when it cannot answer and ``IdentityRateLimited`` as ``principal`` does."""
        if not team.strip("."):
            return False  # a path segment of dots only would be resolved away by the URL
        try:
            response = await self._http.get(
                f"/v1/teams/{quote(team, safe='')}", headers={"Authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError as exc:
            raise self._unavailable(
                f"identity service unreachable ({type(exc).__name__})", str(exc)
            ) from None
        if response.status_code == 429:
            raise rate_limited(response)
        if response.status_code in (404, 422):  # 422: not even a valid team name
            return False
        if response.status_code != 200:
            raise self._unavailable(f"identity service answered {response.status_code}")
        return True


def rate_limited(response: httpx.Response) -> IdentityRateLimited:
    """A Trainyard service's 429, asked with the caller's own token (the identity service's,
    or another service's whose own limit or token check refused it), as the caller's: its
    reason and ``Retry-After`` (at least 1 second; whole seconds only, whatever it sent)."""
    retry = response.headers.get("Retry-After", "")
    retry = retry if retry.isascii() and retry.isdigit() and int(retry) >= 1 else "1"
    try:
        body = response.json()
        detail = str(body["detail"]) if isinstance(body, dict) and body.get("detail") else ""
    except ValueError:
        detail = ""
    return IdentityRateLimited(detail or "rate limit exceeded", retry)
