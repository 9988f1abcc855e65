"""Users, teams and tokens: who may call the platform, as the one service that owns them.

Contract:
- ``authenticate`` turns a bearer token into a ``Caller`` only while the token is unrevoked,
  unexpired and its user enabled; one primary-key lookup, no cache, so a revocation,
  expiry or disabling is refused by the very next request. The one revoked token let in
  is a rotation's, for that rotation's retry alone (``authenticate_rotation_replay``).
- Roles (``shared.identity.Role``): viewer < member < admin within a team; operator over the
  platform. A user is created by an admin of its team (roles up to admin) or by an operator
  (any team, any role, operator included). A user manages its own tokens; an admin manages
  those of its team's users but operators (``Forbidden``); an operator those of everyone. Another team's user or token
  is ``NotFound`` for anyone but an operator, exactly like one that does not exist.
- Every change to users or tokens is recorded in the audit log (``shared.audit``) in the
  same transaction. Tokens themselves are never stored (only their SHA-256), logged or
  recorded; a new token is in the response exactly once.
- ``POST /v1/tokens`` under an ``Idempotency-Key`` (``create_token``, ``replay_token``) makes
  one token per key and user: a retry of the same request answers that token without its
  secret (never stored), a different request under the key is a ``Conflict`` naming it.
- Rotation issues a new token with the old one's label and revokes the presented one, in
  one transaction: a client that got the answer holds a working token, and the old one is
  dead for every request from then on but one, the retry of that rotation. Under an
  ``Idempotency-Key`` (``rotate_token``, ``replay_rotation``) a client whose answer was
  lost presents the revoked token again with the same key and request, within
  ``ROTATION_REPLAY_WINDOW`` of the rotation (``authenticate_rotation_replay``), and is
  given the new token with a new secret, the lost one dead: never left holding no
  working secret, never holding two.
- A user's role change and disabling are conditional (``shared.http_app.Preconditions``)
  on its ``user_tag``, the ``ETag`` of ``GET /v1/admin/users/{name}``: with ``If-Match:
  <it>`` only while the user is as it was read (412 otherwise, nothing changed).
- A user holds at most ``LiveTokens.per_user`` live (unrevoked, unexpired) tokens and its
  team's users together at most ``LiveTokens.per_team`` (the settings
  ``live_tokens_per_user``/``_per_team``): issuing one more, a new user's first token
  included, is a ``Conflict`` (409) naming the limit, nothing stored. The count and the
  insert are one transaction behind a lock of the team's row, so issues in one team, on
  any replica, take turns and two at the bound cannot both pass. Rotation is not held to
  them: it revokes one and issues one, so it works at the bounds and past them (tokens
  issued before them, or a bound lowered since). ``bootstrap_user`` is not held to them
  either: it runs with the database's credentials, the way back in. Every token is
  checked on every request and listed in ``GET /v1/tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property

import asyncpg

from trainyard_platform.services.submission import identity_repository as repo
from trainyard_platform.services.submission.errors import Conflict, Forbidden, NotFound, UserExists
from trainyard_platform.services.submission.governance import Screening, current_month, screening_of
from trainyard_platform.services.submission.identity_schemas import (
    MeView,
    TeamView,
    TokenCreated,
    TokenRequest,
    TokenView,
    UserView,
    rotation_fingerprint,
    token_request_fingerprint,
)
from trainyard_platform.services.submission.schemas import (
    CreateUserRequest,
    UserCreated,
    new_team,
)
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.auth import hash_token, new_token
from trainyard_platform.shared.http_app import Preconditions, entity_tag
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.identity import Principal, Role


@dataclass(frozen=True)
class LiveTokens:
    """The most live (unrevoked, unexpired) tokens a user, and a team's users together, may
    hold (see the module); the settings ``live_tokens_per_user`` and ``_per_team``."""

    per_user: int
    per_team: int


@dataclass(frozen=True)
class Caller:
    """The user behind a request's bearer token."""

    user_id: int
    user: str
    team_id: int
    team: str
    role: Role
    token_id: int
    token_name: str = "default"
    expires_at: datetime | None = None
    replaced_by: int | None = None
    """Set only for a token revoked by a rotation, let in for that rotation's retry alone
    (``authenticate_rotation_replay``): the token the rotation made."""

    @cached_property
    def principal(self) -> Principal:
        """Made once per caller (a remembered caller serves many requests; each asks for it
        several times)."""
        return Principal(user=self.user, team=self.team, role=self.role, token_id=self.token_id)

    @property
    def is_admin(self) -> bool:
        """Admin of its team (operators included)."""
        return self.principal.has(Role.ADMIN)

    def require(self, role: Role, doing: str) -> None:
        self.principal.require(role, doing)

    def me(self) -> MeView:
        return MeView(
            user=self.user,
            team=self.team,
            role=str(self.role),
            token_id=self.token_id,
            token_name=self.token_name,
            expires_at=self.expires_at,
        )


