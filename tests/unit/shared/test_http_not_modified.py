"""A ``GET`` and its ``HEAD`` answer the same validators, and ``If-None-Match`` naming the
``ETag`` is 304 for both (RFC 9110, sections 9.3.2 and 13.1.2): no route answered 304, and
the ``HEAD`` of a route whose body is work (``head_of_get``) had no ``Content-Length`` even
where the length is known without the work. The 304 is made at the app's edge, once for
every route; a write's answer (its ``If-None-Match: *`` a condition of the write) is never
one."""

from __future__ import annotations

from typing import Any

import pytest
from litestar import Response, get, put
from litestar.params import FromPath
from litestar.testing import TestClient

from trainyard_platform.shared.http_app import (
    body_is_work,
    head_answer,
    head_of_get,
    none_match,
    service_app,
    tagged,
)

TAG = '"abc"'


@pytest.mark.parametrize(
    ("asked", "matches"),
    [
        ([TAG], True),
        (['W/"abc"'], True),  # weak comparison
        (['"x", "abc"'], True),
        (['"x"', TAG], True),  # the header given twice
        (["*"], True),
        (['"x"'], False),
        (["abc"], False),  # no entity tag: names nothing
        (['abc "abc"'], False),  # no list of entity tags either
        ([], False),
    ],
)
def test_if_none_match_names_a_tag_by_weak_comparison(asked: list[str], matches: bool) -> None:
    assert none_match(asked, TAG) is matches


async def _allow(connection: Any, handler: Any) -> None:
    return None


@get("/things/{name:str}", sync_to_thread=False)
def thing(name: FromPath[str]) -> Response[dict[str, str]]:
    return tagged({"name": name}, TAG)


@put("/things/{name:str}", sync_to_thread=False, status_code=200)
def put_thing(name: FromPath[str]) -> Response[dict[str, str]]:
    return tagged({"name": name}, TAG)


@get("/blobs/{name:str}", opt=body_is_work(), sync_to_thread=False)
def blob(name: FromPath[str]) -> Response[bytes]:
    return Response(b"12345", media_type="application/octet-stream", headers={"ETag": TAG})


@head_of_get("/blobs/{name:str}", sync_to_thread=False)
def blob_head(name: FromPath[str]) -> Response[None]:
    return head_answer("application/octet-stream", {"ETag": TAG}, content_length=5)


def test_get_and_head_answer_one_etag_and_304_when_if_none_match_names_it() -> None:
    app = service_app("test", [thing, put_thing, blob, blob_head], _allow)
    with TestClient(app) as client:
        for path in ("/things/a", "/blobs/a"):
            got, head = client.get(path), client.head(path)
            assert got.status_code == head.status_code == 200
            assert got.headers["etag"] == head.headers["etag"] == TAG
            assert head.headers["content-length"] == str(len(got.content)) and not head.content
            for method in ("GET", "HEAD"):
                same = client.request(method, path, headers={"If-None-Match": f'"x", {TAG}'})
                assert same.status_code == 304, (method, path)
                assert same.content == b"" and same.headers["etag"] == TAG
                assert "content-length" not in same.headers
                assert same.headers["cache-control"] == "no-store"  # the edge's, as on a 200
                other = client.request(method, path, headers={"If-None-Match": '"x"'})
                assert other.status_code == 200 and other.headers["etag"] == TAG
        written = client.put("/things/a", headers={"If-None-Match": "*"})
        assert written.status_code == 200 and written.json() == {"name": "a"}


def test_a_head_answer_without_a_known_length_has_none() -> None:
    @get("/logs/{name:str}", opt=body_is_work(), sync_to_thread=False)
    def logs(name: FromPath[str]) -> dict[str, str]:
        return {"lines": "made by the work"}

    @head_of_get("/logs/{name:str}", sync_to_thread=False)
    def logs_head(name: FromPath[str]) -> Response[None]:
        return head_answer("application/json")

    with TestClient(service_app("test", [logs, logs_head], _allow)) as client:
        head = client.head("/logs/a")
    assert head.status_code == 200 and head.content == b""
    assert "content-length" not in head.headers  # never a guess
