"""``trainyard dataset ls`` lists every dataset the team may read, page after page: it
asked for one page of 500 and showed 500 of 501 with nothing said."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

NAMES = [f"d{i:04d}" for i in range(501)]


def test_every_page_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    asked: list[dict[str, str]] = []

    def route(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        asked.append(params)
        start = NAMES.index(params["after"].split("/")[1]) + 1 if "after" in params else 0
        chunk = NAMES[start : start + int(params["limit"])]
        rows = [
            {"team": "t", "name": n, "latest_version": 1, "created_at": "2026-12-01T00:00:00Z"}
            for n in chunk
        ]
        more = start + len(chunk) < len(NAMES)
        return httpx.Response(
            200, json={"datasets": rows, "next": f"t/{chunk[-1]}" if more else None}
        )

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    assert cli.main(["--token", "ty_a", "--json", "dataset", "ls"]) == 0
    listed = json.loads(capsys.readouterr().out)["datasets"]
    assert [d["name"] for d in listed] == NAMES
    assert [a.get("after") for a in asked] == [None, "t/d0499"]
