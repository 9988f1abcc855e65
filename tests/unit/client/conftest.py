"""What the CLI tests share: a fake API that records every request."""

from __future__ import annotations

from pathlib import Path

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
