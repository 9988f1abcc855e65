"""Conditional writes (RFC 9110, section 13) through ``shared.http_app.Preconditions``: the
one mechanism every ``PUT``, ``PATCH`` and ``DELETE`` of a resource uses. ``If-Match:
"<etag>"`` proceeds only while the resource is as it was read, ``If-Match: *`` only when it
exists, ``If-None-Match: *`` only when it does not; a false one is 412 in the usual error
shape, naming the header and why."""

from __future__ import annotations

from typing import Any

import pytest
from litestar import Response, delete, get, patch, put
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath, FromQuery
from litestar.testing import TestClient

from trainyard_platform.shared.http_app import (
    IfMatch,
    IfNoneMatch,
    Preconditions,
    entity_tag,
    preconditions,
    service_app,
    tagged,
)
from trainyard_platform.shared.http_errors import PreconditionFailed, RequestInvalid

store: dict[str, str] = {}


def _tag(name: str) -> str | None:
    return entity_tag({"value": store[name]}) if name in store else None


@put("/v1/things/{name:str}", sync_to_thread=False, status_code=200)
def put_thing(
    name: FromPath[str], if_match: IfMatch = None, if_none_match: IfNoneMatch = None
) -> dict[str, str]:
    preconditions(if_match, if_none_match).check(f"thing {name}", _tag(name))
    store[name] = "made"
    return store


@get("/v1/things/{name:str}", sync_to_thread=False)
def get_thing(name: FromPath[str]) -> Response[dict[str, str]]:
    return tagged({"value": store[name]}, entity_tag({"value": store[name]}))


