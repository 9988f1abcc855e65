"""``metrics JOB`` without a registry URL prints the job view's latest metrics, as
README's ``login URL`` (no ``--registry-url``) leaves a new user."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

JOB = "abc12345-0000-4000-8000-000000000001"


def _run(
    view: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str]:
    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            return httpx.Response(200, json=[{"id": JOB, "name": "a", "status": "SUCCEEDED"}])
        return httpx.Response(200, json={"id": JOB, "status": "SUCCEEDED", **view})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.delenv("TRAINYARD_REGISTRY_URL", raising=False)
    code = cli.main(["--token", "ty_a", "metrics", "abc12345"])
    return code, capsys.readouterr().out


def test_a_job_without_metrics_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed "step None: (none)"; the registry's table says "no metrics reported" and
    how a job reports some."""
    assert _run({"step": None, "metrics": {}}, tmp_path, monkeypatch, capsys) == (
        0,
        "no metrics reported (ctx.report_metrics(STEP, NAME=VALUE) in the job reports some; "
        "trainyard logs abc12345 shows what it printed)\n",
    )


def test_a_job_with_metrics_shows_its_latest_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    view = {"step": 184, "metrics": {"loss": 0.03495, "epoch": 8}}
    assert _run(view, tmp_path, monkeypatch, capsys) == (0, "step 184: epoch=8 loss=0.03495\n")