async def authenticate(pool: asyncpg.Pool, token: str) -> Caller | None:
    async with pool.acquire() as conn:
        row = await repo.caller_by_token(conn, hash_token(token))
    return None if row is None else caller_of(row)


ROTATION_REPLAY_WINDOW = timedelta(minutes=15)
"""How long after a rotation under an ``Idempotency-Key`` the token it revoked is let in
for that rotation's retry (``authenticate_rotation_replay``). Other keys have no window:
they live as long as what they made, since their replay hands out no credential; this one's
does, so it is as short as a client's retries need (the CLI's take seconds)."""


async def authenticate_rotation_replay(
    pool: asyncpg.Pool, token: str, idempotency_key: str
) -> Caller | None:
    """The caller of a token that is not valid (``authenticate`` said None) only when it is
    exactly a rotation's retry: the token was revoked by a rotation made under
    ``idempotency_key``, no longer than ``ROTATION_REPLAY_WINDOW`` ago, and its user is
    enabled. The caller's ``replaced_by`` names the token that rotation made; the API lets
    such a caller into ``POST /v1/tokens/rotate`` alone, and ``replay_rotation`` then
    checks that the request is the one the key made. None for anything else, so a revoked
    token presented with a guessed key, or after the window, is refused as before."""
    since = datetime.now(UTC) - ROTATION_REPLAY_WINDOW
    async with pool.acquire() as conn:
        row = await repo.caller_by_rotated_token(conn, hash_token(token), idempotency_key, since)
    if row is None:
        return None
    return replace(caller_of(row), replaced_by=row["successor_id"])


async def authenticate_screened(
    pool: asyncpg.Pool, token: str, bootstrap: Sequence[str], now: datetime | None = None
) -> tuple[Caller, Screening] | None:
    """``authenticate``, and the caller team's ``governance.Screening`` (flavors from
    ``bootstrap`` and the catalogue, budgets), in one query."""
    async with pool.acquire() as conn:
        return await authenticate_screened_on(conn, token, bootstrap, now)


async def authenticate_screened_on(
    conn: asyncpg.Connection, token: str, bootstrap: Sequence[str], now: datetime | None = None
) -> tuple[Caller, Screening] | None:
    """``authenticate_screened`` on a connection the caller holds (the front door keeps
    it for the submission's own statement: one pool round per request, not two)."""
    row = await repo.caller_and_screening(conn, hash_token(token), current_month(now))
    if row is None:
        return None
    return caller_of(row), screening_of(row, bootstrap, row["team_name"])


def caller_of(row: asyncpg.Record) -> Caller:
    """The ``Caller`` of a row read by ``identity_repository.caller_by_token`` (or a query
    with its columns)."""
    return Caller(
        user_id=row["user_id"],
        user=row["user_name"],
        team_id=row["team_id"],
        team=row["team_name"],
        role=Role(row["role"]),
        token_id=row["token_id"],
        token_name=row["token_name"],
        expires_at=row["expires_at"],
    )


def _expiry(days: int | None) -> datetime | None:
    return None if days is None else datetime.now(UTC) + timedelta(days=days)


async def add_user(
    conn: asyncpg.Connection,
    team: str,
    name: str,
    role: Role,
    ttl_days: int | None,
    created_by: int | None = None,
    limits: LiveTokens | None = None,
) -> tuple[str, asyncpg.Record]:
    """Create ``team`` if needed and a user in it with a first token; return the token (shown
    once) and its row. With ``limits``, the team's live tokens must leave room for it
    (``Conflict`` naming ``team`` otherwise)."""
    team_id = await repo.ensure_team(conn, team)
    user_id = await repo.insert_user(conn, team_id, name, str(role))
    if user_id is None:
        raise UserExists(f"user {name!r} already exists in team {team!r}")
    if limits is not None:
        await _room_for_one(conn, limits, team_id, team, user_id, f"{team}/{name}", "team")
    token, token_hash = new_token()
    row = await repo.insert_token(
        conn, token_hash, user_id, "default", _expiry(ttl_days), created_by
    )
    return token, row


