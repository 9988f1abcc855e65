"""EXP is an experiment's name or its id. A name of digits (``2024``: a year, a ticket) was
read as an id only, so the experiment could not be named at all (404, or another
experiment's runs), and a digit that is no ASCII one (``²``) ended "unexpected ValueError"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit

from .conftest import routed_api


def experiment(number: int, name: str) -> dict[str, Any]:
    return {
        "id": number,
        "team": "t",
        "project": "p",
        "name": name,
        "created_at": "2026-12-01T00:00:00Z",
        "runs": 0,
        "running": 0,
        "last_started_at": None,
    }


EXPERIMENTS = {7: experiment(7, "2024"), 9: experiment(9, "alpha")}


def answer(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/v1/experiments":
        return httpx.Response(200, json={"experiments": list(EXPERIMENTS.values()), "next": None})
    number = path.removeprefix("/v1/experiments/").split("/")[0]
    found = EXPERIMENTS.get(int(number)) if number.isdecimal() else None
    if found is None:
        return httpx.Response(404, json={"detail": "no such experiment", "errors": []})
    if path.endswith("/compare"):
        body = {"experiment": found, "runs": [], "differing_parameters": {}, "final": {}}
        return httpx.Response(200, json=body)
    return httpx.Response(200, json={"experiment": found, "runs": [], "next": None})


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    found = routed_api(tmp_path, monkeypatch, {"TRAINYARD_REGISTRY_URL": "http://registry.test"})
    found["route"] = answer
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    return found


def _asked(state: dict[str, Any]) -> list[str]:
    return [r.url.path for r in state["sent"] if r.url.path != "/v1/experiments"]


@pytest.mark.parametrize("command", ["experiments", "compare"])
@pytest.mark.parametrize(
    ("argv", "number"),
    [
        (["9"], 9),  # an id
        (["2024"], 7),  # no experiment has id 2024: the one named so
        (["2024", "--project", "p"], 7),  # with --project, always a name
        (["alpha"], 9),
    ],
)
def test_an_experiment_is_found_by_id_or_by_a_name_of_digits(
    command: str, argv: list[str], number: int, state: dict[str, Any]
) -> None:
    assert cli.main([command, *argv]) == Exit.OK
    assert _asked(state)[-1].startswith(f"/v1/experiments/{number}")


@pytest.mark.parametrize("ref", ["²", "0", "99999999999999999999999", "nope"])
def test_an_experiment_no_id_or_name_finds_is_not_found(
    ref: str, state: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["experiments", ref]) == Exit.NOT_FOUND
    err = capsys.readouterr().err
    assert err == f"trainyard: error: no experiment {ref!r} in your team\n"
