"""``service_app`` calls its guard with the route's handler itself (Litestar's own
``authorize_connection`` hands each guard a fresh copy of it on every request), and the guard
still decides: a request it refuses never reaches the handler."""

from __future__ import annotations

from typing import Any

from litestar import Router, get
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from trainyard_platform.shared.http_app import service_app

calls: list[str] = []


@get("/v1/open", sync_to_thread=False)
def open_route() -> str:
    calls.append("open")
    return "in"


@get("/closed", sync_to_thread=False)
def closed_route() -> str:
    calls.append("closed")
    return "in"


def test_the_guard_gets_the_routes_own_handler_and_still_refuses() -> None:
    seen: list[BaseRouteHandler] = []

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        seen.append(handler)
        if connection.scope["path"].endswith("/closed"):
            raise NotAuthorizedException("no")

    app = service_app(
        "test", [open_route, Router("/v1", route_handlers=[closed_route])], guard=guard
    )
    handlers = {
        route.path: route.route_handler_map["GET"][0]
        for route in app.routes
        if isinstance(route, HTTPRoute)
    }
    calls.clear()
    with TestClient(app) as client:
        assert client.get("/v1/open").status_code == 200
        assert client.get("/v1/closed").status_code == 401
        assert client.get("/v1/open").status_code == 200
    assert calls == ["open", "open"]  # the refused request never reached its handler
    assert [handler.handler_name for handler in seen] == [
        "open_route",
        "closed_route",
        "open_route",
    ]
    assert seen[0] is handlers["/v1/open"] and seen[2] is handlers["/v1/open"]
    assert seen[1] is handlers["/v1/closed"]