async def bootstrap_user(
    pool: asyncpg.Pool,
    team: str,
    name: str,
    role: Role = Role.ADMIN,
    ttl_days: int | None = None,
    reissue: bool = False,
) -> str:
    """The first admin of ``team`` (or an operator), creating the team; returns the token.

    When the team already has that user: raises ``UserExists``, unless ``reissue``, in which
    case an enabled user of that very role gets a new token (named "reissued"; its other
    tokens stay valid) -- the way back in for whoever holds the database's credentials and
    lost the token. A disabled user, or one of another role, still raises ``UserExists``."""
    bootstrap = Principal(user="bootstrap", team=None, role=Role.OPERATOR, token_id=None)
    async with pool.acquire() as conn, conn.transaction():
        try:
            token, row = await add_user(conn, team, name, role, ttl_days)
            action = "create user"
        except UserExists:
            if not reissue:
                raise
            token, row = await _reissue(conn, team, name, role, ttl_days)
            action = "reissue token"
        await audit.record(
            conn, bootstrap, action, f"{team}/{name}", {"role": str(role), "token_id": row["id"]}
        )
        return token


async def _reissue(
    conn: asyncpg.Connection, team: str, name: str, role: Role, ttl_days: int | None
) -> tuple[str, asyncpg.Record]:
    """A new token for the existing, enabled user ``team/name`` of ``role``."""
    team_id = await repo.team_id(conn, team)
    found = None if team_id is None else await repo.user(conn, team_id, name)
    if found is None:  # only when it was deleted since add_user saw it
        raise UserExists(f"user {name!r} of team {team!r} changed meanwhile; try again")
    if found["disabled_at"] is not None:
        raise UserExists(f"user {name!r} of team {team!r} is disabled; no token was issued")
    if found["role"] != str(role):
        raise UserExists(
            f"user {name!r} of team {team!r} has role {found['role']}, not {role}; "
            "no token was issued"
        )
    token, token_hash = new_token()
    row = await repo.insert_token(
        conn, token_hash, found["id"], "reissued", _expiry(ttl_days), None
    )
    return token, row


async def create_user(
    pool: asyncpg.Pool,
    caller: Caller,
    request: CreateUserRequest,
    ttl_days: int | None,
    limits: LiveTokens,
) -> UserCreated:
    caller.require(Role.ADMIN, "creating users")
    team = request.team or caller.team
    role = Role(request.role)
    if team != caller.team and not caller.principal.is_operator:
        raise Forbidden(f"admins create users in their own team ({caller.team}) only")
    if role is Role.OPERATOR and not caller.principal.is_operator:
        raise Forbidden("only operators create operators")
    async with pool.acquire() as conn, conn.transaction():
        if await repo.team_id(conn, team) is None:
            # Only a team this makes is held to the rule: one made before it still gets users.
            try:
                new_team(team)
            except ValueError as exc:
                raise RequestInvalid.one("team", str(exc)) from None
        try:
            token, row = await add_user(
                conn, team, request.name, role, ttl_days, caller.user_id, limits
            )
        except UserExists as exc:
            raise Conflict(str(exc), field="name", message="a user of this name exists") from None
        await audit.record(
            conn,
            caller.principal,
            "create user",
            f"{team}/{request.name}",
            {"role": str(role), "token_id": row["id"]},
        )
    return UserCreated(user=request.name, team=team, role=str(role), token=token)


async def team(pool: asyncpg.Pool, name: str) -> TeamView:
    """The team ``name``, for any caller (team names are not secret, docs/security.md);
    ``NotFound`` when there is none."""
    async with pool.acquire() as conn:
        if await repo.team_id(conn, name) is None:
            raise NotFound(f"no team {name!r}")
    return TeamView(team=name)


async def team_in_reach(conn: asyncpg.Connection, caller: Caller, team: str | None) -> int:
    """The id of ``team`` (default: the caller's) when the caller may reach it: its own
    team, or any team for an operator. Any other team is ``NotFound``, exactly like one that
    does not exist (the rule of every route taking ``team``: its users, tokens, jobs)."""
    if team is None or team == caller.team:
        return caller.team_id
    if not caller.principal.is_operator:
        raise NotFound(f"no team {team!r}")
    found = await repo.team_id(conn, team)
    if found is None:
        raise NotFound(f"no team {team!r}")
    return found


