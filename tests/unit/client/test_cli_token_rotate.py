"""``trainyard token rotate`` revokes the token it was called with. Called with a
context's token, it left that token in the context: the next command of the context was
refused (401, "expired or revoked?") and the user had to log in again with the token the
rotation printed. The context now keeps the new token; a token given by ``--token`` or
``TRAINYARD_TOKEN`` is the caller's to replace (``export TRAINYARD_TOKEN=$(trainyard
token rotate)``), and the config file is left as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file whose current context ``lab`` holds ``ty_old``; the API rotates any
    token it is sent into ``ty_new``."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {"current": "lab", "contexts": {"lab": {"url": "http://api.test", "token": "ty_old"}}}
        )
    )
    path.chmod(0o600)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(path))
    for name in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_CONTEXT"):
        monkeypatch.delenv(name, raising=False)

    def route(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/tokens/rotate")
        return httpx.Response(200, json={"id": 2, "name": "default", "token": "ty_new"})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    return path


def _token_of(path: Path) -> Any:
    return json.loads(path.read_text())["contexts"]["lab"]["token"]


def test_rotating_a_contexts_token_keeps_the_new_one_in_the_context(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["token", "rotate"]) == Exit.OK
    out, err = capsys.readouterr()
    assert out == "ty_new\n"
    assert _token_of(config) == "ty_new"
    assert "context 'lab' now holds the new token" in err
    assert config.stat().st_mode & 0o777 == 0o600


def test_rotating_a_token_given_on_the_command_line_leaves_the_context_alone(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--token", "ty_given", "token", "rotate"]) == Exit.OK
    out, err = capsys.readouterr()
    assert out == "ty_new\n"
    assert _token_of(config) == "ty_old"
    assert "context" not in err
