"""``waste --job JOB`` and ``cost JOB`` ask the submission API which job JOB names before
they ask billing; a refusal of that first request was said as billing's (``billing: 503
...``), so the user looked for the fault in the wrong service. It is said as the submission
API's, and billing is not asked."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

COMMANDS = [["waste", "--job", "abc1"], ["cost", "abc1"]]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.delenv("TRAINYARD_CONTEXT", raising=False)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    urls = {"TRAINYARD_URL": "http://api.test", "TRAINYARD_BILLING_URL": "http://billing.test"}
    state = routed_api(tmp_path, monkeypatch, urls)

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.host == "api.test":
            detail = "the database does not answer"
            return httpx.Response(503, json={"detail": detail, "errors": []})
        return httpx.Response(500, json={"detail": "billing was asked", "errors": []})

    state["route"] = route
    return state


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_refusal_of_the_job_reference_names_the_submission_api(
    state: dict[str, object], command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    assert err == "trainyard: error: submission: 503 the database does not answer\n"
    sent = state["sent"]
    assert isinstance(sent, list)
    assert [r.url.host for r in sent] == ["api.test"]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_prefix_that_names_no_job_is_not_found(
    state: dict[str, object], command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = lambda r: httpx.Response(200, json=[])
    assert cli.main(command) == 3
    err = capsys.readouterr().err
    assert err == "trainyard: error: no job of your team has an id starting with 'abc1'\n"
