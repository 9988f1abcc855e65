"""An empty listing says what to do next: the command that makes the first one
(``cli_render.none_yet``). ``budget ls`` said only ``no budgets``, ``admin KIND ls`` ``no
queues``, ``admin prices ls`` ``no prices``, ``ls`` ``no jobs``, ``model alias history``
``no moves``, ``models NAME`` ``no versions``, ``experiments EXP`` ``no runs``, and ``token
list`` and ``user list`` printed a bare header, while ``dataset ls`` and ``model ls``
already named the command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

BASE = ["--url", "http://submission.test", "--token", "ty_op"]


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


def _empty(request: httpx.Request) -> httpx.Response:
    """Every list empty: a plain list, or the registry's paged object."""
    path = request.url.path
    if path.endswith("/moves"):
        return httpx.Response(200, json={"moves": [], "next": None})
    if path.endswith("/versions"):
        return httpx.Response(200, json={"versions": [], "next": None})
    if path == "/v1/me":
        return httpx.Response(200, json={"team": "ml", "user": "ana", "role": "admin"})
    return httpx.Response(200, json=[])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["budget", "ls"],
            "no budgets (trainyard budget set TEAM --amount A creates one)",
        ),
        (
            ["budget", "ls", "--team", "nlp"],
            "no budgets of team nlp (trainyard budget set nlp --amount A creates one)",
        ),
        (
            ["admin", "queues", "ls"],
            "no queues (trainyard admin queues set NAME --team T creates one)",
        ),
        (
            ["admin", "priority-classes", "ls"],
            "no priority-classes (trainyard admin priority-classes set NAME --value N "
            "--preemptible creates one)",
        ),
        (
            ["admin", "flavors", "ls"],
            "no flavors (trainyard admin flavors set NAME creates one)",
        ),
        (
            ["admin", "prices", "ls"],
            "no prices (trainyard admin prices set FLAVOR --gpu-hour P sets one)",
        ),
        (
            ["admin", "prices", "ls", "--flavor", "h100"],
            "no prices of h100 (trainyard admin prices set h100 --gpu-hour P sets one)",
        ),
        (["ls"], "no jobs (trainyard submit SPEC submits one)"),
        (["token", "list"], "no tokens (trainyard token create makes one)"),
        (["user", "list"], "no users (trainyard user add NAME adds one)"),
        (
            ["model", "alias", "history", "ml/bert", "prod"],
            "no moves (trainyard model alias set ml/bert prod VERSION sets it)",
        ),
        (
            ["models", "bert"],
            "no versions (trainyard model register ml/bert --job JOB adds one)",
        ),
        (["context", "ls"], "no contexts (trainyard login URL stores one)"),
    ],
)
def test_an_empty_listing_names_the_command_that_makes_one(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    api["route"] = _empty
    assert cli.main([*BASE, *argv]) == Exit.OK
    assert capsys.readouterr().out == said + "\n"


def test_an_experiment_without_runs_names_how_to_add_one(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = {
        "id": 7,
        "team": "ml",
        "project": "p",
        "name": "sweep",
        "created_at": "2026-12-01T00:00:00Z",
        "runs": 0,
        "running": 0,
        "last_started_at": None,
    }

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/experiments":
            return httpx.Response(200, json={"experiments": [experiment], "next": None})
        return httpx.Response(200, json={"experiment": experiment, "runs": [], "next": None})

    api["route"] = route
    assert cli.main([*BASE, "experiments", "sweep"]) == Exit.OK
    assert capsys.readouterr().out == (
        "no runs (trainyard submit SPEC --experiment sweep adds one)\n"
    )


JOB = "0e4c1b9a-5d2f-4c7e-9a1b-2f3d4e5f6a7b"


def _empty_operator_views(request: httpx.Request) -> httpx.Response:
    """The audit log, a job's metrics, the nodes and the queue, each empty."""
    path = request.url.path
    if path == "/v1/queue":
        return httpx.Response(200, json={"nodes": [], "queues": []})
    if path.endswith("/metrics"):
        return httpx.Response(200, json={"metrics": []})
    return httpx.Response(200, json=[])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["audit"], "no audit entries (trainyard user add NAME, or any change, records one)"),
        (
            ["audit", "--before", "40"],
            "no audit entries before id 40 (trainyard audit shows the newest)",
        ),
        (
            ["metrics", JOB],
            "no metrics reported (ctx.report_metrics(STEP, NAME=VALUE) in the job reports "
            f"some; trainyard logs {JOB} shows what it printed)",
        ),
        (
            ["nodes", "ls"],
            "no nodes: none has sent a heartbeat yet (python -m "
            "trainyard_platform.services.runner on a GPU machine starts one)",
        ),
        (
            ["queue"],
            "no job of your team waits (trainyard ls shows the others; trainyard submit SPEC "
            "submits one)",
        ),
    ],
)
def test_an_empty_operator_view_names_a_next_step(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    """``audit`` printed a bare header, ``metrics``, ``nodes ls`` and ``queue`` a line with
    nothing to do next."""
    api["route"] = _empty_operator_views
    assert cli.main([*BASE, *argv]) == Exit.OK
    assert capsys.readouterr().out == said + "\n"
