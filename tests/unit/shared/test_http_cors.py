"""CORS on a service app: only configured origins, preflights answered before the guard, and
authentication unchanged (401/403 still answered, with CORS headers the page can read)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from litestar import get, post
from litestar.testing import TestClient
from pydantic import SecretStr, ValidationError

from trainyard_platform.services.scheduler.config import Settings as SchedulerSettings
from trainyard_platform.shared.access import needs, service_guard
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import Principal, Role

TOKEN = "the-operator-token"
DASHBOARD = "http://127.0.0.1:8080"
ELSEWHERE = "http://evil.example:8080"


@get("/v1/things", sync_to_thread=False)
def things() -> list[str]:
    return ["a"]


@post("/v1/things", sync_to_thread=False, opt=needs(Role.OPERATOR), status_code=201)
def add_thing() -> str:
    return "ok"


class Viewers:
    """A stand-in identity service: ``viewer-token`` is a viewer of team ``ml``."""

    async def principal(
        self, token: str, *, write: bool = False, client: str | None = None
    ) -> Principal | None:
        return Principal("val", "ml", Role.VIEWER, 7) if token == "viewer-token" else None


def client_for(origins: tuple[str, ...]) -> TestClient[Any]:
    guard = service_guard(SecretStr(TOKEN), Viewers())  # type: ignore[arg-type]
    app = service_app("test", [things, add_thing], guard, cors_origins=origins)
    return TestClient(app)


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    with client_for((DASHBOARD,)) as test_client:
        yield test_client


def test_a_preflight_from_the_dashboard_is_answered_without_a_token(
    client: TestClient[Any],
) -> None:
    answer = client.options(
        "/v1/things",
        headers={
            "Origin": DASHBOARD,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == DASHBOARD
    assert "authorization" in answer.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in answer.headers


def test_a_preflight_from_another_origin_is_refused(client: TestClient[Any]) -> None:
    answer = client.options(
        "/v1/things",
        headers={"Origin": ELSEWHERE, "Access-Control-Request-Method": "GET"},
    )
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers


def test_cross_origin_calls_still_need_a_token_and_the_role(client: TestClient[Any]) -> None:
    missing = client.get("/v1/things", headers={"Origin": DASHBOARD})
    assert missing.status_code == 401
    assert missing.headers["access-control-allow-origin"] == DASHBOARD
    wrong = client.get("/v1/things", headers={"Origin": DASHBOARD, "Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = client.get("/v1/things", headers={"Origin": DASHBOARD, "Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json() == ["a"]
    assert ok.headers["access-control-allow-origin"] == DASHBOARD
    assert "link" in ok.headers["access-control-expose-headers"].lower()
    # The dashboard reads a resource's ETag to send it back as If-Match.
    assert "etag" in ok.headers["access-control-expose-headers"].lower()


def test_a_role_below_the_route_is_still_refused_with_403(client: TestClient[Any]) -> None:
    headers = {"Origin": DASHBOARD, "Authorization": "Bearer viewer-token"}
    assert client.get("/v1/things", headers=headers).status_code == 200
    refused = client.post("/v1/things", headers=headers)
    assert refused.status_code == 403
    assert refused.headers["access-control-allow-origin"] == DASHBOARD
    preflight = client.options(
        "/v1/things",
        headers={"Origin": DASHBOARD, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204  # the browser may ask; the guard still decides


def test_another_origin_gets_no_cors_headers(client: TestClient[Any]) -> None:
    answer = client.get(
        "/v1/things", headers={"Origin": ELSEWHERE, "Authorization": f"Bearer {TOKEN}"}
    )
    assert "access-control-allow-origin" not in answer.headers


def test_without_configured_origins_there_is_no_cors_and_options_needs_a_token() -> None:
    with client_for(()) as plain:
        preflight = plain.options(
            "/v1/things", headers={"Origin": DASHBOARD, "Access-Control-Request-Method": "GET"}
        )
        assert preflight.status_code == 401
        answer = plain.get(
            "/v1/things", headers={"Origin": DASHBOARD, "Authorization": f"Bearer {TOKEN}"}
        )
        assert answer.status_code == 200
        assert "access-control-allow-origin" not in answer.headers


def test_the_origins_setting_takes_a_list_and_refuses_wildcards_and_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINYARD_SCHEDULER_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("TRAINYARD_CORS_ORIGINS", f"{DASHBOARD}/, http://[::1]:9000")
    assert SchedulerSettings().cors_origins == [DASHBOARD, "http://[::1]:9000"]
    monkeypatch.setenv("TRAINYARD_CORS_ORIGINS", f'["{DASHBOARD}"]')
    assert SchedulerSettings().cors_origins == [DASHBOARD]
    for bad in ("*", f"{DASHBOARD}/ui", "javascript:alert(1)"):
        monkeypatch.setenv("TRAINYARD_CORS_ORIGINS", bad)
        with pytest.raises(ValidationError, match="not an origin"):
            SchedulerSettings()
    monkeypatch.delenv("TRAINYARD_CORS_ORIGINS")
    assert SchedulerSettings().cors_origins == []
