"""``trainyard nodes ls|cordon|uncordon|retire``: what they ask the scheduler, what they print,
and how its refusals read (one line each, the CLI's exit codes). Operators cordoned with curl
before: the CLI had no node command; and no command (nor route) retired a node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

SCHEDULER = "http://scheduler.test"
BASE = ["--url", "http://submission.test", "--token", "ty_op"]
T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00+00:00"
NODES = [
    {
        "node_id": "gpu-08",
        "hostname": "gpu-08",
        "gpu_flavor": "h100",
        "topology": "nvlink",
        "status": "READY",
        "gpu_count": 8,
        "free_gpus": [2, 3, 4, 5, 6, 7],
        "used_gpus": {"0": "j-1", "1": "j-1"},
        "last_heartbeat": T1,
        "cordon": None,
    },
    {
        "node_id": "gpu-07",
        "hostname": "gpu-07",
        "gpu_flavor": "h100",
        "topology": "nvlink",
        "status": "READY",
        "gpu_count": 8,
        "free_gpus": [],
        "used_gpus": {"3": "j-2"},
        "last_heartbeat": T1,
        "cordon": {
            "reason": "3 platform failures in a row:\nno space left",
            "by": "scheduler",
            "since": T0,
            "until": "2026-12-01T10:10:00Z",
        },
    },
    {
        "node_id": "a100-1",
        "hostname": "a100-1",
        "gpu_flavor": "a100",
        "topology": "pcie",
        "status": "LOST",
        "gpu_count": 4,
        "free_gpus": [],
        "used_gpus": {},
        "last_heartbeat": T0,
        "cordon": None,
    },
]

Route = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The scheduler's API, answering what ``state["route"]`` says; ``state["sent"]``: every
    request the CLI made."""
    return routed_api(tmp_path, monkeypatch, {"TRAINYARD_SCHEDULER_URL": SCHEDULER})


def _queue(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"nodes": NODES, "allocations": [], "queues": []})


