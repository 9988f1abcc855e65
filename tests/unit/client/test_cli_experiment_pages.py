"""``trainyard experiments`` follows the registry's cursor: the list of experiments, the
lookup of one by name and its runs come a page at a time (``next``, passed as ``after``);
before, the CLI read the first page only and did not find an experiment on the second."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient


def experiment(number: int) -> dict[str, Any]:
    return {
        "id": number,
        "team": "t",
        "project": "p",
        "name": f"exp-{number}",
        "created_at": "2026-12-01T00:00:00Z",
        "runs": 3,
        "running": 0,
        "last_started_at": None,
    }


def run(number: int) -> dict[str, Any]:
    return {
        "job_id": f"{number:08d}-0000-4000-8000-000000000000",
        "name": f"run-{number}",
        "user": "ada",
        "status": "SUCCEEDED",
        "started_at": "2026-12-01T00:00:00Z",
        "ended_at": "2026-12-01T01:00:00Z",
        "metrics": {},
    }


def route(request: httpx.Request) -> httpx.Response:
    """A registry answering two pages of each list (the second after ``after=page-2``)."""
    second = request.url.params.get("after") == "page-2"
    if request.url.path == "/v1/experiments":
        rows = [experiment(3)] if second else [experiment(1), experiment(2)]
        return httpx.Response(200, json={"experiments": rows, "next": None if second else "page-2"})
    runs = [run(3)] if second else [run(1), run(2)]
    body = {"experiment": experiment(3), "runs": runs, "next": None if second else "page-2"}
    return httpx.Response(200, json=body)


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)


def test_every_experiment_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--token", "ty_a", "experiments"]) == 0
    out = capsys.readouterr().out
    assert all(f"exp-{n}" in out for n in (1, 2, 3)), out
    assert cli.main(["--token", "ty_a", "--json", "experiments"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["id"] for e in listed["experiments"]] == [1, 2, 3]


def test_an_experiment_on_a_later_page_is_found_with_every_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--token", "ty_a", "experiments", "exp-3"]) == 0
    out = capsys.readouterr().out
    assert all(f"run-{n}" in out for n in (1, 2, 3)), out
    assert "shown" not in out
