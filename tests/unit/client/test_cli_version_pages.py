"""``trainyard model show``, ``trainyard models NAME``, ``trainyard model alias history`` and
``trainyard dataset show`` follow the registry's cursor over a model's or dataset's versions
and an alias's moves (``next``, passed as ``after``): before, they read the first page only
and missed every later one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

MODEL = {
    "team": "t",
    "name": "m",
    "project": "p",
    "versions": 3,
    "latest_version": 3,
    "aliases": {},
    "grants": None,
}


def version(number: int) -> dict[str, Any]:
    return {
        "version": number,
        "job_id": f"{number:08d}-0000-4000-8000-000000000000",
        "registered_at": "2026-12-01T00:00:00Z",
        "metrics": {},
    }


def move(number: int) -> dict[str, Any]:
    return {
        "alias": "production",
        "from_version": None,
        "to_version": number,
        "actor": "t/ada",
        "at": "2026-12-01T00:00:00Z",
    }


def dataset_version(number: int) -> dict[str, Any]:
    return {
        "version": number,
        "uri": f"s3://d/v{number}",
        "size_bytes": 1,
        "sha256": "a" * 64,
        "feature_version": None,
        "created_at": "2026-12-01T00:00:00Z",
    }


def route(request: httpx.Request) -> httpx.Response:
    """A registry answering a model's versions in two pages."""
    if request.url.path == "/v1/models/t/m":
        return httpx.Response(200, json=MODEL)
    second = request.url.params.get("after") == "page-2"
    if request.url.path == "/v1/datasets/t/m":
        versions = [dataset_version(3)] if second else [dataset_version(1), dataset_version(2)]
        detail = {"team": "t", "name": "m", "latest_version": 3, "grants": None}
        return httpx.Response(
            200, json={**detail, "versions": versions, "next": None if second else "page-2"}
        )
    if request.url.path.endswith("/moves"):
        moves = [move(3)] if second else [move(1), move(2)]
        return httpx.Response(200, json={"moves": moves, "next": None if second else "page-2"})
    rows = [version(3)] if second else [version(1), version(2)]
    body = {"team": "t", "model": "m", "versions": rows, "next": None if second else "page-2"}
    return httpx.Response(200, json=body)


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["model", "show", "t/m"], "version_list"),
        (["models", "m", "--team", "t"], "versions"),
        (["model", "alias", "history", "t/m", "production"], "moves"),
        (["dataset", "show", "t/m"], "versions"),
    ],
)
def test_every_version_is_read(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--token", "ty_a", "--json", *argv]) == 0
    shown = json.loads(capsys.readouterr().out)
    key = "to_version" if field == "moves" else "version"
    assert [v[key] for v in shown[field]] == [1, 2, 3]
