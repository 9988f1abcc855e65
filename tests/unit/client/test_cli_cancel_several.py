"""``cancel JOB...`` loses nothing: every JOB is resolved before any is cancelled, and one
the API refuses neither stops the others nor hides that they were cancelled.

It stopped at the first refusal: ``cancel a b c`` with ``b`` unknown cancelled ``a``,
printed nothing about it, did not try ``c``, and exited 3 as if nothing had happened."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

A, C = "aaaaaaaa-0000-4000-8000-000000000001", "cccccccc-0000-4000-8000-000000000003"


def _api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")

    def route(request: httpx.Request) -> httpx.Response:
        parts = request.url.path.split("/")  # "", "v1", "jobs", id[, "cancel"]
        if request.method == "POST" and parts[-1] == "cancel" and parts[3] in (A, C):
            view = {"id": parts[3], "name": "a", "status": "RUNNING", "history": []}
            return httpx.Response(200, json=view)
        if request.url.path == "/v1/jobs":  # no job starts with the prefix asked for
            return httpx.Response(200, json=[])
        return httpx.Response(404, json={"detail": f"no job {parts[3]}", "errors": []})

    state["route"] = route
    sent: list[httpx.Request] = state["sent"]
    return sent


def test_a_refused_job_does_not_stop_or_hide_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent = _api(tmp_path, monkeypatch)
    assert cli.main(["cancel", A, "j-unknown", C]) == 3
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"cancellation requested for job {A} (status now RUNNING)",
        f"cancellation requested for job {C} (status now RUNNING)",
    ]
    assert err == "trainyard: error: job j-unknown was not cancelled: 404 no job j-unknown\n"
    assert [r.url.path for r in sent if r.method == "POST"] == [
        f"/v1/jobs/{A}/cancel",
        "/v1/jobs/j-unknown/cancel",
        f"/v1/jobs/{C}/cancel",
    ]


def test_a_prefix_that_names_no_job_cancels_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent = _api(tmp_path, monkeypatch)
    assert cli.main(["cancel", A, "abc123"]) == 3
    assert "no job of your team has an id starting with 'abc123'" in capsys.readouterr().err
    assert [r for r in sent if r.method == "POST"] == []


def test_one_job_is_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _api(tmp_path, monkeypatch)
    assert cli.main(["--json", "cancel", "j-unknown"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err == "trainyard: error: 404 no job j-unknown\n"
    assert cli.main(["--json", "cancel", A]) == 0
    assert '"id": "' + A in capsys.readouterr().out