USERS = paging.Cursor("GET /v1/admin/users", paging.text)


async def list_users(
    pool: asyncpg.Pool, caller: Caller, team: str | None, limit: int, after: str | None = None
) -> tuple[list[UserView], str | None]:
    """A page of the team's users by name (at most ``limit``, after the cursor ``after``)
    and the cursor of the next page (None: this is the last)."""
    caller.require(Role.ADMIN, "listing users")
    key = USERS.read(after)
    async with pool.acquire() as conn:
        team_id = await team_in_reach(conn, caller, team)
        fetched = await repo.users(conn, team_id, limit + 1, key[0] if key else "")
    rows, more = paging.split(fetched, limit)
    shown = team or caller.team
    cursor = USERS.write(rows[-1]["name"]) if more else None
    return [
        UserView(
            name=r["name"],
            team=shown,
            role=r["role"],
            created_at=r["created_at"],
            disabled_at=r["disabled_at"],
        )
        for r in rows
    ], cursor


NO_CONDITIONS = Preconditions()
"""A write that sets no condition (``If-Match`` or ``If-None-Match``)."""


def user_tag(role: str, disabled_at: datetime | None) -> str:
    """The ETag of a user: of what an admin changes (its role, whether it is disabled)."""
    return entity_tag({"role": role, "disabled_at": disabled_at})


async def get_user(pool: asyncpg.Pool, caller: Caller, name: str, team: str | None) -> UserView:
    """The user ``name`` of ``team`` (default: the caller's; operators: any team), for its
    admins; ``NotFound`` outside the caller's reach."""
    caller.require(Role.ADMIN, "reading users")
    async with pool.acquire() as conn:
        row = await repo.user(conn, await team_in_reach(conn, caller, team), name)
    if row is None:
        raise NotFound(f"no user {name!r} in team {team or caller.team!r}")
    return UserView(
        name=row["name"],
        team=team or caller.team,
        role=row["role"],
        created_at=row["created_at"],
        disabled_at=row["disabled_at"],
    )


async def _other_user(
    conn: asyncpg.Connection, caller: Caller, name: str, team: str | None, what: str
) -> asyncpg.Record:
    """The user ``name`` of ``team`` (default: the caller's) that the caller may manage, its
    row locked: ``NotFound`` outside its reach, ``Conflict`` when it is the caller (``you
    cannot what``)."""
    row = await repo.user(conn, await team_in_reach(conn, caller, team), name, lock=True)
    if row is None:
        raise NotFound(f"no user {name!r} in team {team or caller.team!r}")
    if row["id"] == caller.user_id:
        raise Conflict(
            f"you cannot {what}; ask another admin",
            field="name",
            message=f"is you: you cannot {what}",
        )
    return row


async def disable_user(
    pool: asyncpg.Pool,
    caller: Caller,
    name: str,
    team: str | None,
    conditions: Preconditions = NO_CONDITIONS,
) -> None:
    """Disable a user of the caller's team (operators: any team) and revoke its tokens, when
    ``conditions`` hold for it as it is (``user_tag``), judged after the 404, 409 and 403 a
    request without them would get."""
    caller.require(Role.ADMIN, "disabling users")
    async with pool.acquire() as conn, conn.transaction():
        row = await _other_user(conn, caller, name, team, "disable yourself")
        if row["role"] == Role.OPERATOR and not caller.principal.is_operator:
            raise Forbidden("only operators disable operators")
        conditions.check(f"user {name}", user_tag(row["role"], row["disabled_at"]))
        await repo.disable_user(conn, row["id"], datetime.now(UTC))
        await audit.record(conn, caller.principal, "disable user", f"{team or caller.team}/{name}")


