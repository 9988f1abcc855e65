"""``trainyard model ls --granted`` with no model granted to the team said ``no models yet
(trainyard model register TEAM/NAME --job JOB)``, as if the team had no models of its own
and registering one would list it there; it says what the listing lacks now."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry with no model to list."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")

    def route(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"models": [], "next": None})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)


def _ls(*extra: str) -> int:
    return cli.main(["--url", "http://api.test", "--token", "ty_a", "model", "ls", *extra])


def test_no_granted_model_is_not_said_to_be_no_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert _ls("--granted") == Exit.OK
    out = capsys.readouterr().out
    assert out == "no models granted to your team by another team\n"


def test_no_model_at_all_still_says_how_to_register_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _ls() == Exit.OK
    out = capsys.readouterr().out
    assert out == "no models yet (trainyard model register TEAM/NAME --job JOB registers one)\n"


def test_a_filtered_empty_listing_names_the_filters(capsys: pytest.CaptureFixture[str]) -> None:
    assert _ls("--project", "vision") == Exit.OK
    assert capsys.readouterr().out == "no models match --project vision\n"
