"""``trainyard ls --status succeeded --limit 2`` ended with ``more jobs: trainyard ls
--after CURSOR``: run as printed, that command lists the next jobs of every status (the
cursor holds a place in the list, not the filters), so the "next page" was another list.
The command printed now repeats the filters and the page size."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

JOBS = [
    {
        "id": f"abc1234{n}-0000-4000-8000-00000000000{n}",
        "name": "one",
        "user": "alice",
        "project": "p 1",
        "status": "SUCCEEDED",
        "labels": {"team": "a"},
        "submitted_at": "2026-12-06T14:00:00Z",
        "gpus": 1,
        "gpu_flavor": "cpu",
    }
    for n in (1, 2)
]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    state["route"] = lambda r: httpx.Response(
        200, json=JOBS, headers={"Link": '<http://api.test/v1/jobs?after=CUR>; rel="next"'}
    )
    return state


def test_the_next_page_command_keeps_the_filters_and_the_page_size(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ls", "--status", "succeeded", "--user", "alice", "--project", "p 1"]
    assert cli.main([*argv, "--label", "team=a", "--limit", "2"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "more jobs: trainyard ls --status succeeded --user alice --project 'p 1' "
        "--label team=a --limit 2 --after CUR"
    ]


def test_without_filters_the_next_page_command_stays_short(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ls", "--limit", "2"]) == 0
    assert capsys.readouterr().err.splitlines() == ["more jobs: trainyard ls --limit 2 --after CUR"]
