"""``service_app`` refuses, on every documented route, a query parameter the route does not
declare, and one it reads as a single value given more than once: 422 naming each, before
the handler runs. A misspelt filter (``stauts=RUNNING``) must not be ignored and answer as if
there were none; of ``status=A&status=B`` the caller cannot know which would count.
Parameters of a dependency are the route's too; a list parameter may repeat; routes outside
the OpenAPI document (probes, files) are not checked."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
import pytest
from litestar import get
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler
from litestar.params import HeaderParameter, QueryParameter
from litestar.testing import TestClient

from trainyard_platform.shared.http_app import service_app

calls: list[str] = []


async def _let_in(_: ASGIConnection[Any, Any, Any, Any], __: BaseRouteHandler) -> None:
    return None


def _page(limit: Annotated[int, QueryParameter()] = 10) -> int:
    return limit


@get("/v1/jobs", sync_to_thread=False, dependencies={"page": Provide(_page, sync_to_thread=False)})
def list_jobs(
    page: NamedDependency[int],
    status: Annotated[str | None, QueryParameter()] = None,
    since: Annotated[str | None, QueryParameter(name="from")] = None,
) -> dict[str, Any]:
    calls.append("list")
    return {"status": status, "from": since, "limit": page}


@get("/v1/compare", sync_to_thread=False)
def compare(keys: Annotated[list[str] | None, QueryParameter()] = None) -> list[str]:
    calls.append("compare")
    return keys or []


@get("/v1/keyed", sync_to_thread=False)
def keyed(key: Annotated[str | None, HeaderParameter(name="Idempotency-Key")] = None) -> str:
    calls.append("keyed")
    return key or ""


@get("/v1/me", sync_to_thread=False)
def me() -> str:
    calls.append("me")
    return "me"


@get("/probe", sync_to_thread=False, include_in_schema=False)
def probe() -> str:
    return "ok"


@pytest.fixture
def client() -> Any:
    app = service_app("test", [list_jobs, compare, keyed, me, probe], guard=_let_in)
    calls.clear()
    with TestClient(app) as test_client:
        yield test_client


def test_declared_parameters_pass(client: TestClient[Any]) -> None:
    answer = client.get("/v1/jobs", params={"status": "RUNNING", "from": "x", "limit": "3"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "RUNNING", "from": "x", "limit": 3}
    assert client.get("/v1/compare?keys=a&keys=b").json() == ["a", "b"]  # a list may repeat


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("stauts=RUNNING", "stauts", "unknown query parameter (from, limit, status)"),
        ("since=x", "since", "unknown query parameter (from, limit, status)"),  # the alias only
        ("status=RUNNING&status=QUEUED", "status", "given more than once"),
        ("limit=1&limit=2", "limit", "given more than once"),  # a dependency's parameter
        ("a%01b=1", "a\\u0001b", "unknown query parameter (from, limit, status)"),
    ],
)
def test_an_undeclared_or_repeated_parameter_is_named_and_nothing_runs(
    client: TestClient[Any], query: str, field: str, message: str
) -> None:
    answer = client.get(f"/v1/jobs?{query}")
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"] == [{"field": field, "message": message}]
    assert calls == []


def test_a_route_without_parameters_says_so_and_every_bad_one_is_named(
    client: TestClient[Any],
) -> None:
    answer = client.get("/v1/me?verbose=1&x=2")
    assert answer.status_code == 422
    assert answer.json()["errors"] == [
        {"field": "verbose", "message": "unknown query parameter (this route takes none)"},
        {"field": "x", "message": "unknown query parameter (this route takes none)"},
    ]
    assert calls == []


def test_routes_outside_the_document_are_not_checked(client: TestClient[Any]) -> None:
    assert client.get("/probe?cache=1").status_code == 200


def test_a_header_parameter_given_twice_is_named_and_nothing_runs() -> None:
    """Of two ``Idempotency-Key`` headers the route read both joined ("k1, k2"): a retry
    sending either alone would not be recognised. (Sent over ASGI as two headers: the test
    client would join them before the app sees them.)"""
    app = service_app("test", [keyed], guard=_let_in)

    async def send(headers: list[tuple[str, str]]) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.get("/v1/keyed", headers=headers)

    calls.clear()
    assert asyncio.run(send([("Idempotency-Key", "k1")])).text == "k1"
    answer = asyncio.run(send([("Idempotency-Key", "k1"), ("idempotency-key", "k2")]))
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"] == [
        {"field": "Idempotency-Key", "message": "given more than once"}
    ]
    assert calls == ["keyed"]


def test_litestars_own_options_routes_answer_whatever_their_parameters(
    client: TestClient[Any],
) -> None:
    """Litestar's ``OPTIONS`` handlers cannot be weakly referenced: a lookup keyed by the
    handler made ``OPTIONS /v1/jobs?limit=<beyond 64 bits>`` a 500."""
    for query in ("limit=99999999999999999999", "x=1", "status=a&status=b"):
        answer = client.options(f"/v1/jobs?{query}")
        assert answer.status_code < 500, (query, answer.text)
