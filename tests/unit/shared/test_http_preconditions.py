"""Conditional writes (RFC 9110, section 13) through ``shared.http_app.Preconditions``: the
one mechanism every ``PUT``, ``PATCH`` and ``DELETE`` of a resource uses. ``If-Match: *``
proceeds only when the resource exists, ``If-None-Match: *`` only when it does not; a false
one is 412 in the usual error shape, naming the header and why."""

from __future__ import annotations

from typing import Any

import pytest
from litestar import delete, put
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.testing import TestClient

from trainyard_platform.shared.http_app import (
    IfMatch,
    IfNoneMatch,
    Preconditions,
    preconditions,
    service_app,
)
from trainyard_platform.shared.http_errors import PreconditionFailed, RequestInvalid

store: dict[str, str] = {}


@put("/v1/things/{name:str}", sync_to_thread=False, status_code=200)
def put_thing(
    name: FromPath[str], if_match: IfMatch = None, if_none_match: IfNoneMatch = None
) -> dict[str, str]:
    preconditions(if_match, if_none_match).check(f"thing {name}", name in store)
    store[name] = "made"
    return store


@delete("/v1/things/{name:str}", sync_to_thread=False)
def delete_thing(
    name: FromPath[str], if_match: IfMatch = None, if_none_match: IfNoneMatch = None
) -> None:
    preconditions(if_match, if_none_match).check(f"thing {name}", name in store)
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
    ],
)
def test_each_condition_is_judged_as_rfc_9110_says(
    conditions: Preconditions, found: bool, fails: str | None
) -> None:
    if fails is None:
        conditions.check("thing a", found)
        return
    with pytest.raises(PreconditionFailed) as failed:
        conditions.check("thing a", found)
    assert failed.value.field == fails


def test_only_star_is_understood() -> None:
    assert preconditions(None, None) == Preconditions()
    assert preconditions(" * ", "*") == Preconditions(exists=True, absent=True)
    with pytest.raises(RequestInvalid) as invalid:
        preconditions('"v1"', None)
    assert [e.field for e in invalid.value.errors] == ["If-Match"]
