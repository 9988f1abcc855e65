"""``trainyard queue --all-teams``: the operator's view of what waits in every queue and why,
from the scheduler's ``GET /v1/queue`` (and a queue's ``GET /v1/queue/{name}/pending`` pages
where its head is not enough). Before it, ``queue`` showed an operator only their own team's
jobs and the docs sent them to the API with curl."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

SCHEDULER = "http://scheduler.test"
BASE = ["--url", "http://submission.test", "--token", "ty_op"]
T0 = "2026-12-01T10:00:00Z"


def _job(n: int, flavor: str = "h100", **fields: Any) -> dict[str, Any]:
    return {
        "job_id": f"{n:08d}-5d2f-4c7e-9a1b-2f3d4e5f6a7b",
        "gpu_flavor": flavor,
        "gpus": 8,
        "priority": "normal",
        "attempt": 0,
        "position": n,
        "reason": "quota: vision uses 16 of 16 h100",
        "blocking": None,
        "suggestion": None,
        "estimated_start": None,
        "submitted_at": T0,
        "eligible_at": None,
        **fields,
    }


def _queue(name: str, team: str, pending: list[dict[str, Any]], waiting: int = -1) -> Any:
    return {
        "name": name,
        "team": team,
        "cohort": None,
        "weight": 1.0,
        "implicit": False,
        "quotas": [],
        "running": [],
        "pending": pending,
        "waiting": len(pending) if waiting < 0 else waiting,
    }


def _answer(*queues: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={"nodes": [], "allocations": [], "queues": list(queues)})


@pytest.fixture
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return routed_api(tmp_path, monkeypatch, {"TRAINYARD_SCHEDULER_URL": SCHEDULER})


def test_lists_every_teams_waiting_jobs_by_queue_in_order_with_why(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    vision = [
        _job(1, blocking="00000009", suggestion="ask for 4 GPUs", estimated_start=T0),
        _job(2, "a100", gpus=2, priority="low", eligible_at="2026-12-01T10:05:00Z"),
    ]
    scheduler["route"] = lambda r: _answer(
        _queue("vision", "vision", vision),
        _queue("idle", "aaa", []),
        _queue("nlp-batch", "nlp", [_job(1, reason=None)]),
    )
    assert cli.main([*BASE, "queue", "--all-teams"]) == Exit.OK
    captured = capsys.readouterr()
    (request,) = scheduler["sent"]
    assert str(request.url) == f"{SCHEDULER}/v1/queue"
    assert request.headers["authorization"] == "Bearer ty_op"
    out = captured.out.splitlines()
    assert out[0].split() == [
        "QUEUE", "TEAM", "POS", "JOB", "GPUS", "FLAVOR", "PRIORITY", "WAITED", "EST.", "START",
        "REASON",
    ]  # fmt: skip
    # By team (the idle queue left out), each queue's line in order.
    assert [line.split()[:7] for line in out[1:]] == [
        ["nlp-batch", "nlp", "1", "00000001", "8", "h100", "normal"],
        ["vision", "vision", "1", "00000001", "8", "h100", "normal"],
        ["vision", "vision", "2", "00000002", "2", "a100", "low"],
    ]
    assert all(re.fullmatch(r"\d+d\d\dh", line.split()[7]) for line in out[1:])  # days waited
    assert out[1].endswith("  -")  # no reason said
    assert out[2].endswith(
        "2026-12-01 10:00:00Z  quota: vision uses 16 of 16 h100; blocked by 00000009; "
        "suggestion: ask for 4 GPUs"
    ), out[2]
    assert out[3].endswith("backing off until 2026-12-01 10:05:00Z"), out[3]
    assert captured.err == ""  # every queue shown whole


def test_team_and_flavor_filter(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scheduler["route"] = lambda r: _answer(
        _queue("vision", "vision", [_job(1), _job(2, "a100"), _job(3)]),
        _queue("vision-urgent", "vision", [_job(1, "a100")]),
        _queue("nlp", "nlp", [_job(1, "a100")]),
    )
    argv = [*BASE, "queue", "--all-teams", "--team", "vision", "--flavor", "a100"]
    assert cli.main(argv) == Exit.OK
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:6] for line in out[1:]] == [
        ["vision", "vision", "2", "00000002", "8", "a100"],
        ["vision-urgent", "vision", "1", "00000001", "8", "a100"],
    ]
    assert cli.main([*BASE, "queue", "--all-teams", "--flavor", "h200"]) == Exit.OK
    assert capsys.readouterr().out == (
        "no job waits for h200 in any queue (trainyard submit SPEC submits one)\n"
    )
    assert cli.main([*BASE, "queue", "--all-teams", "--team", "nobody"]) == Exit.OK
    assert capsys.readouterr().out == (
        "no job waits in a queue of team nobody (trainyard submit SPEC submits one)\n"
    )


def test_a_long_line_is_cut_at_the_limit_and_says_so(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """At 100,000 waiting the scheduler answers a queue's head (100); the CLI prints at most
    ``--limit`` (20) of each queue, and says how many wait, without asking for more."""
    head = [_job(n) for n in range(1, 101)]
    scheduler["route"] = lambda r: _answer(_queue("vision", "vision", head, waiting=100_000))
    assert cli.main([*BASE, "queue", "--all-teams"]) == Exit.OK
    captured = capsys.readouterr()
    assert len(scheduler["sent"]) == 1
    assert [line.split()[2] for line in captured.out.splitlines()[1:]] == [
        str(n) for n in range(1, 21)
    ]
    assert captured.err == "queue vision: 20 of 100000 waiting jobs shown (--limit N shows more)\n"


def _paged(head: list[dict[str, Any]], waiting: int, pages: list[list[dict[str, Any]]]) -> Any:
    """The scheduler: ``GET /v1/queue`` with queue ``vi/sion``'s ``head``, and its pending
    ``pages`` (the next one's cursor in ``Link``)."""

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/queue":
            return _answer(_queue("vi/sion", "vision", head, waiting))
        index = int(request.url.params.get("after") or 0)
        link = f'<{SCHEDULER}/v1/queue/vi%2Fsion/pending?limit=x&after={index + 1}>; rel="next"'
        headers = {"Link": link} if index + 1 < len(pages) else {}
        return httpx.Response(200, json=pages[index], headers=headers)

    return route


def test_a_limit_past_the_head_reads_the_queues_pages_only_as_far_as_needed(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [_job(n) for n in range(1, 301)]
    scheduler["route"] = _paged(jobs[:100], 300, [jobs[:120], jobs[120:240], jobs[240:]])
    assert cli.main([*BASE, "queue", "--all-teams", "--limit", "150", "--json"]) == Exit.OK
    captured = capsys.readouterr()
    assert [(r.url.raw_path, r.url.params.get("after")) for r in scheduler["sent"]] == [
        (b"/v1/queue", None),
        (b"/v1/queue/vi%2Fsion/pending?limit=150", None),
        (b"/v1/queue/vi%2Fsion/pending?limit=x&after=1", "1"),
    ]  # the third page is never asked for
    (shown,) = json.loads(captured.out)
    assert (shown["name"], shown["waiting"]) == ("vi/sion", 300)
    assert shown["pending"] == jobs[:150]
    assert captured.err == "queue vi/sion: 150 of 300 waiting jobs shown (--limit N shows more)\n"


def test_a_flavor_down_the_line_is_found_in_the_largest_pages(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [_job(n) for n in range(1, 2001)] + [_job(2001, "a100")]
    scheduler["route"] = _paged(jobs[:100], 2001, [jobs[:1000], jobs[1000:2000], jobs[2000:]])
    argv = [*BASE, "queue", "--all-teams", "--flavor", "a100", "--limit", "1"]
    assert cli.main(argv) == Exit.OK
    captured = capsys.readouterr()
    assert [r.url.params.get("limit") for r in scheduler["sent"][1:]] == ["1000", "x", "x"]
    assert [line.split()[2:6] for line in captured.out.splitlines()[1:]] == [
        ["2001", "00002001", "8", "a100"]
    ]
    assert captured.err == (
        "queue vi/sion: the first 1 waiting jobs of flavor a100 shown, of 2001 in all "
        "(--limit N shows more)\n"
    )


@pytest.mark.parametrize("option", [["--team", "vision"], ["--flavor", "h100"]])
def test_filters_without_all_teams_are_a_usage_error(
    option: list[str], scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*BASE, "queue", *option]) == Exit.USAGE
    assert scheduler["sent"] == []
    assert capsys.readouterr().err == (
        "trainyard: error: --team and --flavor go with --all-teams (operators)\n"
    )


def test_a_users_token_is_refused_in_one_line(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    detail = "GET /v1/queue needs the operator role; you are admin"
    scheduler["route"] = lambda r: httpx.Response(403, json={"detail": detail, "errors": []})
    assert cli.main([*BASE, "queue", "--all-teams"]) == Exit.DENIED
    assert capsys.readouterr().err == f"trainyard: error: scheduler: 403 {detail}\n"


def test_without_a_scheduler_url_it_says_how_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    routed_api(tmp_path, monkeypatch, {})
    monkeypatch.delenv("TRAINYARD_SCHEDULER_URL", raising=False)
    assert cli.main([*BASE, "queue", "--all-teams"]) == Exit.NOT_CONFIGURED
    assert "TRAINYARD_SCHEDULER_URL" in capsys.readouterr().err


def test_a_malformed_waiting_job_is_one_line(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scheduler["route"] = lambda r: _answer(_queue("vision", "vision", [_job(1, gpus="8")]))
    assert cli.main([*BASE, "queue", "--all-teams"]) == Exit.ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "queues[0].pending[0].gpus: expected an integer" in err, err


def test_a_queue_gone_while_its_pages_are_read_is_one_line(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/queue":
            return _answer(_queue("vision", "vision", [_job(1)], waiting=500))
        return httpx.Response(404, json={"detail": "no queue vision", "errors": []})

    scheduler["route"] = route
    assert cli.main([*BASE, "queue", "--all-teams", "--limit", "200"]) == Exit.NOT_FOUND
    assert capsys.readouterr().err == "trainyard: error: scheduler: 404 no queue vision\n"