@patch("/v1/things/{name:str}", sync_to_thread=False)
def patch_thing(
    name: FromPath[str],
    value: FromQuery[str],
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> Response[dict[str, str]]:
    preconditions(if_match, if_none_match).check(f"thing {name}", _tag(name))
    store[name] = value
    return tagged({"value": value}, entity_tag({"value": value}))


@delete("/v1/things/{name:str}", sync_to_thread=False)
def delete_thing(
    name: FromPath[str], if_match: IfMatch = None, if_none_match: IfNoneMatch = None
) -> None:
    preconditions(if_match, if_none_match).check(f"thing {name}", _tag(name))
    store.pop(name, None)


async def _anyone(_: ASGIConnection[Any, Any, Any, Any], __: BaseRouteHandler) -> None:
    return None


def test_a_false_condition_is_412_naming_the_header_and_nothing_changes() -> None:
    store.clear()
    app = service_app("test", [put_thing, delete_thing], guard=_anyone)
    with TestClient(app) as client:
        refused = client.put("/v1/things/a", headers={"If-Match": "*"})
        assert refused.status_code == 412
        body = refused.json()
        assert body["errors"][0]["field"] == "If-Match"
        assert "thing a does not exist" in body["errors"][0]["message"]
        assert body["detail"].startswith("If-Match: thing a does not exist")
        assert store == {}
        assert client.put("/v1/things/a", headers={"If-None-Match": "*"}).status_code == 200
        kept = client.delete("/v1/things/a", headers={"If-None-Match": "*"})
        assert kept.status_code == 412
        assert kept.json()["errors"][0]["field"] == "If-None-Match"
        assert "thing a exists already" in kept.json()["errors"][0]["message"]
        assert store == {"a": "made"}
        assert client.delete("/v1/things/a", headers={"If-Match": "*"}).status_code == 204
        assert store == {}
        odd = client.delete("/v1/things/a", headers={"If-Match": 'W/"1"', "If-None-Match": "x"})
        assert odd.status_code == 422
        assert {e["field"] for e in odd.json()["errors"]} == {"If-Match", "If-None-Match"}


@pytest.mark.parametrize(
    ("conditions", "found", "fails"),
    [
        (Preconditions(), False, None),
        (Preconditions(), True, None),
        (Preconditions(exists=True), True, None),
        (Preconditions(exists=True), False, "If-Match"),
        (Preconditions(absent=True), False, None),
        (Preconditions(absent=True), True, "If-None-Match"),
        # Both never hold; If-Match is judged first (RFC 9110, 13.2.2).
        (Preconditions(exists=True, absent=True), False, "If-Match"),
        (Preconditions(exists=True, absent=True), True, "If-None-Match"),
        (Preconditions(tags=('"now"',)), True, None),
        (Preconditions(tags=('"then"', '"now"')), True, None),
        (Preconditions(tags=('"then"',)), True, "If-Match"),
        (Preconditions(tags=('"now"',)), False, "If-Match"),
    ],
)
def test_each_condition_is_judged_as_rfc_9110_says(
    conditions: Preconditions, found: bool, fails: str | None
) -> None:
    current = '"now"' if found else None
    if fails is None:
        conditions.check("thing a", current)
        return
    with pytest.raises(PreconditionFailed) as failed:
        conditions.check("thing a", current)
    assert failed.value.field == fails


def test_star_and_strong_entity_tags_are_understood() -> None:
    assert preconditions(None, None) == Preconditions()
    assert preconditions(" * ", "*") == Preconditions(exists=True, absent=True)
    assert preconditions('"v1"', None) == Preconditions(tags=('"v1"',))
    assert preconditions(' "v1" , "v2"', None) == Preconditions(tags=('"v1"', '"v2"'))
    for odd in ("v1", 'W/"v1"', '"v1", *', '"a"b"', ""):
        with pytest.raises(RequestInvalid) as invalid:
            preconditions(odd, None)
        assert [e.field for e in invalid.value.errors] == ["If-Match"]
    with pytest.raises(RequestInvalid) as weak:
        preconditions('W/"v1"', None)
    assert "weak entity tag" in weak.value.errors[0].message
    with pytest.raises(RequestInvalid) as tagged_none_match:
        preconditions(None, '"v1"')
    assert [e.field for e in tagged_none_match.value.errors] == ["If-None-Match"]


def test_a_stale_etag_is_412_naming_what_changed_and_the_fresh_one_proceeds() -> None:
    store.clear()
    store["a"] = "first"
    app = service_app("test", [get_thing, patch_thing, delete_thing], guard=_anyone)
    with TestClient(app) as client:
        read = client.get("/v1/things/a")
        tag = read.headers["ETag"]
        assert tag == entity_tag({"value": "first"})
        assert tag.startswith('"') and tag.endswith('"')
        # Another writer changes it between the read and the write.
        other = client.patch("/v1/things/a", params={"value": "theirs"}, headers={"If-Match": tag})
        assert other.status_code == 200
        assert other.headers["ETag"] != tag
        stale = client.patch("/v1/things/a", params={"value": "mine"}, headers={"If-Match": tag})
        assert stale.status_code == 412
        error = stale.json()["errors"][0]
        assert error["field"] == "If-Match"
        assert "thing a was changed since it was read" in error["message"]
        assert other.headers["ETag"] in error["message"]
        assert store == {"a": "theirs"}
        gone = client.delete("/v1/things/a", headers={"If-Match": tag})
        assert gone.status_code == 412
        assert store == {"a": "theirs"}
        fresh = client.patch(
            "/v1/things/a", params={"value": "mine"}, headers={"If-Match": other.headers["ETag"]}
        )
        assert fresh.status_code == 200
        assert store == {"a": "mine"}
        # No condition: unconditional, as before.
        assert client.patch("/v1/things/a", params={"value": "plain"}).status_code == 200
        assert store == {"a": "plain"}


def test_a_tag_is_of_the_state_alone() -> None:
    assert entity_tag({"a": 1, "b": [1, 2]}) == entity_tag({"b": [1, 2], "a": 1})
    assert entity_tag({"a": 1}) != entity_tag({"a": 2})
