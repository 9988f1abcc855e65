"""A server that takes a request and does not answer it in time was said as ``cannot reach
URL: timed out`` (then ``cannot reach URL: no answer to ...``, with the hint of a server
not reached, ``is the API up there?``): as if nothing had reached it. A ``submit`` so said may well have made
the job, and the user who submitted again had two. The time waited is said, and of a
request that changes something, that it may have been done: look before repeating it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

HINT = (
    "trainyard: error: the URL reaches a server, which took the request but did not answer in "
    "time: the API there is busy or stuck (its logs say why)"
)
"""Not "is the API up there?", which a server that took the request has answered: it is
up, at that URL."""
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
        "trainyard: error: no answer from http://api.test/ to POST /v1/jobs within 10 s; the "
        "server may have done it all the same: look before you repeat it",
        HINT,
    ]


def test_a_read_without_an_answer_says_how_long_it_waited(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ls"]) == 5
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: no answer from http://api.test/ to GET /v1/jobs within 10 s",
        HINT,
    ]


def test_another_service_without_an_answer_is_said_the_same(
    spec: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://billing.test")
    assert cli.main(["cost"]) == 5
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: billing: no answer from http://billing.test/ to GET /v1/costs "
        "within 10 s",
        HINT,
    ]
