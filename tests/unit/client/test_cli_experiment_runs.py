"""``trainyard experiments EXP`` says when the registry answered fewer runs than the
experiment has (it answers at most 1,000): it showed the first 1,000 of 1,500 as if that
were all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient


def run(number: int) -> dict[str, Any]:
    return {
        "job_id": f"{number:08d}-0000-4000-8000-000000000000",
        "name": f"r{number}",
        "user": "ada",
        "status": "SUCCEEDED",
        "started_at": "2026-12-01T00:00:00Z",
        "ended_at": "2026-12-01T01:00:00Z",
        "metrics": {},
    }


@pytest.mark.parametrize(("total", "said"), [(3, True), (2, False)])
def test_runs_beyond_the_answer_are_said(
    total: int,
    said: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    experiment = {
        "id": 7,
        "team": "t",
        "project": "p",
        "name": "sweep",
        "created_at": "2026-12-01T00:00:00Z",
        "runs": total,
        "running": 0,
        "last_started_at": None,
    }

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/experiments":
            return httpx.Response(200, json={"experiments": [experiment]})
        return httpx.Response(200, json={"experiment": experiment, "runs": [run(1), run(2)]})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    assert cli.main(["--token", "ty_a", "experiments", "sweep"]) == 0
    out = capsys.readouterr().out
    assert ("(2 of 3 runs shown" in out) is said, out
