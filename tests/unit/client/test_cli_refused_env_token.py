"""A TRAINYARD_TOKEN (or --token) an API refuses was said as `the token from
TRAINYARD_TOKEN was refused`, no more: unlike a context's, nothing said what to do, though
a variable left over from another stack hides a context's token that works."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.delenv("TRAINYARD_CONTEXT", raising=False)
    state = routed_api(tmp_path, monkeypatch, {})
    config = tmp_path / "config.json"
    config.write_text(
        '{"current": "lab", "contexts": {"lab": {"url": "http://a.test", "token": "ty_a"}}}\n'
    )
    config.chmod(0o600)
    state["route"] = lambda r: httpx.Response(401, json={"detail": "bad token", "errors": []})
    return state


def test_a_refused_variable_says_what_to_do_and_which_context_it_hides(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_old")
    assert cli.main(["whoami"]) == 4
    err = capsys.readouterr().err
    assert (
        "the token from TRAINYARD_TOKEN was refused (expired or revoked?): set a valid one, "
        "or unset TRAINYARD_TOKEN to use the token of context 'lab'"
    ) in err
    assert "ty_old" not in err and "ty_a" not in err


def test_a_refused_option_says_what_to_do(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["whoami", "--token", "ty_old"]) == 4
    assert (
        "the token from --token was refused (expired or revoked?): give a valid one, or leave "
        "--token out to use the token of context 'lab'"
    ) in capsys.readouterr().err
