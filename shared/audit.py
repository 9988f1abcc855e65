"""The append-only audit log every service keeps of privileged writes.

Contract:
- ``record`` appends one row (who: actor, team, role and token id; what: action and target;
  detail: the request's effective fields, never a token) on the caller's connection, so it
  commits or rolls back with the change it describes. Call it inside the write's transaction.
- Every write by an admin or an operator is recorded, and every change to users or tokens
  whoever makes it (``must_record``).
- The table refuses UPDATE and TRUNCATE, and every DELETE but retention's of entries older
  than ``TRAINYARD_AUDIT_RETENTION_DAYS`` (``shared/migrations/0004_audit_log.sql``, ``0009``;
  ``shared.retention``).
- ``audit_route`` serves ``GET /v1/audit`` (newest first, by id; ``before`` an id to start
  below; ``since`` and ``until`` bound the entries' time, ``since <= at < until``; paged with
  the platform's cursor, ``shared.paging``), to operators only.
- Export: ids only grow, so paging by id never lists an entry twice nor skips one committed
  before the first page was read (new ones, above it, are left for the next export). An
  entry is numbered when its write inserts it and seen once that write commits: a window
  ``until`` a few minutes past holds only entries whose writes have long committed, so
  consecutive windows (``since`` = the last ``until``) export each entry exactly once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
from litestar import Response, get
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import QueryParameter
from pydantic import BaseModel

from trainyard_platform.shared import paging
from trainyard_platform.shared.access import needs
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.identity import Principal, Role


class AuditEntry(BaseModel):
    """One privileged write: who did what to what, when, with which token."""

    id: int
    at: datetime
    actor: str
    team: str | None
    role: str
    token_id: int | None
    action: str
    target: str
    detail: dict[str, Any]


def must_record(principal: Principal) -> bool:
    """True when ``principal``'s writes go to the audit log (admins and operators)."""
    return principal.has(Role.ADMIN)


async def record(
    conn: asyncpg.Connection,
    principal: Principal,
    action: str,
    target: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one entry on ``conn`` (inside the write's own transaction)."""
    await conn.execute(
        """INSERT INTO audit_log (actor, team, role, token_id, action, target, detail)
           VALUES ($1, $2, $3, $4, $5, $6, $7)""",
        principal.actor,
        principal.team,
        str(principal.role),
        principal.token_id,
        action,
        target,
        detail or {},
    )


async def entries(
    conn: asyncpg.Connection,
    before: int | None,
    limit: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[AuditEntry]:
    """The newest ``limit`` entries with an id below ``before`` (all when None), written at or
    after ``since`` and before ``until`` (either unbounded when None)."""
    rows = await conn.fetch(
        """SELECT id, at, actor, team, role, token_id, action, target, detail FROM audit_log
           WHERE ($1::bigint IS NULL OR id < $1)
             AND ($3::timestamptz IS NULL OR at >= $3)
             AND ($4::timestamptz IS NULL OR at < $4)
           ORDER BY id DESC LIMIT $2""",
        before,
        limit,
        since,
        until,
    )
    return [AuditEntry(**dict(row)) for row in rows]


CURSOR = paging.Cursor("GET /v1/audit", paging.integer)
"""A page's position in a service's audit log (``of`` the service: each has its own)."""


def _instant(name: str, value: datetime | None) -> datetime | None:
    """``value`` in UTC if it names its offset (RFC 3339), else ``RequestInvalid`` naming
    ``name``: a time without one would be read in the database server's zone, a guess."""
    if value is None:
        return None
    if value.utcoffset() is None:
        raise RequestInvalid.one(
            name,
            "must be a date and time with its offset (Z or +hh:mm), such as 2026-01-31T09:30:00Z",
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before the first year
        raise RequestInvalid.one(name, "must be within the years 1 to 9999 in UTC") from None


def audit_route(pool: asyncpg.Pool, service: str) -> HTTPRouteHandler:
    """``GET /v1/audit?before=<id>&since=<time>&until=<time>&limit=<n>&after=<cursor>``: the
    service's audit log, newest first, operators only. ``before`` keeps the entries older
    than that id, ``since`` those written at or after that time, ``until`` those written
    before it; a page is at most ``limit`` entries and, while more follow, ``Link:
    <...&after=CURSOR>; rel="next"`` names the next, with the same filters
    (``shared.paging``, as every list whose body is a list)."""

    @get("/v1/audit", opt=needs(Role.OPERATOR))
    async def audit_log(
        principal: NamedDependency[Principal],
        before: Annotated[
            int | None,
            QueryParameter(ge=1, le=2**63 - 1, description="entries older than this id"),
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 100,
        since: Annotated[
            datetime | None,
            QueryParameter(description="entries written at or after this time (RFC 3339)"),
        ] = None,
        until: Annotated[
            datetime | None,
            QueryParameter(description="entries written before this time (RFC 3339)"),
        ] = None,
        after: Annotated[str | None, QueryParameter(description="the next page's cursor")] = None,
    ) -> Response[list[AuditEntry]]:
        since, until = _instant("since", since), _instant("until", until)
        if since is not None and until is not None and until < since:
            # An empty window said as an empty page would pass a reversed export for done.
            raise RequestInvalid.one(
                "until", f"must not be before since ({since.isoformat()}): the window is empty"
            )
        key = CURSOR.read(after, of=service)
        below = [i for i in (before, None if key is None else key[0]) if i is not None]
        async with pool.acquire() as conn:
            fetched = await entries(conn, min(below) if below else None, limit + 1, since, until)
        page, more = paging.split(fetched, limit)
        query = {
            "limit": str(limit),
            **({"before": str(before)} if before else {}),
            **({"since": since.isoformat()} if since else {}),
            **({"until": until.isoformat()} if until else {}),
        }
        cursor = CURSOR.write(page[-1].id, of=service) if more else None
        return paging.listed(list(page), "/v1/audit", query, cursor)

    return audit_log
