"""An empty registry listing says what would fill it, as ``model ls`` does: ``dataset ls``
said only ``no datasets your team may read`` and ``model show`` of a model whose versions
were all deleted ``no live versions``, leaving a new user with nothing to do next."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient

MODEL = {
    "team": "vision",
    "name": "digits",
    "project": "default",
    "latest_version": 2,
    "versions": 0,
    "aliases": {},
    "created_at": "2026-01-01T00:00:00Z",
    "grants": [],
}
ANSWERS: dict[str, Any] = {
    "/v1/datasets": {"datasets": [], "next": None},
    "/v1/models/vision/digits": MODEL,
    "/v1/models/vision/digits/versions": {
        "team": "vision",
        "model": "digits",
        "versions": [],
        "next": None,
    },
}


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry with no dataset, and a model whose versions were all deleted."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")

    def route(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=ANSWERS[request.url.path])

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)


def _run(*argv: str) -> int:
    return cli.main(["--url", "http://api.test", "--token", "ty_a", *argv])


def test_no_dataset_says_how_to_register_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("dataset", "ls") == Exit.OK
    assert capsys.readouterr().out == (
        "no datasets your team may read (trainyard dataset register TEAM/NAME --uri URI "
        "--sha256 HEX --size BYTES adds one)\n"
    )


def test_a_model_without_live_versions_says_how_to_add_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run("model", "show", "vision/digits") == Exit.OK
    out = capsys.readouterr().out
    assert out.endswith(
        "no live versions (trainyard model register vision/digits --job JOB adds one)\n"
    ), out


def test_a_granted_model_without_live_versions_does_not_ask_the_grantee_to_register(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ANSWERS["/v1/models/vision/digits"] = {**MODEL, "grants": None, "project": None}
    try:
        assert _run("model", "show", "vision/digits") == Exit.OK
    finally:
        ANSWERS["/v1/models/vision/digits"] = MODEL
    assert capsys.readouterr().out.endswith("\nno live versions\n")
