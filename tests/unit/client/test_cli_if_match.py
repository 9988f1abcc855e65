"""``--if-match ETAG`` on every conditional write the CLI has a command for, and a ``show``
that prints each ETag: node cordons, run notes, users, job cancel, prices, model version
delete. Before, only budgets, the scheduler's configuration and model aliases could be
written conditionally: the services answered ETags nobody could see nor send back.

Each write sends the tag as ``If-Match``; on the service's 412 it says, in the words budget
and admin use, that nothing changed and which command shows the resource now (exit 1). Each
``show`` prints ``etag: "..."`` last; with ``--json`` the answer alone on stdout and the
``etag:`` line on stderr (one rule for every ``show``, budget's and admin's too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

SUBMISSION = "http://submission.test"
BASE = ["--url", SUBMISSION, "--token", "ty_op"]
JOB = "0b7e6c4e-1a2b-4c3d-8e9f-0123456789ab"
T0 = "2026-12-01T10:00:00+00:00"
TAG = '"t1"'
STALE = 'it was changed since it was read (its ETag is now "t2", not "t1")'

CORDON = {"node_id": "gpu-07", "cordon": {"reason": "disk", "by": "op", "since": T0}}
NOTE = {"job_id": JOB, "tags": ["best"], "note": "lr too high"}
USER = {"name": "ana", "team": "ml", "role": "member", "created_at": T0, "disabled_at": None}
PRICE = {
    "flavor": "h100",
    "effective_from": T0,
    "price_per_gpu_hour": "2.750000",
    "price_per_cpu_hour": None,
    "price_per_memory_gib_hour": None,
    "currency": "EUR",
    "in_force": True,
    "set_by": "op",
}
VERSION = {
    "team": "ml",
    "model": "bert",
    "version": 3,
    "job_id": JOB,
    "registered_at": T0,
    "metrics": {},
    "artifact": {"uri": "s3://m/3", "sha256": "ab" * 32, "size_bytes": 10},
}
JOB_VIEW = {
    "id": JOB,
    "name": "train",
    "status": "RUNNING",
    "terminal": False,
    "team": "ml",
    "user": "ana",
    "spec": {"gpus": 1, "gpu_flavor": "h100", "entrypoint": "train.py"},
    "submitted_at": T0,
    "checkpoints": [],
    "metrics": {},
    "cost": {"final": False, "currency": None},
    "history": [],
}

# (show command, its answer, write command, its method and path, the command a 412 names)
CASES = [
    (
        ["nodes", "show", "gpu-07"],
        CORDON,
        ["nodes", "cordon", "gpu-07", "--reason", "disk"],
        ("POST", "/v1/admin/nodes/gpu-07/cordon"),
        "trainyard nodes show gpu-07",
    ),
    (
        ["nodes", "show", "gpu-07"],
        CORDON,
        ["nodes", "uncordon", "gpu-07"],
        ("POST", "/v1/admin/nodes/gpu-07/uncordon"),
        "trainyard nodes show gpu-07",
    ),
    (
        ["note", JOB],
        NOTE,
        ["note", JOB, "lr fine"],
        ("PUT", f"/v1/jobs/{JOB}/note"),
        f"trainyard note {JOB}",
    ),
    (
        ["user", "show", "ana"],
        USER,
        ["user", "role", "ana", "admin"],
        ("PATCH", "/v1/admin/users/ana"),
        "trainyard user show ana",
    ),
    (
        ["user", "show", "ana"],
        USER,
        ["user", "disable", "ana"],
        ("DELETE", "/v1/admin/users/ana"),
        "trainyard user show ana",
    ),
    (
        ["describe", JOB],
        JOB_VIEW,
        ["cancel", JOB],
        ("POST", f"/v1/jobs/{JOB}/cancel"),
        f"trainyard describe {JOB}",
    ),
    (
        ["admin", "prices", "show", "h100"],
        [PRICE],
        ["admin", "prices", "set", "h100", "--gpu-hour", "3"],
        ("PUT", "/v1/prices/h100"),
        "trainyard admin prices show h100",
    ),
    (
        ["model", "show", "ml/bert:3"],
        VERSION,
        ["model", "rm", "ml/bert", "3"],
        ("DELETE", "/v1/models/ml/bert/versions/3"),
        "trainyard model show ml/bert:3",
    ),
]
SERVICES = {
    "nodes": "scheduler",
    "note": "registry",
    "user": "submission",
    "describe": "submission",
    "admin": "billing",
    "model": "registry",
}


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return routed_api(
        tmp_path,
        monkeypatch,
        {
            "TRAINYARD_SCHEDULER_URL": "http://scheduler.test",
            "TRAINYARD_REGISTRY_URL": "http://registry.test",
            "TRAINYARD_BILLING_URL": "http://billing.test",
        },
    )


def _answer(shown: Any, write: tuple[str, str]) -> Any:
    """A route answering ``GET`` with ``shown`` and its tag, the write with what it made."""

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=shown, headers={"ETag": TAG})
        if request.method == "DELETE" and write[1].startswith("/v1/admin/users/"):
            return httpx.Response(204)
        made = shown[0] if isinstance(shown, list) else shown
        return httpx.Response(200, json=made, headers={"ETag": '"t2"'})

    return route


@pytest.mark.parametrize(("show", "shown", "write", "sent", "reread"), CASES)
def test_show_prints_the_etag_and_the_write_sends_it_as_if_match(
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    show: list[str],
    shown: Any,
    write: list[str],
    sent: tuple[str, str],
    reread: str,
) -> None:
    api["route"] = _answer(shown, sent)
    assert cli.main([*BASE, *show]) == Exit.OK
    assert capsys.readouterr().out.splitlines()[-1] == f"etag: {TAG}"
    assert cli.main([*BASE, *show, "--json"]) == Exit.OK
    out = capsys.readouterr()
    assert json.loads(out.out) == shown  # the service's answer as it is
    assert out.err == f"etag: {TAG}\n"
    api["sent"].clear()
    assert cli.main([*BASE, *write, "--if-match", TAG]) == Exit.OK
    request = api["sent"][-1]
    assert (request.method, request.url.path) == sent
    assert request.headers["If-Match"] == TAG
    api["sent"].clear()
    assert cli.main([*BASE, *write]) == Exit.OK  # without it, as before: no condition
    assert "If-Match" not in api["sent"][-1].headers


@pytest.mark.parametrize(("show", "shown", "write", "sent", "reread"), CASES)
def test_a_412_says_nothing_changed_and_which_command_shows_it_now(
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    show: list[str],
    shown: Any,
    write: list[str],
    sent: tuple[str, str],
    reread: str,
) -> None:
    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # a job prefix resolved, an alias read: not the write
            return httpx.Response(200, json=shown, headers={"ETag": TAG})
        message = f"{STALE}: nothing changed; read it again"
        return httpx.Response(
            412,
            json={
                "detail": f"If-Match: {message}",
                "errors": [{"field": "If-Match", "message": message}],
            },
        )

    api["route"] = route
    assert cli.main([*BASE, *write, "--if-match", TAG]) == Exit.ERROR
    service = SERVICES[show[0]]
    assert capsys.readouterr().err == (
        f"trainyard: error: {service}: nothing was changed: someone else changed it since you "
        f"read it ({STALE}). Run `{reread}` to see it as it is now, then repeat the command "
        "with --if-match set to its new ETag if your change still applies.\n"
    )


def test_budget_and_admin_show_print_the_etag_on_stderr_with_json(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The one rule for ``--json``: the answer on stdout, as the service sent it; the tag on
    stderr. Budget's and admin's ``show`` printed no tag with ``--json`` at all."""
    flavor = {"name": "h100", "nodes": 1, "ready_nodes": 1, "gpus": 8, "ready_gpus": 8}
    api["route"] = lambda r: httpx.Response(
        200, json={**flavor, "description": ""}, headers={"ETag": TAG}
    )
    assert cli.main([*BASE, "admin", "flavors", "show", "h100", "--json"]) == Exit.OK
    out = capsys.readouterr()
    assert json.loads(out.out)["name"] == "h100"
    assert out.err == f"etag: {TAG}\n"


