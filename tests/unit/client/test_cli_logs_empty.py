"""``trainyard logs JOB`` of a job that has printed nothing (still waiting, or ended
silent) said nothing at all, exit 0: a new user could not tell an empty answer from a
command that did not work. It now says so on stderr, and stdout stays the output alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard import cli

from .conftest import log_pages, routed_api

JOB = "abc12345-0000-4000-8000-000000000001"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    return routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})


def test_a_job_without_output_yet_says_so_and_how_to_follow_it(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = log_pages(False, [])
    assert cli.main(["logs", JOB]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert f"no output from job {JOB} yet; trainyard logs {JOB} -f follows it" in err


def test_an_ended_job_without_output_says_it_printed_none(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = log_pages(True, [])
    assert cli.main(["logs", JOB]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"job {JOB} printed no output" in err
    assert cli.main(["logs", "-f", JOB]) == 0
    assert f"job {JOB} printed no output" in capsys.readouterr().err


def test_output_and_json_get_no_such_note(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = log_pages(True, [{"seq": 1, "stream": "a0000-n1", "text": "hi\n"}])
    assert cli.main(["logs", JOB]) == 0
    out, err = capsys.readouterr()
    assert out == "hi\n" and "no output" not in err
    state["route"] = log_pages(True, [])
    assert cli.main(["--json", "logs", JOB]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no output" not in err
