"""A token the scheduler or billing refused (401) was said as that service's bare `401
missing, invalid, expired or revoked token`: unlike the same token refused by the submission
API, nothing said which token it was (a context's, TRAINYARD_TOKEN, --token) nor what to do,
though every service is sent the same token. The operator whose token expired overnight met
it first in `nodes ls`, `admin ...`, `cost` or `budget ls`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

COMMANDS = [
    ["nodes", "ls"],
    ["admin", "queues", "ls"],
    ["admin", "queues", "set", "q", "--team", "t", "--weight", "2"],
    ["admin", "prices", "ls"],
    ["budget", "ls"],
    ["cost"],
    ["waste"],
]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    for variable in ("TRAINYARD_CONTEXT", "TRAINYARD_TOKEN", "TRAINYARD_URL"):
        monkeypatch.delenv(variable, raising=False)
    state = routed_api(tmp_path, monkeypatch, {})
    lab = {
        "url": "http://a.test",
        "token": "ty_a",
        "scheduler_url": "http://s.test",
        "billing_url": "http://b.test",
        "registry_url": "http://r.test",
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"current": "lab", "contexts": {"lab": lab}}))
    config.chmod(0o600)
    state["route"] = lambda r: httpx.Response(
        401, json={"detail": "missing, invalid, expired or revoked token", "errors": []}
    )
    return state


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_context_token_another_service_refused_says_which_and_what_to_do(
    state: dict[str, object], command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(command) == 4
    err = capsys.readouterr().err
    assert "401 missing, invalid, expired or revoked token" in err
    assert (
        "the token of context 'lab' was refused (expired or revoked?): "
        "trainyard login http://a.test --name lab"
    ) in err
    assert "ty_a" not in err and "Traceback" not in err


def test_a_variable_another_service_refused_says_what_to_do(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_old")
    assert cli.main(["nodes", "ls"]) == 4
    err = capsys.readouterr().err
    assert (
        "the token from TRAINYARD_TOKEN was refused (expired or revoked?): set a valid one, "
        "or unset TRAINYARD_TOKEN to use the token of context 'lab'"
    ) in err
    assert "ty_old" not in err


def test_another_refusal_of_another_service_adds_nothing(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = lambda r: httpx.Response(
        403, json={"detail": "GET /v1/queue needs the operator role; you are admin", "errors": []}
    )
    assert cli.main(["nodes", "ls"]) == 4
    err = capsys.readouterr().err
    assert err == (
        "trainyard: error: scheduler: 403 GET /v1/queue needs the operator role; you are admin\n"
    )