def test_cancel_if_match_takes_one_job(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """An ETag is of one job: with several, a usage error before any request."""
    assert cli.main([*BASE, "cancel", JOB, "0b7e", "--if-match", TAG]) == Exit.USAGE
    assert api["sent"] == []
    assert "--if-match takes one JOB" in capsys.readouterr().err


def test_note_if_match_without_text_is_a_usage_error(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*BASE, "note", JOB, "--if-match", TAG]) == Exit.USAGE
    assert "give TEXT" in capsys.readouterr().err


MODEL = {
    "team": "ml",
    "name": "bert",
    "project": "nlp",
    "latest_version": 3,
    "versions": 0,
    "aliases": {},
    "created_at": T0,
    "grants": [],
}
DELETED = {"team": "ml", "model": "bert", "tombstones": 3}


def test_model_show_prints_its_etag_and_delete_sends_it_as_if_match(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``model show TEAM/NAME`` prints the model's ETag last (on stderr with ``--json``);
    ``model delete TEAM/NAME --if-match`` sends it, and without it no condition. Before,
    a model could not be deleted, and its ``show`` printed no tag."""

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/versions"):
            return httpx.Response(200, json={"versions": [], "next": None})
        if request.method == "GET":
            return httpx.Response(200, json=MODEL, headers={"ETag": TAG})
        return httpx.Response(200, json=DELETED)

    api["route"] = route
    assert cli.main([*BASE, "model", "show", "ml/bert"]) == Exit.OK
    assert capsys.readouterr().out.splitlines()[-1] == f"etag: {TAG}"
    assert cli.main([*BASE, "model", "show", "ml/bert", "--json"]) == Exit.OK
    out = capsys.readouterr()
    assert json.loads(out.out)["name"] == "bert" and out.err == f"etag: {TAG}\n"
    api["sent"].clear()
    assert cli.main([*BASE, "model", "delete", "ml/bert", "--if-match", TAG]) == Exit.OK
    request = api["sent"][-1]
    assert (request.method, request.url.path) == ("DELETE", "/v1/models/ml/bert")
    assert request.headers["If-Match"] == TAG
    assert capsys.readouterr().out == (
        "deleted ml/bert; its name is free (its 3 deleted versions stay in the lineage made "
        "from them)\n"
    )
    assert cli.main([*BASE, "model", "delete", "ml/bert"]) == Exit.OK
    assert "If-Match" not in api["sent"][-1].headers


@pytest.mark.parametrize(
    ("status", "detail"),
    [
        (412, "If-Match: it was changed since it was read"),
        (409, "model ml/bert has 1 live version (3): delete it first"),
    ],
)
def test_a_refused_model_delete_is_one_line(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], status: int, detail: str
) -> None:
    field = [{"field": "If-Match", "message": detail}] if status == 412 else []
    api["route"] = lambda r: httpx.Response(status, json={"detail": detail, "errors": field})
    assert cli.main([*BASE, "model", "delete", "ml/bert", "--if-match", TAG]) == Exit.ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert ("trainyard model show ml/bert" if status == 412 else detail) in err


@pytest.mark.parametrize(
    ("tombstones", "said"),
    [
        (0, "deleted ml/bert; its name is free"),
        (
            1,
            "deleted ml/bert; its name is free (its 1 deleted version stays in the lineage "
            "made from it)",
        ),
    ],
)
def test_a_model_delete_counts_its_tombstones_in_words_that_fit(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], tombstones: int, said: str
) -> None:
    """A model never given a version keeps no tombstone, and one kept is one version. Before:
    'its 0 deleted versions stay in the lineage made from them', 'its 1 deleted versions'."""
    api["route"] = lambda request: httpx.Response(200, json={**DELETED, "tombstones": tombstones})
    assert cli.main([*BASE, "model", "delete", "ml/bert"]) == Exit.OK
    assert capsys.readouterr().out == f"{said}\n"