def test_ls_shows_every_node_by_id_with_gpus_state_and_cordon(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scheduler["route"] = _queue
    assert cli.main([*BASE, "nodes", "ls"]) == Exit.OK
    out = capsys.readouterr().out.splitlines()
    assert [str(r.url) for r in scheduler["sent"]] == [f"{SCHEDULER}/v1/queue"]
    assert out[0].split() == [
        "NODE", "FLAVOR", "GPUS", "USED", "FREE", "STATE", "LAST", "HEARD", "CORDON"
    ]  # fmt: skip
    assert [line.split()[:6] for line in out[1:]] == [
        ["a100-1", "a100", "4", "0", "0", "lost"],
        ["gpu-07", "h100", "8", "1", "0", "cordoned"],
        ["gpu-08", "h100", "8", "2", "6", "ready"],
    ]
    assert out[2].endswith(
        "by scheduler since 2026-12-01 10:00:00Z until 2026-12-01 10:10:00Z: "
        "3 platform failures in a row: no space left"
    ), out[2]  # the reason's line break does not break the row
    assert out[3].split()[6:] == ["2026-12-01", "10:05:00Z", "-"]


def test_ls_json_prints_the_schedulers_nodes(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scheduler["route"] = _queue
    assert cli.main([*BASE, "nodes", "ls", "--json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == NODES


def test_cordon_sends_the_reason_and_says_the_cordon(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cordon = {"reason": "replacing a fan", "by": "ops", "since": T0, "until": None}
    scheduler["route"] = lambda r: httpx.Response(200, json={"node_id": "gpu/7", "cordon": cordon})
    assert cli.main([*BASE, "nodes", "cordon", "gpu/7", "--reason", "replacing a fan"]) == 0
    (request,) = scheduler["sent"]
    assert (request.method, request.url.raw_path) == ("POST", b"/v1/admin/nodes/gpu%2F7/cordon")
    assert json.loads(request.content) == {"reason": "replacing a fan"}
    assert request.headers["authorization"] == "Bearer ty_op"
    assert capsys.readouterr().out == (
        "cordoned gpu/7: by ops since 2026-12-01 10:00:00Z until uncordoned: replacing a fan\n"
    )


def test_uncordon(scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    scheduler["route"] = lambda r: httpx.Response(200, json={"node_id": "gpu-7", "cordon": None})
    assert cli.main([*BASE, "nodes", "uncordon", "gpu-7", "--json"]) == Exit.OK
    assert [(r.method, r.url.path) for r in scheduler["sent"]] == [
        ("POST", "/v1/admin/nodes/gpu-7/uncordon")
    ]
    assert json.loads(capsys.readouterr().out) == {"node_id": "gpu-7", "cordon": None}


def test_retire_deletes_the_node_and_says_so(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scheduler["route"] = lambda r: httpx.Response(204)
    assert cli.main([*BASE, "nodes", "retire", "gpu/7"]) == Exit.OK
    assert cli.main([*BASE, "nodes", "retire", "gpu/7", "--json"]) == Exit.OK
    assert [(r.method, r.url.raw_path) for r in scheduler["sent"]] == [
        ("DELETE", b"/v1/admin/nodes/gpu%2F7")
    ] * 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "retired gpu/7: left out until it heartbeats again"
    assert json.loads("\n".join(out[1:])) == {"retired": "gpu/7"}


def test_ls_retired_asks_for_retired_nodes_and_marks_them(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    retired = {**NODES[2], "retired_at": T1}
    scheduler["route"] = lambda r: httpx.Response(200, json={"nodes": [retired], "allocations": []})
    assert cli.main([*BASE, "nodes", "ls", "--retired"]) == Exit.OK
    assert [str(r.url) for r in scheduler["sent"]] == [f"{SCHEDULER}/v1/queue?retired=true"]
    assert capsys.readouterr().out.splitlines()[1].split()[:6] == [
        "a100-1", "a100", "4", "0", "0", "retired"
    ]  # fmt: skip


def _refusal(status: int, detail: str, errors: list[dict[str, str]] | None = None) -> Route:
    return lambda r: httpx.Response(status, json={"detail": detail, "errors": errors or []})


@pytest.mark.parametrize(
    ("argv", "route", "code", "line"),
    [
        (
            ["nodes", "ls"],
            _refusal(403, "GET /v1/queue needs the operator role; you are admin"),
            Exit.DENIED,
            "scheduler: 403 GET /v1/queue needs the operator role; you are admin",
        ),
        (
            ["nodes", "cordon", "gpu-7", "--reason", "fan"],
            _refusal(
                403, "POST /v1/admin/nodes/gpu-7/cordon needs the operator role; you are admin"
            ),
            Exit.DENIED,
            "scheduler: 403 POST /v1/admin/nodes/gpu-7/cordon needs the operator role; you are admin",
        ),
        (
            ["nodes", "uncordon", "gpu-9"],
            _refusal(404, "no node gpu-9"),
            Exit.NOT_FOUND,
            "scheduler: 404 no node gpu-9",
        ),
        (
            ["nodes", "retire", "gpu-7"],
            _refusal(409, "node gpu-7 is ready (last heartbeat 2026-12-01T10:05:00+00:00): ..."),
            Exit.ERROR,
            "scheduler: 409 node gpu-7 is ready (last heartbeat 2026-12-01T10:05:00+00:00): ...",
        ),
        (
            ["nodes", "cordon", "gpu-7", "--reason", "x" * 501],
            _refusal(
                422,
                "invalid request",
                [{"field": "reason", "message": "must be at most 500 characters"}],
            ),
            Exit.ERROR,
            "scheduler: 422 invalid request (reason: must be at most 500 characters)",
        ),
    ],
)
def test_a_refusal_is_one_line_with_its_exit_code(
    argv: list[str],
    route: Route,
    code: Exit,
    line: str,
    scheduler: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    scheduler["route"] = route
    assert cli.main([*BASE, *argv]) == code
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"trainyard: error: {line}\n")


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_blank_reason_is_refused_before_any_request(
    reason: str, scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*BASE, "nodes", "cordon", "gpu-7", "--reason", reason]) == Exit.USAGE
    assert capsys.readouterr().err == "trainyard: error: --reason is empty: give a value\n"
    assert scheduler["sent"] == []


def test_no_reason_is_a_usage_error(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error
        cli.main([*BASE, "nodes", "cordon", "gpu-7"])
    assert usage.value.code == Exit.USAGE
    assert "the following arguments are required: --reason" in capsys.readouterr().err
    assert scheduler["sent"] == []


def test_without_a_scheduler_url_it_says_how_to_give_one(
    scheduler: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINYARD_SCHEDULER_URL")
    assert cli.main([*BASE, "nodes", "ls"]) == Exit.NOT_CONFIGURED
    assert capsys.readouterr().err == (
        "trainyard: error: no scheduler URL: set TRAINYARD_SCHEDULER_URL or "
        "trainyard login URL --scheduler-url SCHEDULER_URL\n"
    )
    assert scheduler["sent"] == []


def test_ls_shows_a_node_with_no_flavor_as_a_dash(
    scheduler: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """An undeclared node while the node inventory is required has no flavor (the scheduler
    says ``""``); before, its row had an empty column, and its cells read one column off."""
    undeclared = {
        **NODES[0],
        "node_id": "gpu-09",
        "gpu_flavor": "",
        "gpu_count": 0,
        "free_gpus": [],
        "used_gpus": {},
        "capped": ["undeclared"],
        "reported": {"gpu_flavor": "h200", "gpu_count": 8, "topology": "default"},
    }
    scheduler["route"] = lambda request: httpx.Response(
        200, json={"nodes": [undeclared], "allocations": [], "queues": []}
    )
    assert cli.main([*BASE, "nodes", "ls"]) == Exit.OK
    row = capsys.readouterr().out.splitlines()[1]
    assert row.split()[:7] == ["gpu-09", "-", "0", "0", "0", "ready", "(capped:"]
