"""What the CLI tests share: fake APIs that record every request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient


@pytest.fixture
def sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Every request the CLI makes, each answered 404 (nothing exists)."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://billing.test")
    requests: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(404, json={"detail": "no such thing", "errors": []})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    return requests


def routed_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, urls: dict[str, str]
) -> dict[str, Any]:
    """The APIs at ``urls`` (``TRAINYARD_*_URL`` variables set to them) answering what
    ``state["route"]`` says (404 until a test sets it); ``state["sent"]``: every request the
    CLI made, in order."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for variable, url in urls.items():
        monkeypatch.setenv(variable, url)
    state: dict[str, Any] = {"sent": [], "route": lambda r: httpx.Response(404)}

    def handle(request: httpx.Request) -> httpx.Response:
        state["sent"].append(request)
        response: httpx.Response = state["route"](request)
        return response

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(handle))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    return state


def log_pages(
    ended: bool, chunks: list[dict[str, Any]]
) -> Callable[[httpx.Request], httpx.Response]:
    """A ``routed_api`` route answering ``GET /v1/jobs/{id}/logs``: ``chunks`` on the first
    page, none after (cursor ``c1``); ``ended``: the job ended and its streams are complete."""

    def answer(request: httpx.Request) -> httpx.Response:
        first = not request.url.params.get("after")
        body = {
            "chunks": chunks if first else [],
            "cursor": "c1",
            "job_terminal": ended,
            "streams_complete": ended,
        }
        return httpx.Response(200, json=body)

    return answer
