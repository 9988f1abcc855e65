"""A ``GET`` route that answers with an ``ETag`` (``response_headers=[ETAG]``) documents
what the app's edge does with it: the 304 its ``If-None-Match`` gets, and that header among
its parameters. Before, the edge answered 304 while no document listed it, so a client (or a
fuzzer) built from the document could not know of it. A route without an ``ETag``, and a
write (whose ``If-None-Match`` is a condition, never a 304), document neither."""

from __future__ import annotations

from typing import Any

import pytest
from litestar import Response, get, put
from litestar.exceptions import ImproperlyConfiguredException
from litestar.openapi.spec import Operation
from litestar.params import FromPath
from litestar.testing import TestClient

from trainyard_platform.shared.http_app import (
    ETAG,
    Conditions,
    json_request_body,
    service_app,
    tagged,
)
from trainyard_platform.shared.http_errors import ErrorBody

TAG = '"abc"'


async def _allow(connection: Any, handler: Any) -> None:
    return None


@get("/things/{name:str}", response_headers=[ETAG], sync_to_thread=False)
def thing(name: FromPath[str]) -> Response[dict[str, str]]:
    return tagged({"name": name}, TAG)


@put("/things/{name:str}", sync_to_thread=False, status_code=200)
def put_thing(name: FromPath[str], conditions: Conditions) -> Response[dict[str, str]]:
    return tagged({"name": name}, TAG)


@get("/plain", sync_to_thread=False)
def plain() -> dict[str, str]:
    return {"a": "b"}


def _document() -> dict[str, Any]:
    app = service_app("test", [thing, put_thing, plain], _allow)
    with TestClient(app) as client:
        answer = client.get("/schema/openapi.json")
        assert answer.status_code == 200
        document: dict[str, Any] = answer.json()
        # What the document says is what the edge does.
        assert client.get("/things/a", headers={"If-None-Match": TAG}).status_code == 304
    return document


def _header_parameters(operation: dict[str, Any]) -> dict[str, Any]:
    return {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "header"}


def test_a_get_with_an_etag_documents_its_304_and_if_none_match() -> None:
    document = _document()
    operation = document["paths"]["/things/{name}"]["get"]
    assert operation["responses"]["304"]["description"].startswith("not modified")
    assert "content" not in operation["responses"]["304"]  # a 304 has no body
    assert "ETag" in operation["responses"]["200"]["headers"]
    header = _header_parameters(operation)["If-None-Match"]
    assert header["required"] is False and header["schema"]["type"] == "string"
    assert {p["name"] for p in operation["parameters"]} == {"name", "If-None-Match"}


def test_a_get_without_an_etag_and_a_write_document_no_304() -> None:
    document = _document()
    assert "304" not in document["paths"]["/plain"]["get"]["responses"]
    assert "If-None-Match" not in _header_parameters(document["paths"]["/plain"]["get"])
    write = document["paths"]["/things/{name}"]["put"]
    assert "304" not in write["responses"]
    # Its If-None-Match is the write's condition (``*`` only), as before.
    assert _header_parameters(write)["If-None-Match"]["schema"]["pattern"] == r"^\s*\*\s*$"


def test_a_get_with_an_etag_and_an_operation_class_of_its_own_is_refused() -> None:
    @get(
        "/odd",
        response_headers=[ETAG],
        operation_class=json_request_body(ErrorBody),
        sync_to_thread=False,
    )
    def odd() -> Response[dict[str, str]]:
        return tagged({}, TAG)

    with pytest.raises(ImproperlyConfiguredException, match="GET /odd: it answers with an ETag"):
        service_app("test", [odd], _allow)
    assert odd.operation_class is not Operation
