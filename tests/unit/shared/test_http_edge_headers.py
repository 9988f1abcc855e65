"""Every answer of every service app, error or not, tells a browser not to sniff it, a cache
not to keep it and no page to frame it; a route that sets its own policy keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from litestar import Response, get
from litestar.datastructures import CacheControlHeader
from litestar.params import FromPath
from litestar.testing import TestClient
from pydantic import SecretStr

from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.dashboard import dashboard_routes
from trainyard_platform.shared.access import public_asset, service_guard
from trainyard_platform.shared.http_app import EDGE_HEADERS, service_app

TOKEN = "the-operator-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@get("/v1/things/{name:str}", sync_to_thread=False)
def thing(name: FromPath[str]) -> dict[str, str]:
    return {"name": name}


@get("/v1/report", sync_to_thread=False)
def report() -> Response[str]:
    return Response("team,cost\n<b>ml</b>,1\n", media_type="text/csv")


@get(
    "/v1/public.json",
    sync_to_thread=False,
    opt=public_asset(),
    cache_control=CacheControlHeader(max_age=60),
)
def public_file() -> dict[str, str]:
    return {"shipped": "with the code"}


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    routes = [thing, report, public_file, *dashboard_routes(Settings())]
    app = service_app("test", routes, service_guard(SecretStr(TOKEN)))
    with TestClient(app) as test_client:
        yield test_client


def _assert_edge(answer: Any, cache: str = "no-store") -> None:
    assert answer.headers["x-content-type-options"] == "nosniff", answer.request.url
    assert answer.headers["cache-control"] == cache, answer.request.url
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["referrer-policy"] == "no-referrer"


def test_data_answers_are_not_sniffed_cached_or_framed(client: TestClient[Any]) -> None:
    answer = client.get("/v1/things/<img src=x onerror=alert(1)>", headers=BEARER)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    _assert_edge(answer)
    assert answer.headers["content-security-policy"] == EDGE_HEADERS["Content-Security-Policy"]
    _assert_edge(client.get("/v1/report", headers=BEARER))


def test_error_answers_carry_the_same_headers(client: TestClient[Any]) -> None:
    """401, a route that does not exist (answered before any route's middleware), a 404 under
    the dashboard that repeats the path asked for, 405 and 422."""
    for path, headers, status in [
        ("/v1/things/x", {}, 401),
        ("/v1/nothing-here", BEARER, 404),
        ("/ui/<script>alert(1)</script>", {}, 404),
        ("/v1/things/%01", BEARER, 422),
    ]:
        answer = client.get(path, headers=headers)
        assert answer.status_code == status, (path, answer.text)
        _assert_edge(answer)
    answer = client.delete("/v1/report", headers=BEARER)
    assert answer.status_code == 405
    _assert_edge(answer)


def test_a_route_that_sets_its_own_policy_keeps_it(client: TestClient[Any]) -> None:
    assert client.get("/v1/public.json").headers["cache-control"] == "max-age=60"
    page = client.get("/ui/")
    _assert_edge(page, cache="no-cache")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert len(page.headers.get_list("content-security-policy")) == 1
    assert len(page.headers.get_list("x-content-type-options")) == 1
