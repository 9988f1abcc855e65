"""Keyset paging of the platform's list routes: one opaque cursor for every service.

Contract:
- A paged route takes ``limit`` (at least 1, at most the route's maximum, a default below
  it) and ``after``, the cursor of the previous page, and answers at most ``limit`` rows with
  the cursor of the next page (none: this page is the last). A cursor is a position, not a
  snapshot: rows added since may be skipped, none is listed twice.
- Each list has one ``Cursor``: its route (as errors name it), the parsers of its sort key,
  and, per request, ``of``: what else names the list (a model's versions: the model; an
  experiment's runs: the experiment and the sort). A cursor is that list's tag (a hash of
  route and ``of``) and the sort key of a page's last row, as unpadded base64url of JSON.
  Clients treat it as opaque.
- ``Cursor.read`` gives the key back only from a cursor its list wrote: one of another list
  (even of the same shape: a job's position given to the audit log) is ``RequestInvalid`` on
  ``after`` saying it belongs to another list; anything else, forged, too long, not
  base64url, not JSON, of the wrong shape or written before cursors named their list, is
  ``RequestInvalid`` on ``after`` naming the route; never a 5xx.
- A cursor only says where a page starts. Who may read which rows comes from the caller's
  token, never from a cursor, and every key part reaches SQL as a bound parameter of the type
  its parser checked, so a forged cursor can skip rows but never widen a query or change it.
- ``split`` turns the ``limit + 1`` rows a query fetched into the page and whether more
  follow, so a route never needs a second query to know.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

from litestar import Response

from trainyard_platform.shared.http_errors import RequestInvalid

MAX_CURSOR_CHARS: Final = 512
"""No sort key this platform pages by encodes longer; a longer ``after`` is refused unread
(a list whose key is longer, a job's log positions, says its own ``max_chars``)."""

Part = str | int | float | dict[str, int] | None
Parser = Callable[[Any], Any]
T = TypeVar("T")


TAG_CHARS: Final = 16
"""Hex digits of a list's tag: 64 bits, so no two lists' tags meet."""
_TAG: Final = re.compile(f"[0-9a-f]{{{TAG_CHARS}}}")


class Cursor:
    """The cursor of one list route: ``route`` names it in errors; ``parsers`` read its sort
    key back, one parser per part; a longer cursor than ``max_chars`` is refused unread."""

    def __init__(self, route: str, *parsers: Parser, max_chars: int = MAX_CURSOR_CHARS) -> None:
        self.route = route
        self.parsers = parsers
        self.max_chars = max_chars

    def write(self, *key: Part | datetime, of: str = "") -> str:
        """The cursor of a row whose sort key is ``key`` in the list ``of`` names (datetimes as
        ISO 8601 text, floats as their ``repr``, so NaN and the infinities survive: parse them
        with ``real``)."""
        parts = [_part(k) for k in key]
        raw = json.dumps(
            {"list": self._tag(of), "key": parts}, separators=(",", ":"), allow_nan=False
        )
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    def read(self, text: str | None, of: str = "") -> tuple[Any, ...] | None:
        """The key in cursor ``text`` (None when no cursor was given), each part through its
        parser; ``RequestInvalid`` on ``after`` when this list, ``of``, did not write it."""
        if not text:
            return None
        bad = RequestInvalid.one("after", f"not a cursor returned by {self.route}")
        if len(text) > self.max_chars:
            raise bad
        try:
            found = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
            # RecursionError: arrays nested thousands deep, which a list allowing long
            # cursors (a job's log positions) would otherwise let through to a 500.
            raise bad from None
        if not isinstance(found, dict) or set(found) != {"list", "key"}:
            raise bad
        if found["list"] != self._tag(of):
            # Checked before the key, so a cursor of another list is named as one whatever
            # its shape.
            if isinstance(found["list"], str) and _TAG.fullmatch(found["list"]):
                raise RequestInvalid.one("after", f"a cursor of another list, not of {self.route}")
            raise bad
        parts = found["key"]
        if not isinstance(parts, list) or len(parts) != len(self.parsers):
            raise bad
        try:
            return tuple(parse(part) for parse, part in zip(self.parsers, parts, strict=True))
        except (ValueError, TypeError):
            raise bad from None

    def _tag(self, of: str) -> str:
        # A hash, not the names: short, and says nothing of the list to whoever holds it.
        return hashlib.sha256(f"{self.route}\n{of}".encode()).hexdigest()[:TAG_CHARS]


def _part(key: Part | datetime) -> str | int | dict[str, int] | None:
    if isinstance(key, datetime):
        return key.isoformat()
    if isinstance(key, float):
        return repr(key)
    return key


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
