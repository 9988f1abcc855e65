"""Keyset paging of the platform's list routes: one opaque cursor for every service.

Contract:
- A paged route takes ``limit`` (at least 1, at most the route's maximum, a default below
  it) and ``after``, the cursor of the previous page, and answers at most ``limit`` rows with
  the cursor of the next page (none: this page is the last). A cursor is a position, not a
  snapshot: rows added since may be skipped, none is listed twice.
- A cursor is the sort key of a page's last row, as unpadded base64url of a JSON array.
  Clients treat it as opaque. ``decode`` gives the key back only if it has the route's
  shape (one parser per part); anything else, a forged or foreign cursor, too long, not
  base64url, not JSON or of the wrong shape, is ``RequestInvalid`` on ``after`` (422 naming
  the route), never a 5xx.
- ``split`` turns the ``limit + 1`` rows a query fetched into the page and whether more
  follow, so a route never needs a second query to know.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

from litestar import Response

from trainyard_platform.shared.http_errors import RequestInvalid

MAX_CURSOR_CHARS: Final = 512
"""No key this platform pages by encodes longer; a longer ``after`` is refused unread."""

Part = str | int | float | None
Parser = Callable[[Any], Any]
T = TypeVar("T")


def encode(*key: Part | datetime) -> str:
    """The cursor of a row whose sort key is ``key`` (datetimes as ISO 8601 text, floats as
    their ``repr``, so NaN and the infinities survive: parse them with ``real``)."""
    parts = [_part(k) for k in key]
    raw = json.dumps(parts, separators=(",", ":"), allow_nan=False)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _part(key: Part | datetime) -> str | int | None:
    if isinstance(key, datetime):
        return key.isoformat()
    if isinstance(key, float):
        return repr(key)
    return key


def decode(text: str | None, route: str, *parsers: Parser) -> tuple[Any, ...] | None:
    """The key in cursor ``text`` (None when no cursor was given), each part through its
    parser; ``RequestInvalid`` on ``after`` when it is not a cursor ``route`` gave."""
    if not text:
        return None
    bad = RequestInvalid.one("after", f"not a cursor returned by {route}")
    if len(text) > MAX_CURSOR_CHARS:
        raise bad
    try:
        parts = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if not isinstance(parts, list) or len(parts) != len(parsers):
            raise bad
        return tuple(parse(part) for parse, part in zip(parsers, parts, strict=True))
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise bad from None


def listed(
    rows: list[T], path: str, query: dict[str, str], cursor: str | None
) -> Response[list[T]]:
    """The answer of a list route whose body is a plain list: ``rows``, and while more
    follow (``cursor``), ``Link: <path?query&after=cursor>; rel="next"`` (``GET /v1/jobs``'s
    form)."""
    if cursor is None:
        return Response(rows)
    target = f"{path}?{urlencode({**query, 'after': cursor})}"
    return Response(rows, headers={"Link": f'<{target}>; rel="next"'})


def split(rows: Sequence[T], limit: int) -> tuple[Sequence[T], bool]:
    """The page of ``rows`` (fetched with ``limit + 1``) and whether more rows follow."""
    return rows[:limit], len(rows) > limit


# --- parsers of cursor parts: each raises ValueError or TypeError on a part it refuses ----


def text(part: Any) -> str:
    if not part:
        raise ValueError("not a text part")
    return str_or_empty(part)


def str_or_empty(part: Any) -> str:
    """Text that may be empty (a key column whose ``''`` means none, as a team's budget's
    project); never with a NUL, which no PostgreSQL text holds."""
    if not isinstance(part, str) or "\x00" in part:
        raise ValueError("not a text part")
    return part


def integer(part: Any) -> int:
    """An integer a ``bigint`` column holds, and its negation too (a key sorted descending
    is compared negated)."""
    return _bounded(part, 63)


def int32(part: Any) -> int:
    """An integer an ``integer`` column holds, and its negation too."""
    return _bounded(part, 31)


def _bounded(part: Any, bits: int) -> int:
    if not isinstance(part, int) or isinstance(part, bool) or not -(2**bits) < part < 2**bits:
        raise ValueError("not an integer part")
    return part


def real(part: Any) -> float:
    """A float written by ``encode`` (``'0.5'``, ``'nan'``, ``'-inf'``)."""
    return float(text(part))


def instant(part: Any) -> datetime:
    """An ISO 8601 instant with a time zone."""
    found = datetime.fromisoformat(text(part))
    if found.tzinfo is None:
        raise ValueError("an instant without a time zone")
    try:
        # In UTC, so an offset that carries it past year 9999 or before 1 is refused here,
        # not when the database driver converts it.
        return found.astimezone(UTC)
    except OverflowError:
        raise ValueError("an instant out of range") from None


def optional(parser: Parser) -> Parser:
    """``parser``, or None for a JSON null (a sort key that may be missing)."""
    return lambda part: None if part is None else parser(part)
