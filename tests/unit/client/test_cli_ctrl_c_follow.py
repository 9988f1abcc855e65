"""Ctrl-C while a command follows or waits for a job stops only the following, exit 130,
and says so with the command that takes it up again, as ``attach`` said it: ``logs -f``
ended without a word, and ``wait`` said ``interrupted``, leaving a new user to wonder
whether the job had been cancelled too."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit

from .conftest import routed_api

JOB = "aaaaaaaa-0000-4000-8000-000000000001"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.delenv("TRAINYARD_CONTEXT", raising=False)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    chunk = {"seq": 1, "stream": "stdout", "text": "step 1\n"}

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs") and not request.url.params.get("after"):
            page = {"chunks": [chunk], "cursor": "c1", "job_terminal": False}
            return httpx.Response(200, json={**page, "streams_complete": False})
        raise KeyboardInterrupt  # pressed while the command waits for the next answer

    state["route"] = route
    return state


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (
            ["logs", JOB, "-f"],
            f"stopped following its output; the job goes on: trainyard logs {JOB} -f",
        ),
        (["wait", JOB], f"stopped waiting; the job goes on: trainyard wait {JOB}"),
        (["attach", JOB], f"stopped following; the job goes on: trainyard attach {JOB}"),
    ],
    ids=["logs -f", "wait", "attach"],
)
def test_ctrl_c_while_following_says_the_job_goes_on(
    state: dict[str, object],
    command: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(command) == Exit.INTERRUPTED
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"trainyard: {said}"  # a note: the user stopped it
    assert "Traceback" not in err


def test_ctrl_c_while_logs_reads_without_following_is_interrupted(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["logs", JOB]) == Exit.INTERRUPTED
    out, err = capsys.readouterr()
    assert out == "step 1\n" and err.splitlines()[-1] == "interrupted"