async def change_role(
    pool: asyncpg.Pool,
    caller: Caller,
    name: str,
    team: str | None,
    role: Role,
    conditions: Preconditions = NO_CONDITIONS,
) -> UserView:
    """Give a user of the caller's team (operators: any team) another role, from its tokens'
    next request on (no token caches a role). Nobody changes their own role, and only
    operators make or unmake operators. Audited with the old and the new role. Only when
    ``conditions`` hold for the user as it is (``user_tag``), judged after the 404, 409 and
    403 a request without them would get."""
    caller.require(Role.ADMIN, "changing roles")
    shown = team or caller.team
    async with pool.acquire() as conn, conn.transaction():
        row = await _other_user(conn, caller, name, team, "change your own role")
        if Role.OPERATOR in (role, row["role"]) and not caller.principal.is_operator:
            raise Forbidden("only operators make or unmake operators")
        conditions.check(f"user {name}", user_tag(row["role"], row["disabled_at"]))
        if row["role"] != role:
            await repo.set_role(conn, row["id"], str(role))
            await audit.record(
                conn,
                caller.principal,
                "change role",
                f"{shown}/{name}",
                {"from": row["role"], "to": str(role)},
            )
    return UserView(
        name=row["name"],
        team=shown,
        role=str(role),
        created_at=row["created_at"],
        disabled_at=row["disabled_at"],
    )


