"""The platform's one list cursor (shared.paging): a key round-trips; a forged one is a 422
on ``after``, and so is one another list wrote, whatever its shape."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from trainyard_platform.shared import paging
from trainyard_platform.shared.http_errors import RequestInvalid

SHAPE = (paging.instant, paging.text, paging.optional(paging.integer))
X = paging.Cursor("GET /x", *SHAPE)


def test_a_key_comes_back_as_it_went() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert X.read(X.write(at, "j1", None)) == (at, "j1", None)
    assert X.read(X.write(at, "j1", 7)) == (at, "j1", 7)
    assert X.read(X.write(at, "j1", 7, of="a/b"), of="a/b") == (at, "j1", 7)
    assert X.read(None) is None


def _another_list(read: Callable[[], object]) -> None:
    with pytest.raises(RequestInvalid) as refused:
        read()
    assert [(e.field, e.message) for e in refused.value.errors] == [
        ("after", "a cursor of another list, not of GET /x")
    ]


def test_a_cursor_of_another_list_is_refused_whatever_its_shape() -> None:
    """A cursor of GET /v1/jobs was a key of the same shape as another list's and was read
    by it as a position: now each list reads only its own."""
    at = datetime(2026, 1, 2, tzinfo=UTC)
    same_shape = paging.Cursor("GET /y", *SHAPE)
    _another_list(lambda: X.read(same_shape.write(at, "j1", 7)))
    # The same route, another list of it (another model's versions, another sort).
    _another_list(lambda: X.read(X.write(at, "j1", 7, of="a/b"), of="a/c"))
    _another_list(lambda: X.read(X.write(at, "j1", 7, of="a/b")))
    _another_list(lambda: X.read(paging.Cursor("GET /z", paging.integer).write(3)))


def test_a_cursor_written_before_cursors_named_their_list_is_refused() -> None:
    """The old form, a bare key: not this list's (start again from the first page)."""
    old = _b64(b'["2026-01-01T00:00:00+00:00","j1",1]')
    with pytest.raises(RequestInvalid) as refused:
        X.read(old)
    assert [(e.field, e.message) for e in refused.value.errors] == [
        ("after", "not a cursor returned by GET /x")
    ]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _tag(cursor: str) -> bytes:
    found = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    return str(found["list"]).encode()


TAG = _tag(X.write(datetime(2026, 1, 1, tzinfo=UTC), "j1", 1))
"""``GET /x``'s tag: forged keys below carry it, so they are refused for their key."""


@pytest.mark.parametrize(
    "forged",
    [
        "%%",
        "x" * (paging.MAX_CURSOR_CHARS + 1),
        _b64(b"not json"),
        _b64(b"\xff\xfe"),
        _b64(b'{"a": 1}'),
        _b64(b'{"list": 1, "key": []}'),
        _b64(b'{"list": "' + TAG + b'"}'),
        _b64(b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00+00:00", "j1"]}'),
        _b64(b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00", "j1", 1]}'),
        _b64(b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00+00:00", "", 1]}'),
        _b64(b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00+00:00", "j1", true]}'),
        _b64(b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00+00:00", "j1", 1e400]}'),
        _b64(b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00+00:00", "j1", 1e99]}'),
        _b64(
            b'{"list": "' + TAG + b'", "key": ["2026-01-01T00:00:00+00:00", "j1", '
            b"99999999999999999999999]}"
        ),
        _b64(b'{"list": "' + TAG + b'", "key": {"a": 1}}'),
    ],
)
def test_a_forged_cursor_is_refused_on_after(forged: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        X.read(forged)
    assert refused.value.errors[0].field == "after"
    assert "GET /x" in refused.value.errors[0].message


def test_split_tells_whether_more_follow() -> None:
    assert paging.split([1, 2, 3], 2) == ([1, 2], True)
    assert paging.split([1, 2], 2) == ([1, 2], False)


@pytest.mark.parametrize(
    ("forged", "parsers"),
    [
        # Each decoded, but its value is one the query's column cannot take: the database
        # call failed (asyncpg refusing to encode, PostgreSQL overflowing) with a 500.
        (2**40, (paging.int32,)),  # GET /v1/queue/{name}/pending's position
        (-(2**31), (paging.int32,)),  # negated, past an integer
        (-(2**63), (paging.integer,)),  # negated, past a bigint
        ("9999-12-31T23:59:59-14:00", (paging.instant,)),  # past 9999 in UTC
        ("a\x00b", (paging.text,)),  # no PostgreSQL text holds a NUL
        ("\x00", (paging.str_or_empty,)),
    ],
)
def test_a_cursor_the_database_cannot_take_is_refused_on_after(
    forged: paging.Part, parsers: tuple[paging.Parser, ...]
) -> None:
    cursor = paging.Cursor("GET /x", *parsers)
    with pytest.raises(RequestInvalid) as refused:
        cursor.read(cursor.write(forged))
    assert refused.value.errors[0].field == "after"


def test_an_instant_comes_back_in_utc() -> None:
    at = paging.Cursor("GET /x", paging.instant)
    key = at.read(at.write("2026-01-01T09:00:00+09:00"))
    assert key == (datetime(2026, 1, 1, 0, 0, tzinfo=UTC),)
    assert key is not None and key[0].utcoffset() is not None and not key[0].utcoffset()


def test_a_cursor_nested_thousands_deep_is_refused_on_after_not_a_crash() -> None:
    """A list allowing long cursors (a job's log positions: 20,000 characters) let JSON
    arrays nested 10,000 deep reach ``json.loads``, whose RecursionError was a 500."""
    cursor = paging.Cursor("GET /v1/jobs/{id}/logs", str, max_chars=20_000)
    nested = base64.urlsafe_b64encode(b"[" * 10_000).decode().rstrip("=")
    with pytest.raises(RequestInvalid) as refused:
        cursor.read(nested)
    assert refused.value.errors[0].field == "after"
