"""``cancel JOB...`` loses nothing: every JOB is resolved before any is cancelled, and one
the API refuses neither stops the others nor hides that they were cancelled.

It stopped at the first refusal: ``cancel a b c`` with ``b`` unknown cancelled ``a``,
printed nothing about it, did not try ``c``, and exited 3 as if nothing had happened."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_jobs import _cancel_text

from .conftest import routed_api

A, C = "aaaaaaaa-0000-4000-8000-000000000001", "cccccccc-0000-4000-8000-000000000003"
P = "pppppppp-0000-4000-8000-000000000004"
"""A job still waiting: the API answers PENDING, and the scheduler cancels it at once."""
E = "eeeeeeee-0000-4000-8000-000000000005"
"""A job that has ended: the API refuses to cancel it."""


ENDED = {
    "detail": f"job {E} has already ended (SUCCEEDED)",
    "errors": [
        {
            "field": "job_id",
            "message": "the job has already ended (SUCCEEDED): there is nothing to cancel",
        }
    ],
}
"""The submission API's 409 to a cancel of a job that has ended (``commands.cancel_job``):
its field error says again what its detail says."""


def _api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")

    def route(request: httpx.Request) -> httpx.Response:
        parts = request.url.path.split("/")  # "", "v1", "jobs", id[, "cancel"]
        if request.method == "POST" and parts[-1] == "cancel" and parts[3] == P:
            view = {"id": P, "name": "p", "status": "PENDING", "cancel_requested": True}
            return httpx.Response(202, json=view)
        if request.method == "POST" and parts[-1] == "cancel" and parts[3] == E:
            return httpx.Response(409, json=ENDED)
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
        f"cancellation requested for job {A}: it was RUNNING and ends CANCELLED once its "
        f"runner has stopped it (`trainyard wait {A}` waits for that)",
        f"cancellation requested for job {C}: it was RUNNING and ends CANCELLED once its "
        f"runner has stopped it (`trainyard wait {C}` waits for that)",
    ]
    assert err == "trainyard: error: not cancelled: 404 no job j-unknown\n"
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


def test_a_pending_job_is_said_to_be_cancelled_and_a_refusal_names_the_job_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed "(status now PENDING)" for a job the scheduler cancels at once, and
    "job E was not cancelled: 409 job E has already ended": the id twice."""
    _api(tmp_path, monkeypatch)
    assert cli.main(["cancel", P, E]) == 1
    out, err = capsys.readouterr()
    assert out == f"job {P} is cancelled before it starts (it was PENDING)\n"
    assert err == f"trainyard: error: not cancelled: 409 job {E} has already ended (SUCCEEDED)\n"
    assert err.count(E) == 1


@pytest.mark.parametrize("extra", [[], ["--if-match", '"e1"']], ids=["plain", "if-match"])
def test_one_ended_job_s_refusal_says_its_reason_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
) -> None:
    """It said `409 job E has already ended (SUCCEEDED) (job_id: the job has already ended
    (SUCCEEDED): there is nothing to cancel)`: the reason twice."""
    _api(tmp_path, monkeypatch)
    assert cli.main(["cancel", E, *extra]) == 1
    assert capsys.readouterr().err == (
        f"trainyard: error: 409 job {E} has already ended (SUCCEEDED)\n"
    )


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ("QUEUED", "is cancelled before it starts (it was QUEUED)"),
        ("PREEMPTED", "is cancelled before it starts again (it was PREEMPTED)"),
        ("SCHEDULED", "cancellation requested for job"),
    ],
)
def test_each_status_is_said_as_what_the_cancel_does(status: str, said: str) -> None:
    assert said in _cancel_text({"id": "j-1", "status": status, "cancel_requested": True})
