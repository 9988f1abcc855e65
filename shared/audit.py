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
- NDJSON export: the same route with ``Accept: application/x-ndjson`` (``NDJSON``, preferred
  over JSON by the header's weights) streams every entry of the window (``since``,
  ``until``, ``before``) oldest first, in id order, one ``AuditEntry`` JSON object a line,
  with the same authorisation and the same 422s. It never holds the window in memory: it
  reads keyset pages of ``EXPORT_PAGE`` entries from the database (``oldest``), each on a
  connection taken for that page only, up to the newest id when the export began (entries
  written after it are left for the next export). ``limit`` and ``after`` (the JSON list's
  paging) are a 422 naming them. Its first page is read before its status is said, so a
  database unavailable then is a 503 as on every route; a failure after it (the database
  lost) ends the answer without its last chunk, so a client sees a broken transfer, never
  a short export that looks whole. A ``HEAD`` answers its
  headers with no database read beyond the check of its window.
- Export: ids only grow, so paging by id never lists an entry twice nor skips one committed
  before the first page was read (new ones, above it, are left for the next export). An
  entry is numbered when its write inserts it and seen once that write commits: a window
  ``until`` a few minutes past holds only entries whose writes have long committed, so
  consecutive windows (``since`` = the last ``until``) export each entry exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, cast

import asyncpg
from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, OpenAPIType, Operation, Schema
from litestar.params import QueryParameter
from litestar.response import Stream
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


async def oldest(
    conn: asyncpg.Connection,
    after_id: int,
    through_id: int,
    limit: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[AuditEntry]:
    """The oldest ``limit`` entries with an id above ``after_id`` and at most
    ``through_id``, written at or after ``since`` and before ``until``: one keyset page of
    an export, in id order."""
    rows = await conn.fetch(
        """SELECT id, at, actor, team, role, token_id, action, target, detail FROM audit_log
           WHERE id > $1 AND id <= $2
             AND ($4::timestamptz IS NULL OR at >= $4)
             AND ($5::timestamptz IS NULL OR at < $5)
           ORDER BY id LIMIT $3""",
        after_id,
        through_id,
        limit,
        since,
        until,
    )
    return [AuditEntry(**dict(row)) for row in rows]


JSON: Final = "application/json"
NDJSON: Final = "application/x-ndjson"
"""The media type of the export: one JSON object a line (``Accept`` asks for it)."""
EXPORT_PAGE: Final = 500
"""Entries an export reads from the database at a time."""


async def export_lines(
    pool: asyncpg.Pool,
    before: int | None,
    since: datetime | None,
    until: datetime | None,
    page: int = EXPORT_PAGE,
) -> AsyncIterator[bytes]:
    """Every entry below ``before`` in the window, oldest first, as NDJSON: a chunk of lines
    per keyset page (``oldest``), each page read on a connection held for it alone, up to
    the newest id when the export began (module contract)."""
    async with pool.acquire() as conn:
        top = await conn.fetchval(
            "SELECT max(id) FROM audit_log WHERE ($1::bigint IS NULL OR id < $1)", before
        )
    last = 0
    while top is not None:
        async with pool.acquire() as conn:
            found = await oldest(conn, last, top, page, since, until)
        if not found:
            return
        yield b"".join(entry.model_dump_json().encode() + b"\n" for entry in found)
        if len(found) < page:
            return
        last = found[-1].id


@dataclass
class _AuditOperation(Operation):
    """``GET /v1/audit``'s operation: its 200 is JSON (a page) or NDJSON (the export)."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            lines = Schema(
                type=OpenAPIType.STRING,
                description="every entry of the window, oldest first: one AuditEntry JSON "
                "object a line",
            )
            ok.content = {**(ok.content or {}), NDJSON: OpenAPIMediaType(schema=lines)}


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
    (``shared.paging``, as every list whose body is a list). With ``Accept:
    application/x-ndjson``: the whole window as NDJSON, oldest first (module contract)."""

    @get(
        "/v1/audit",
        opt=needs(Role.OPERATOR),
        operation_class=_AuditOperation,
        description="A page of entries, newest first; with Accept: application/x-ndjson, "
        "every entry of the window, oldest first, one JSON object a line.",
    )
    async def audit_log(
        request: Request[Any, Any, Any],
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
        if request.accept.best_match([JSON, NDJSON], default=JSON) == NDJSON:
            return await _export(request, pool, before, since, until)
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


async def _export(
    request: Request[Any, Any, Any],
    pool: asyncpg.Pool,
    before: int | None,
    since: datetime | None,
    until: datetime | None,
) -> Response[list[AuditEntry]]:
    """The NDJSON export of the window (``export_lines``); 422 naming ``limit`` or
    ``after`` when given: an export is every entry, not a page."""
    paged = [name for name in ("limit", "after") if name in request.query_params]
    if paged:
        raise RequestInvalid.one(
            paged[0],
            "pages the JSON list; an export (Accept: application/x-ndjson) is every entry of "
            "the window: leave it out",
        )
    # A HEAD's body is never sent: it reads nothing for it.
    if request.method == "HEAD":
        return cast(Response[list[AuditEntry]], Stream(iter(()), media_type=NDJSON))
    lines = export_lines(pool, before, since, until)
    return cast(Response[list[AuditEntry]], Stream(await _started(lines), media_type=NDJSON))


async def _started(lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``lines`` with its first chunk read now, before the answer's status is said: a
    database unavailable when the export begins is the 503 every route answers for it, not
    a 200 whose body breaks off before its first line."""
    first = await anext(lines, None)

    async def chained() -> AsyncIterator[bytes]:
        if first is None:
            return
        yield first
        async for chunk in lines:
            yield chunk

    return chained()