def _token_view(row: asyncpg.Record) -> TokenView:
    return TokenView(
        id=row["id"],
        name=row["name"],
        user=row["user_name"],
        team=row["team_name"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
    )


TOKENS = paging.Cursor("GET /v1/tokens", paging.integer)


async def list_tokens(
    pool: asyncpg.Pool,
    caller: Caller,
    user: str | None,
    team: str | None,
    limit: int,
    after: str | None = None,
) -> tuple[list[TokenView], str | None]:
    """A page of the tokens of ``user`` (default: the caller), never the tokens themselves,
    oldest first, and the cursor of the next page (None: this is the last)."""
    key = TOKENS.read(after)
    async with pool.acquire() as conn:
        user_id = await _user_in_reach(conn, caller, user, team)
        fetched = await repo.tokens_of_user(conn, user_id, limit + 1, key[0] if key else 0)
    rows, more = paging.split(fetched, limit)
    cursor = TOKENS.write(rows[-1]["id"]) if more else None
    return [_token_view(r) for r in rows], cursor


async def _user_in_reach(
    conn: asyncpg.Connection, caller: Caller, user: str | None, team: str | None
) -> int:
    if (user is None or user == caller.user) and (team is None or team == caller.team):
        return caller.user_id
    caller.require(Role.ADMIN, "managing another user's tokens")
    team_id = await team_in_reach(conn, caller, team)
    row = await repo.user(conn, team_id, user or caller.user)
    if row is None:
        raise NotFound(f"no user {user!r} in team {team or caller.team!r}")
    _may_manage_tokens_of(caller, row["role"])
    return int(row["id"])


def _may_manage_tokens_of(caller: Caller, role: str) -> None:
    """An operator's tokens are managed by operators only, as operators alone disable
    operators: an admin of the operator's team would otherwise lock it out."""
    if role == Role.OPERATOR and not caller.principal.is_operator:
        raise Forbidden("only operators manage operators' tokens")


async def create_token(
    pool: asyncpg.Pool,
    caller: Caller,
    request: TokenRequest,
    ttl_days: int | None,
    limits: LiveTokens,
    idempotency_key: str | None = None,
) -> tuple[TokenCreated, bool]:
    """A new token for the caller itself (viewers included), within ``limits``, and True;
    with an ``idempotency_key`` the caller used before for this same request (a retry after
    a lost answer, found by ``replay_token`` first or by the insert racing a twin), that
    token's answer and False instead: no second live token. A different request under the
    key is ``Conflict``."""
    fingerprint = None if idempotency_key is None else token_request_fingerprint(request)
    name = request.name or "default"
    try:
        async with pool.acquire() as conn, conn.transaction():
            made = await _issue(
                conn,
                caller,
                name,
                request,
                ttl_days,
                limits,
                "create token",
                (idempotency_key, fingerprint),
            )
            return made, True
    except asyncpg.UniqueViolationError as exc:
        if idempotency_key is None or exc.constraint_name != "tokens_idempotency_key":
            raise
    replayed = await replay_token(pool, caller, request, idempotency_key)
    assert replayed is not None  # the twin that took the key committed its token
    return replayed, False


async def replay_token(
    pool: asyncpg.Pool, caller: Caller, request: TokenRequest, idempotency_key: str
) -> TokenCreated | None:
    """The answer to a ``POST /v1/tokens`` under an ``Idempotency-Key`` the caller already
    made a token with, None when the key is unused; ``Conflict`` naming the header when the
    request that made it was another (``token_request_fingerprint``).

    The answer is the token's as it is now (its id, name, expiry, ``revoked_at`` should it
    have been revoked since) without its secret: ``token`` is None. Only the secret's hash
    is stored, so no retry can be given the secret, and none should be: an answer that
    repeated it would hand a live credential to whoever replays the request, for as long as
    the key lives (as long as the token's row). What a client that lost the first answer
    learns is which token was made, so that it revokes it (nobody holds its secret) rather
    than leave it live, and makes another under a new key (the CLI does both). A retry
    makes nothing, so it is not held to the live-token bounds and records no audit entry."""
    async with pool.acquire() as conn:
        row = await repo.token_by_idempotency_key(conn, caller.user_id, idempotency_key)
    if row is None:
        return None
    if row["request_fingerprint"] != token_request_fingerprint(request):
        raise _key_used(f"already used for a different request, which created token {row['id']}")
    return _token_created(row, caller, None, row["revoked_at"])


async def rotate_token(
    pool: asyncpg.Pool,
    caller: Caller,
    request: TokenRequest,
    ttl_days: int | None,
    idempotency_key: str | None = None,
) -> TokenCreated:
    """A new token replacing the one the caller presented, which is revoked: never held to
    the live-token bounds, since it leaves the count as it was (a user or team past them,
    its tokens issued before them or a bound lowered since, may still rotate one it fears
    leaked). Under an ``idempotency_key`` the new token keeps the key, the request's
    ``rotation_fingerprint`` and the token it replaces, so that the rotation's retry is
    recognised (``replay_rotation``); a key the caller used before for anything else is
    ``Conflict`` naming it, nothing changed.

    Why a retry is answered with a new secret, not ``"token": null`` as ``POST /v1/tokens``
    is: a client that lost this answer holds only the token just revoked. Told which token
    was made but not its secret, it could neither use that token nor rotate again: locked
    out, an admin's to fix if it was its only token. An overlap instead (the old token kept
    working until the new one is first used or a grace period ends) would leave the token a
    user rotates because it leaked working for everyone meanwhile. So the old token dies at
    once for every request but the one retry, which must present it with the key and the
    same request within ``ROTATION_REPLAY_WINDOW``: whoever can send that held the old
    token and the key, and sending it before the rotation would have given them a token
    too; whoever captured the rotation's request (it carries both) could as well have
    captured its answer. The retry gives the new token a new secret and kills the one lost,
    so the token never has two."""
    name = request.name or caller.token_name
    keyed = (
        (None, None)
        if idempotency_key is None
        else (idempotency_key, rotation_fingerprint(request, name, caller.token_id))
    )
    try:
        async with pool.acquire() as conn, conn.transaction():
            if not await repo.revoke_token(conn, caller.token_id, datetime.now(UTC)):
                raise Conflict(
                    "this token was revoked meanwhile",
                    field="Authorization",
                    message="the token presented was revoked meanwhile; no new token was issued",
                )
            return await _issue(conn, caller, name, request, ttl_days, None, "rotate token", keyed)
    except asyncpg.UniqueViolationError as exc:
        if idempotency_key is None or exc.constraint_name != "tokens_idempotency_key":
            raise
    async with pool.acquire() as conn:
        row = await repo.token_by_idempotency_key(conn, caller.user_id, idempotency_key)
    made = "a token" if row is None else f"token {row['id']}"
    raise _key_used(f"already used for a different request, which made {made}")


async def replay_rotation(
    pool: asyncpg.Pool, caller: Caller, request: TokenRequest, idempotency_key: str
) -> TokenCreated:
    """The retry of a rotation whose answer was lost: ``caller`` is the token that rotation
    revoked (``authenticate_rotation_replay``; its ``replaced_by`` the token it made). The
    same request (``rotation_fingerprint``) answers that token with a new secret, the one
    in the lost answer dead from now on, audited as ``reissue token``; a different one is
    ``Conflict`` naming the header. A token revoked or expired since has no secret to give:
    it is answered as it is, with ``token`` None and its ``revoked_at``."""
    assert caller.replaced_by is not None
    async with pool.acquire() as conn, conn.transaction():
        row = await repo.token_by_idempotency_key(conn, caller.user_id, idempotency_key)
        assert row is not None and row["id"] == caller.replaced_by
        name = request.name or caller.token_name
        if row["request_fingerprint"] != rotation_fingerprint(request, name, caller.token_id):
            raise _key_used(f"already used for a different request, which made token {row['id']}")
        token, token_hash = new_token()
        reissued = await repo.reissue_token(conn, row["id"], token_hash)
        if reissued:
            await audit.record(
                conn,
                caller.principal,
                "reissue token",
                f"{caller.team}/{caller.user}",
                {"token_id": row["id"], "replaces": caller.token_id},
            )
    return _token_created(row, caller, token if reissued else None, row["revoked_at"])


def _key_used(reason: str) -> Conflict:
    """The 409 of an ``Idempotency-Key`` sent with a request other than the one it made."""
    return Conflict(  # the detail holds the field's message: a client says it once
        f"this Idempotency-Key was {reason}: a retry sends that request unchanged; a new "
        "token needs a new key",
        field="Idempotency-Key",
        message=reason,
    )


async def _issue(
    conn: asyncpg.Connection,
    caller: Caller,
    name: str,
    request: TokenRequest,
    ttl_days: int | None,
    limits: LiveTokens | None,
    action: str,
    keyed: tuple[str | None, str | None] = (None, None),
) -> TokenCreated:
    """Issue a token to the caller itself, within ``limits`` (None: one that replaces a
    token revoked in this transaction); ``keyed``: the ``Idempotency-Key`` and the request's
    fingerprint it is made under (``repo.insert_token``)."""
    if limits is not None:
        await _room_for_one(
            conn,
            limits,
            caller.team_id,
            caller.team,
            caller.user_id,
            f"{caller.team}/{caller.user}",
            "Authorization",
        )
    token, token_hash = new_token()
    days = request.expires_in_days or ttl_days
    row = await repo.insert_token(
        conn,
        token_hash,
        caller.user_id,
        name,
        _expiry(days),
        caller.user_id,
        *keyed,
        caller.token_id if action == "rotate token" else None,
    )
    await audit.record(
        conn,
        caller.principal,
        action,
        f"{caller.team}/{caller.user}",
        {
            "token_id": row["id"],
            "name": name,
            "replaces": caller.token_id if action == "rotate token" else None,
        },
    )
    return _token_created(row, caller, token)


def _token_created(
    row: asyncpg.Record, caller: Caller, token: str | None, revoked_at: datetime | None = None
) -> TokenCreated:
    """The answer naming the token of ``row`` (``tokens``), made by or for ``caller``, with
    its secret when ``token`` is given (only the answer that made or reissued it has one)."""
    return TokenCreated(
        id=row["id"],
        name=row["name"],
        user=caller.user,
        team=caller.team,
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        token=token,
        revoked_at=revoked_at,
    )


async def _room_for_one(
    conn: asyncpg.Connection,
    limits: LiveTokens,
    team_id: int,
    team: str,
    user_id: int,
    user: str,
    field: str,
) -> None:
    """``Conflict`` (409, naming ``field``: the token whose user or team is full, or the
    ``team`` a user is added to) unless the user and its team may hold one more live token.
    Locks the team's row until the transaction ends (``repo.live_tokens``): the caller
    inserts the token in the same transaction."""
    user_held, team_held = await repo.live_tokens(conn, team_id, user_id, datetime.now(UTC))
    if user_held >= limits.per_user:
        full = (
            f"user {user} has {user_held} live tokens, the most a user may have is "
            f"{limits.per_user}"
        )
    elif team_held >= limits.per_team:
        full = (
            f"team {team} has {team_held} live tokens, the most a team's users may have "
            f"together is {limits.per_team}"
        )
    else:
        return
    raise Conflict(  # "field: message ...", as NameTaken: the CLI's line says it once
        f"{field}: {full}; revoke one first (DELETE /v1/tokens/{{id}}), or rotate one "
        "(POST /v1/tokens/rotate)",
        field=field,
        message=full,
    )


async def revoke_token(pool: asyncpg.Pool, caller: Caller, token_id: int) -> None:
    """Revoke a token of the caller's, of its team's users but operators (admins) or
    anyone's (operators). Revoking a revoked token changes nothing."""
    async with pool.acquire() as conn, conn.transaction():
        row = await repo.token(conn, token_id)
        missing = NotFound(f"no token {token_id}")
        if row is None:
            raise missing
        others = caller.is_admin and caller.principal.may_see_team(row["team_name"])
        if row["user_id"] != caller.user_id:
            if not others:
                raise missing
            _may_manage_tokens_of(caller, row["user_role"])
        if await repo.revoke_token(conn, token_id, datetime.now(UTC)):
            await audit.record(
                conn,
                caller.principal,
                "revoke token",
                f"{row['team_name']}/{row['user_name']}",
                {"token_id": token_id},
            )
