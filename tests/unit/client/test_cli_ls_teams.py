"""``trainyard ls --team T`` and ``--all-teams`` (operators): the API is asked for that team's
jobs or every team's, every team's list shows a TEAM column, and the next page's command
keeps the choice; the two options together are a usage error, nothing sent."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api


def _job(n: int, team: str) -> dict[str, object]:
    return {
        "id": f"abc1234{n}-0000-4000-8000-00000000000{n}",
        "name": f"run-{n}",
        "team": team,
        "user": "alice",
        "status": "RUNNING",
        "submitted_at": "2026-12-06T14:00:00Z",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "cost": 0.0,
        "currency": None,
    }


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    state["route"] = lambda r: httpx.Response(
        200,
        json=[_job(1, "vision"), _job(2, "audio")],
        headers={"Link": '<http://api.test/v1/jobs?after=CUR>; rel="next"'},
    )
    return state


def test_all_teams_asks_for_every_teams_jobs_and_shows_their_teams(
    state: dict[str, list[httpx.Request]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ls", "--all-teams", "--status", "running", "--limit", "2"]) == 0
    (sent,) = state["sent"]
    assert sent.url.path == "/v1/jobs"
    assert sent.url.params["all_teams"] == "true" and "team" not in sent.url.params
    assert sent.url.params["status"] == "RUNNING"
    out, err = capsys.readouterr()
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["TEAM", "ID"]
    assert [row.split()[0] for row in rows] == ["vision", "audio"]
    assert err.splitlines() == [
        "more jobs: trainyard ls --status running --all-teams --limit 2 --after CUR"
    ]


def test_team_asks_for_that_teams_jobs(
    state: dict[str, list[httpx.Request]], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = lambda r: httpx.Response(  # type: ignore[assignment]
        200,
        json=[_job(1, "vision")],
        headers={"Link": '<http://api.test/v1/jobs?after=CUR>; rel="next"'},
    )
    assert cli.main(["ls", "--team", "vision", "--limit", "1"]) == 0
    (sent,) = state["sent"]
    assert sent.url.params["team"] == "vision" and "all_teams" not in sent.url.params
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split()[0] == "ID"  # one team: no TEAM column
    assert err.splitlines() == ["more jobs: trainyard ls --team vision --limit 1 --after CUR"]


def test_team_and_all_teams_together_are_a_usage_error(
    state: dict[str, list[httpx.Request]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["ls", "--team", "vision", "--all-teams"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert state["sent"] == []


@pytest.mark.parametrize(
    ("argv", "status", "detail", "said"),
    [
        (
            ["ls", "--all-teams"],
            403,
            "listing every team's jobs needs the operator role; you are admin",
            "trainyard: error: --all-teams: 403 listing every team's jobs needs the operator "
            "role; you are admin",
        ),
        (
            ["ls", "--team", "vision"],
            404,
            "no team 'vision'",
            "trainyard: error: --team vision: 404 no team 'vision' (another team's jobs are "
            "listed by operators only)",
        ),
    ],
)
def test_a_refusal_of_team_or_all_teams_is_one_line_naming_the_option(
    state: dict[str, object],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    detail: str,
    said: str,
) -> None:
    state["route"] = lambda r: httpx.Response(status, json={"detail": detail})
    assert cli.main(argv) != 0
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [said]


def _me_then_jobs(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/me":
        return httpx.Response(200, json={"user": "root", "team": "platform", "role": "operator"})
    return httpx.Response(200, json=[{**_job(1, "platform"), "user": "root"}])


def test_mine_with_all_teams_asks_for_the_callers_team_alone(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's name is its team's: every team's jobs of ``user=root`` would list other
    teams' users named root as the caller's own."""
    state["route"] = _me_then_jobs
    assert cli.main(["ls", "--all-teams", "--mine"]) == 0
    _, sent = state["sent"]  # type: ignore[misc]
    params = sent.url.params
    assert (params["user"], params["team"], "all_teams" in params) == ("root", "platform", False)
    out, _ = capsys.readouterr()
    assert [row.split()[0] for row in out.splitlines()] == ["TEAM", "platform"]


def test_mine_with_another_team_is_a_usage_error_naming_both(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    state["route"] = _me_then_jobs
    assert cli.main(["ls", "--team", "vision", "--mine"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: --mine: your jobs are team platform's, not vision's"
    ]
    assert [r.url.path for r in state["sent"]] == ["/v1/me"]  # type: ignore[attr-defined]
