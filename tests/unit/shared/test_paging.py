"""The platform's one list cursor (shared.paging): a key round-trips; a forged one is a 422
on ``after``."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from trainyard_platform.shared import paging
from trainyard_platform.shared.http_errors import RequestInvalid

SHAPE = (paging.instant, paging.text, paging.optional(paging.integer))


def test_a_key_comes_back_as_it_went() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert paging.decode(paging.encode(at, "j1", None), "GET /x", *SHAPE) == (at, "j1", None)
    assert paging.decode(paging.encode(at, "j1", 7), "GET /x", *SHAPE) == (at, "j1", 7)
    assert paging.decode(None, "GET /x", *SHAPE) is None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "forged",
    [
        "%%",
        "x" * (paging.MAX_CURSOR_CHARS + 1),
        _b64(b"not json"),
        _b64(b"\xff\xfe"),
        _b64(b'{"a": 1}'),
        _b64(b'["2026-01-01T00:00:00+00:00", "j1"]'),  # one part short
        _b64(b'["2026-01-01T00:00:00", "j1", 1]'),  # no time zone
        _b64(b'["2026-01-01T00:00:00+00:00", "", 1]'),  # empty text
        _b64(b'["2026-01-01T00:00:00+00:00", "j1", true]'),
        _b64(b'["2026-01-01T00:00:00+00:00", "j1", 1e400]'),
        _b64(b'["2026-01-01T00:00:00+00:00", "j1", 99999999999999999999999]'),
    ],
)
def test_a_forged_cursor_is_refused_on_after(forged: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        paging.decode(forged, "GET /x", *SHAPE)
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
        (paging.encode(2**40), (paging.int32,)),  # GET /v1/queue/{name}/pending's position
        (paging.encode(-(2**31)), (paging.int32,)),  # negated, past an integer
        (paging.encode(-(2**63)), (paging.integer,)),  # negated, past a bigint
        (paging.encode("9999-12-31T23:59:59-14:00"), (paging.instant,)),  # past 9999 in UTC
        (paging.encode("a\x00b"), (paging.text,)),  # no PostgreSQL text holds a NUL
        (paging.encode("\x00"), (paging.str_or_empty,)),
    ],
)
def test_a_cursor_the_database_cannot_take_is_refused_on_after(
    forged: str, parsers: tuple[paging.Parser, ...]
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        paging.decode(forged, "GET /x", *parsers)
    assert refused.value.errors[0].field == "after"


def test_an_instant_comes_back_in_utc() -> None:
    key = paging.decode(paging.encode("2026-01-01T09:00:00+09:00"), "GET /x", paging.instant)
    assert key == (datetime(2026, 1, 1, 0, 0, tzinfo=UTC),)
    assert key is not None and key[0].utcoffset() is not None and not key[0].utcoffset()
