"""A server that takes a request and does not answer it in time was said as ``cannot reach
URL: timed out``: as if nothing had reached it. A ``submit`` so said may well have made
the job, and the user who submitted again had two. The time waited is said, and of a
request that changes something, that it may have been done: look before repeating it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

SPEC = "name: digits\nentrypoint: train\ngpus: 1\ngpu_flavor: cpu\n"


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TRAINYARD_CONTEXT", raising=False)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})

    def route(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    state["route"] = route
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: trainyard.dev/v1\nkind: Job\n" + SPEC)
    return path


def test_a_submission_without_an_answer_may_have_been_made(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["submit", str(spec), "--no-code"]) == 5
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: cannot reach http://api.test/: no answer to POST /v1/jobs within "
        "10 s; the server may have done it all the same: look before you repeat it",
        "trainyard: error: that is the URL from TRAINYARD_URL: is the API up there?",
    ]


def test_a_read_without_an_answer_says_how_long_it_waited(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ls"]) == 5
    assert capsys.readouterr().err.splitlines()[0] == (
        "trainyard: error: cannot reach http://api.test/: no answer to GET /v1/jobs within 10 s"
    )
