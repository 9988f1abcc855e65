"""``trainyard admin KIND ls|show|set|rm`` and ``admin prices ls|set``: the requests they send
the scheduler and billing (bodies as the routes take them), what they print, and how a
refusal reads (one line, the CLI's exit codes). Operators wrote these JSON bodies by hand with
curl before: the CLI had no governance command."""

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
BILLING = "http://billing.test"
BASE = ["--url", "http://submission.test", "--token", "ty_op"]
T0 = "2026-12-01T10:00:00Z"
QUEUE = {
    "name": "ml-prod",
    "team": "ml",
    "cohort": "research",
    "weight": 2.0,
    "implicit": False,
    "quotas": {
        "h200": {"nominal": 8, "borrowing_limit": 4, "lending_limit": None},
        "a100": {"nominal": 2, "borrowing_limit": None, "lending_limit": None},
    },
}
PRICE = {
    "flavor": "h200",
    "effective_from": T0,
    "price_per_gpu_hour": "2.75",
    "price_per_cpu_hour": None,
    "price_per_memory_gib_hour": "0.01",
    "currency": "EUR",
    "set_by": "ops",
    "in_force": False,
}

Route = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The scheduler's and billing's APIs, answering what ``state["route"]`` says;
    ``state["sent"]``: every request the CLI made."""
    return routed_api(
        tmp_path,
        monkeypatch,
        {"TRAINYARD_SCHEDULER_URL": SCHEDULER, "TRAINYARD_BILLING_URL": BILLING},
    )


def _sent(state: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [
        (r.method, str(r.url), json.loads(r.content) if r.content else None) for r in state["sent"]
    ]


def test_queues_ls_follows_every_page_and_shows_quotas(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    implicit = {**QUEUE, "name": "default:cv", "team": "cv", "cohort": None, "quotas": {}}
    implicit["implicit"], implicit["weight"] = True, 1.0

    def route(request: httpx.Request) -> httpx.Response:
        if "after" in request.url.params:
            return httpx.Response(200, json=[QUEUE])
        link = '</v1/admin/queues?limit=100&after=c1>; rel="next"'
        return httpx.Response(200, json=[implicit], headers={"Link": link})

    api["route"] = route
    assert cli.main([*BASE, "admin", "queues", "ls"]) == Exit.OK
    assert [url for _, url, _ in _sent(api)] == [
        f"{SCHEDULER}/v1/admin/queues",
        f"{SCHEDULER}/v1/admin/queues?limit=100&after=c1",
    ]
    assert capsys.readouterr().out.splitlines() == [
        "NAME                   TEAM  COHORT    WEIGHT  QUOTAS",
        "default:cv (implicit)  cv    -         1       -",
        "ml-prod                ml    research  2       a100=2, h200=8 (borrow 4)",
    ]


def _absent_then(status: int, view: dict[str, Any]) -> Route:
    """A scheduler with no such resource yet: ``PATCH`` answers 404, ``PUT`` ``status``."""
    return lambda r: (
        httpx.Response(404, json={"detail": "no queue", "errors": []})
        if r.method == "PATCH"
        else httpx.Response(status, json=view)
    )


def test_queues_set_creates_with_the_whole_definition_when_there_is_none(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = _absent_then(201, QUEUE)
    argv = ["admin", "queues", "set", "ml-prod", "--team", "ml", "--cohort", "research"]
    argv += ["--weight", "2", "--quota", "h200=8", "--borrow", "h200=4", "--quota", "a100=2"]
    argv += ["--lend", "a100=0"]
    assert cli.main([*BASE, *argv]) == Exit.OK
    definition = {
        "team": "ml",
        "cohort": "research",
        "weight": 2.0,
        "quotas": {
            "h200": {"nominal": 8, "borrowing_limit": 4},
            "a100": {"nominal": 2, "lending_limit": 0},
        },
    }
    path = f"{SCHEDULER}/v1/admin/queues/ml-prod"
    assert _sent(api) == [("PATCH", path, definition), ("PUT", path, definition)]
    assert api["sent"][1].headers["If-None-Match"] == "*"  # creates, replaces nothing
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "created queue ml-prod"
    assert out[2].split()[:4] == ["ml-prod", "ml", "research", "2"]


@pytest.mark.parametrize(
    ("argv", "route", "theirs", "defaults"),
    [
        (
            ["queues", "set", "ml-prod", "--team", "ml", "--weight", "3"],
            "queues/ml-prod",
            {**QUEUE, "weight": 1.0, "cohort": "research"},
            {"name": "ml-prod", "cohort": None, "weight": 1.0, "implicit": False, "quotas": {}},
        ),
        (
            ["priority-classes", "set", "hi", "--value", "5", "--preemptible"],
            "priority-classes/hi",
            {
                "name": "hi",
                "value": 1,
                "preemptible": False,
                "min_runtime_seconds": 600.0,
                "description": "theirs",
            },
            {"name": "hi", "min_runtime_seconds": 0.0, "description": ""},
        ),
    ],
)
def test_set_does_not_replace_one_another_admin_created_since_its_patch(
    argv: list[str],
    route: str,
    theirs: dict[str, Any],
    defaults: dict[str, Any],
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The patch finds none (404), then another admin creates it. Before, ``set`` then put
    its options alone and the other admin's definition was replaced (its cohort, quotas,
    runtime back to the defaults). Now its ``PUT`` says ``If-None-Match: *``: the scheduler
    answers 412 and ``set`` patches what is there, once."""
    kept: dict[str, Any] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH" and not kept:
            kept.update(theirs)  # the other admin's, just after
            return httpx.Response(404, json={"detail": "none", "errors": []})
        if request.method == "PUT" and request.headers.get("If-None-Match") == "*":
            return httpx.Response(412, json={"detail": "it exists already", "errors": []})
        if request.method == "PUT":  # without the header it replaces the whole definition
            kept.clear()
            kept.update(defaults)
        kept.update(json.loads(request.content))
        return httpx.Response(200, json=kept)

    api["route"] = answer
    assert cli.main([*BASE, "admin", *argv]) == Exit.OK
    path = f"{SCHEDULER}/v1/admin/{route}"
    assert [(method, url) for method, url, _ in _sent(api)] == [
        ("PATCH", path),
        ("PUT", path),
        ("PATCH", path),
    ]
    assert api["sent"][1].headers["If-None-Match"] == "*"
    # What the options name is changed; the rest of the other admin's definition stays.
    untouched = {k: v for k, v in theirs.items() if k not in _sent(api)[0][2]}
    assert {k: kept.get(k) for k in untouched} == untouched
    assert capsys.readouterr().out.startswith("set ")


def test_queues_set_changes_only_what_its_options_name(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator raising one queue's weight keeps its team, cohort and quotas: a ``set``
    used to replace the whole queue, so a forgotten ``--quota`` dropped the team's quota."""
    api["route"] = lambda r: httpx.Response(200, json={**QUEUE, "weight": 3.0})
    assert cli.main([*BASE, "admin", "queues", "set", "ml-prod", "--weight", "3"]) == Exit.OK
    assert _sent(api) == [("PATCH", f"{SCHEDULER}/v1/admin/queues/ml-prod", {"weight": 3.0})]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "set queue ml-prod"
    assert out[2].split()[3:] == ["3", "a100=2,", "h200=8", "(borrow", "4)"]
    argv = ["admin", "queues", "set", "ml-prod", "--borrow", "h200=none", "--lend", "a100=1"]
    argv += ["--remove-quota", "v100", "--no-cohort"]
    assert cli.main([*BASE, *argv]) == Exit.OK
    assert _sent(api)[-1][2] == {
        "quotas": {"h200": {"borrowing_limit": None}, "a100": {"lending_limit": 1}, "v100": None},
        "cohort": None,
    }


def test_queues_set_replace_sends_no_defaults(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--replace`` is one ``PUT``; what is left out is the scheduler's default, not one the
    CLI invents."""
    api["route"] = lambda r: httpx.Response(200, json={**QUEUE, "cohort": None, "quotas": {}})
    argv = ["admin", "queues", "set", "q", "--team", "ml", "--replace", "--json"]
    assert cli.main([*BASE, *argv]) == 0
    assert _sent(api) == [("PUT", f"{SCHEDULER}/v1/admin/queues/q", {"team": "ml", "quotas": {}})]
    assert json.loads(capsys.readouterr().out)["quotas"] == {}


def test_what_the_scheduler_refuses_in_a_patch_is_one_line(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    errors = [{"field": "quotas.h200.nominal", "message": "field required"}]
    api["route"] = lambda r: httpx.Response(422, json={"detail": "invalid", "errors": errors})
    argv = ["admin", "queues", "set", "ml-prod", "--borrow", "h200=4"]
    assert cli.main([*BASE, *argv]) == Exit.ERROR
    assert [m for m, _, _ in _sent(api)] == ["PATCH"]  # a refusal is not a reason to PUT
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "trainyard: error: scheduler: 422 invalid (quotas.h200.nominal: field required)"
    ], err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--quota", "h200=abc"], "'h200=abc': 'abc' is not a whole number of GPUs"),
        (["--quota", "h200"], "'h200' is not FLAVOR=N"),
        (["--quota", "=4"], "'=4' is not FLAVOR=N"),
        (["--quota", "h200=8", "--quota", "h200=4"], "--quota names h200 twice"),
        (["--replace", "--borrow", "h200=4"], "--borrow h200=4: give --quota h200=N too"),
        (
            ["--replace", "--quota", "h200=8", "--lend", "a100=1"],
            "--lend a100=1: give --quota a100=N too",
        ),
        (
            ["--quota", "h200=8", "--remove-quota", "h200"],
            "--remove-quota h200: --quota, --borrow or --lend set it",
        ),
        (["--borrow", "h200=4", "--borrow", "h200=none"], "--borrow names h200 twice"),
        (["--borrow", "h200=lots"], "'h200=lots': 'lots' is not a whole number of GPUs"),
        (["--cohort", "a", "--no-cohort"], "not allowed with argument --cohort"),
        (["--weight", "nan"], "'nan' is not a finite number"),
        (["--weight", "many"], "'many' is not a finite number"),
        (["--cohort", " "], "--cohort is empty: give a value or leave the option out"),
    ],
)
def test_queue_options_the_cli_can_judge_are_refused_before_any_request(
    argv: list[str], line: str, api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code = _usage(["admin", "queues", "set", "q", "--team", "ml", *argv])
    assert code == Exit.USAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and line in err, err
    assert api["sent"] == []


def _usage(argv: list[str]) -> int:
    """The exit code of ``argv``: argparse's own usage errors exit through ``SystemExit``."""
    try:
        return cli.main([*BASE, *argv])
    except SystemExit as usage:
        return int(usage.code or 0)


@pytest.mark.parametrize(
    ("argv", "route", "body", "view"),
    [
        (
            ["flavors", "set", "h200", "--description", "H200 141 GB"],
            "flavors/h200",
            {"description": "H200 141 GB"},
            {
                "name": "h200",
                "description": "H200 141 GB",
                "nodes": 0,
                "ready_nodes": 0,
                "gpus": 0,
                "ready_gpus": 0,
            },
        ),
        (
            ["cohorts", "set", "research", "--description", ""],
            "cohorts/research",
            {"description": ""},
            {
                "name": "research",
                "description": "",
                "queues": [],
                "created_at": T0,
                "updated_at": T0,
            },
        ),
        (
            ["priority-classes", "set", "urgent", "--value", "100", "--no-preemptible"],
            "priority-classes/urgent",
            {"value": 100, "preemptible": False},
            {
                "name": "urgent",
                "value": 100,
                "preemptible": False,
                "min_runtime_seconds": 0.0,
                "description": "",
            },
        ),
        (
            [
                *("priority-classes", "set", "low", "--value", "-5", "--preemptible"),
                *("--min-runtime", "600", "--description", "batch"),
            ],
            "priority-classes/low",
            {
                "value": -5,
                "preemptible": True,
                "min_runtime_seconds": 600.0,
                "description": "batch",
            },
            {
                "name": "low",
                "value": -5,
                "preemptible": True,
                "min_runtime_seconds": 600.0,
                "description": "batch",
            },
        ),
    ],
)
def test_set_sends_the_body_the_route_takes_and_says_what_it_did(
    argv: list[str],
    route: str,
    body: dict[str, Any],
    view: dict[str, Any],
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    api["route"] = lambda r: httpx.Response(200, json=view)
    assert cli.main([*BASE, "admin", *argv]) == Exit.OK
    # A flavor's and a cohort's one field is their description: theirs is always a PUT.
    method = "PUT" if argv[0] in ("flavors", "cohorts") else "PATCH"
    assert _sent(api) == [(method, f"{SCHEDULER}/v1/admin/{route}", body)]
    noun = {"flavors": "flavor", "cohorts": "cohort"}.get(argv[0], "priority class")
    assert capsys.readouterr().out.startswith(f"set {noun} {view['name']}\n")


def test_a_new_priority_class_without_what_it_needs_is_named_by_the_scheduler(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    errors = [{"field": "preemptible", "message": "field required"}]

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            return httpx.Response(404, json={"detail": "no priority class x", "errors": []})
        return httpx.Response(422, json={"detail": "invalid request", "errors": errors})

    api["route"] = route
    assert cli.main([*BASE, "admin", "priority-classes", "set", "x", "--value", "1"]) == 1
    path = f"{SCHEDULER}/v1/admin/priority-classes/x"
    assert _sent(api) == [("PATCH", path, {"value": 1}), ("PUT", path, {"value": 1})]
    # The field is named by the option that sets it (docs/cli.md, "Governance").
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: scheduler: 422 invalid request (--preemptible: field required)"
    ]


@pytest.mark.parametrize(
    ("argv", "errors", "said"),
    [
        (
            ["node-inventory", "set", "gpu-07", "--gpus", "-1"],
            [
                {"field": "gpu_flavor", "message": "field required"},
                {"field": "gpu_count", "message": "must be at least 0"},
            ],
            "--flavor (gpu_flavor): field required; --gpus (gpu_count): must be at least 0",
        ),
        (
            ["priority-classes", "set", "x", "--min-runtime", "-5"],
            [
                {"field": "value", "message": "field required"},
                {"field": "min_runtime_seconds", "message": "must be at least 0"},
            ],
            "--value: field required; --min-runtime (min_runtime_seconds): must be at least 0",
        ),
        (
            ["queues", "set", "q", "--team", "nope", "--quota", "h200=-1"],
            [
                {"field": "team", "message": "no team 'nope'"},
                {"field": "quotas.h200.nominal", "message": "must be at least 0"},
            ],
            "--team: no team 'nope'; quotas.h200.nominal: must be at least 0",
        ),
    ],
)
def test_a_refused_set_names_each_field_by_the_option_that_set_it(
    argv: list[str],
    errors: list[dict[str, str]],
    said: str,
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The operator typed --gpus and --min-runtime; the refusal named gpu_count and
    # min_runtime_seconds, fields of a body the operator never saw.
    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            return httpx.Response(404, json={"detail": "not there", "errors": []})
        return httpx.Response(422, json={"detail": "invalid request", "errors": errors})

    api["route"] = route
    assert cli.main([*BASE, "admin", *argv]) == Exit.ERROR
    assert capsys.readouterr().err == (
        f"trainyard: error: scheduler: 422 invalid request ({said})\n"
    )
    api["sent"].clear()
    api["route"] = lambda r: httpx.Response(
        422, json={"detail": "invalid request", "errors": errors}
    )
    assert cli.main([*BASE, "admin", *argv, "--replace"]) == Exit.ERROR  # a PUT alone
    assert capsys.readouterr().err == (
        f"trainyard: error: scheduler: 422 invalid request ({said})\n"
    )


@pytest.mark.parametrize("kind", ["flavors", "cohorts", "queues", "priority-classes"])
def test_show_and_rm_name_one_path_segment(
    kind: str, api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(204)
    assert cli.main([*BASE, "admin", kind, "rm", "a/b"]) == Exit.OK
    assert [(r.method, r.url.raw_path) for r in api["sent"]] == [
        ("DELETE", f"/v1/admin/{kind}/a%2Fb".encode())
    ]
    noun = {"priority-classes": "priority class"}.get(kind, kind[:-1])
    assert capsys.readouterr().out == f"removed {noun} a/b\n"
    assert cli.main([*BASE, "admin", kind, "rm", "x", "--json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == {"removed": "x"}


def test_show_prints_one_row_and_json_the_schedulers_answer(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, json=QUEUE)
    assert cli.main([*BASE, "admin", "queues", "show", "ml-prod"]) == Exit.OK
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["ml-prod", "ml", "research"]
    assert cli.main([*BASE, "admin", "queues", "show", "ml-prod", "--json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == QUEUE


def _refusal(status: int, detail: str, errors: list[dict[str, str]] | None = None) -> Route:
    return lambda r: httpx.Response(status, json={"detail": detail, "errors": errors or []})


@pytest.mark.parametrize(
    ("argv", "route", "code", "line"),
    [
        (
            ["cohorts", "set", "research"],
            _refusal(403, "PUT /v1/admin/cohorts/research needs the operator role; you are admin"),
            Exit.DENIED,
            "scheduler: 403 PUT /v1/admin/cohorts/research needs the operator role; you are admin",
        ),
        (
            ["cohorts", "rm", "research"],
            _refusal(409, "cohort research is in use by queues ml-prod"),
            Exit.ERROR,
            "scheduler: 409 cohort research is in use by queues ml-prod",
        ),
        (
            ["queues", "show", "nope"],
            _refusal(404, "no queue nope"),
            Exit.NOT_FOUND,
            "scheduler: 404 no queue nope",
        ),
        (
            ["queues", "set", "q", "--team", "ml", "--quota", "h200=-1"],
            _refusal(
                422,
                "invalid request",
                [{"field": "quotas.h200.nominal", "message": "must be at least 0"}],
            ),
            Exit.ERROR,
            "scheduler: 422 invalid request (quotas.h200.nominal: must be at least 0)",
        ),
        (
            ["prices", "set", "h200", "--gpu-hour", "2.75", "--from", "2020-01-01T00:00:00Z"],
            _refusal(
                422, "invalid request", [{"field": "effective_from", "message": "in the past"}]
            ),
            Exit.ERROR,
            "billing: 422 invalid request (effective_from: in the past)",
        ),
        (
            ["prices", "ls"],
            _refusal(401, "no valid token"),
            Exit.DENIED,
            # A token any service refused says which token it was, and what to do.
            "billing: 401 no valid token\ntrainyard: error: the token from --token was "
            "refused (expired or revoked?): give a valid one",
        ),
    ],
)
def test_a_refusal_is_one_line_with_its_exit_code(
    argv: list[str],
    route: Route,
    code: Exit,
    line: str,
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    api["route"] = route
    assert cli.main([*BASE, "admin", *argv]) == code
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"trainyard: error: {line}\n")


def test_prices_ls_shows_a_row_per_resource_priced(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, json=[PRICE])
    assert cli.main([*BASE, "admin", "prices", "ls", "--flavor", "h200"]) == Exit.OK
    assert [url for _, url, _ in _sent(api)] == [f"{BILLING}/v1/prices?flavor=h200"]
    assert capsys.readouterr().out.splitlines() == [
        "FLAVOR  FROM                  PER                 PRICE     CURRENCY  IN FORCE  SET BY",
        "h200    2026-12-01 10:00:00Z  GPU-hour            2.750000  EUR       no        ops",
        "h200    2026-12-01 10:00:00Z  GiB-hour of memory  0.010000  EUR       no        ops",
    ]


def test_prices_set_sends_the_prices_as_written(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--from`` the prices start then, first or not: one request, no read of the
    book first (it read the book to learn whether the price was the flavor's first)."""
    api["route"] = lambda r: (
        httpx.Response(200, json=[PRICE]) if r.method == "GET" else httpx.Response(201, json=PRICE)
    )
    argv = ["admin", "prices", "set", "h200", "--gpu-hour", "2.75", "--memory-gib-hour", "0.01"]
    assert cli.main([*BASE, *argv, "--from", T0, "--json"]) == Exit.OK
    put = api["sent"][-1]
    assert "If-None-Match" not in put.headers and "If-Match" not in put.headers
    assert _sent(api) == [
        (
            "PUT",
            f"{BILLING}/v1/prices/h200",
            {
                "price_per_gpu_hour": "2.75",
                "price_per_memory_gib_hour": "0.01",
                "effective_from": T0,
            },
        ),
    ]
    assert json.loads(capsys.readouterr().out) == PRICE


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([], "give at least one price: --gpu-hour, --cpu-hour, --memory-gib-hour"),
        (["--gpu-hour", "abc"], "'abc' is not a decimal number such as 2.75"),
        (["--cpu-hour", "inf"], "'inf' is not a decimal number such as 2.75"),
        (["--gpu-hour", "1", "--from", ""], "--from is empty"),
    ],
)
def test_prices_set_refuses_what_the_cli_can_judge_before_any_request(
    argv: list[str], line: str, api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _usage(["admin", "prices", "set", "h200", *argv]) == Exit.USAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and line in err, err
    assert api["sent"] == []


def test_without_a_billing_url_it_says_how_to_give_one(
    api: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINYARD_BILLING_URL")
    assert cli.main([*BASE, "admin", "prices", "ls"]) == Exit.NOT_CONFIGURED
    assert capsys.readouterr().err == (
        "trainyard: error: no billing URL: set TRAINYARD_BILLING_URL or "
        "trainyard login URL --billing-url BILLING_URL\n"
    )
    assert api["sent"] == []


def test_rm_with_a_body_that_is_no_json_is_one_line(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """DELETE answers 204 and nothing; a proxy's page in its place is a malformed answer."""
    api["route"] = lambda r: httpx.Response(200, text="<html>ok</html>")
    assert cli.main([*BASE, "admin", "queues", "rm", "q"]) == Exit.ERROR
    assert capsys.readouterr().err == (
        "trainyard: error: scheduler: unexpected answer to DELETE /v1/admin/queues/q: "
        "it is not JSON\n"
    )


def test_show_prints_the_etag_and_set_and_rm_send_it_back_with_if_match(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``show`` prints the scheduler's ETag; ``set`` and ``rm`` with ``--if-match`` send it
    as ``If-Match`` (a queue's ``set``: with its patch only), so the change goes ahead only
    while the resource is as shown; on the scheduler's 412 nothing else is sent and one
    plain line says someone changed it and to run ``show`` again (exit 1). (Before, there
    was no tag to show nor option to send it.)"""

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(204)
        if "/cohorts/" in request.url.path:
            cohort = {"name": "research", "description": "", "queues": [], "created_at": T0}
            return httpx.Response(200, json={**cohort, "updated_at": T0})
        return httpx.Response(200, json=QUEUE, headers={"ETag": '"q1"'})

    api["route"] = route
    assert cli.main([*BASE, "admin", "queues", "show", "vision"]) == Exit.OK
    assert capsys.readouterr().out.splitlines()[-1] == 'etag: "q1"'
    tagged = ["--if-match", '"q1"']
    assert cli.main([*BASE, "admin", "queues", "set", "vision", "--weight", "2", *tagged]) == 0
    assert cli.main([*BASE, "admin", "cohorts", "set", "research", *tagged]) == 0
    assert cli.main([*BASE, "admin", "flavors", "rm", "a100", *tagged]) == 0
    assert cli.main([*BASE, "admin", "queues", "rm", "vision"]) == 0
    sent = [(r.method, r.headers.get("If-Match")) for r in api["sent"]]
    assert sent == [
        ("GET", None),
        ("PATCH", '"q1"'),
        ("PUT", '"q1"'),
        ("DELETE", '"q1"'),
        ("DELETE", None),
    ]
    capsys.readouterr()
    api["sent"].clear()
    stale = 'queue vision was changed since it was read (its ETag is now "q2", not "q1")'
    api["route"] = lambda r: httpx.Response(
        412,
        json={
            "detail": f"If-Match: {stale}: nothing changed; read it again",
            "errors": [
                {"field": "If-Match", "message": f"{stale}: nothing changed; read it again"}
            ],
        },
    )
    assert cli.main([*BASE, "admin", "queues", "set", "vision", "--weight", "3", *tagged]) == 1
    assert [r.method for r in api["sent"]] == ["PATCH"]
    assert capsys.readouterr().err == (
        f"trainyard: error: scheduler: nothing was changed: someone else changed it since you "
        f"read it ({stale}). Run `trainyard admin queues show vision` to see it as it is now, "
        "then repeat the command with --if-match set to its new ETag if your change still "
        "applies.\n"
    )


def test_prices_set_of_a_flavors_first_price_says_if_none_match(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A flavor's first price covers all its usage (from the beginning, without ``--from``):
    ``set`` sent it unconditionally, so when another operator set the flavor's first price
    meanwhile, it was made anyway, from now, as a second. It reads the flavor's prices first
    and, when there are none (404), sends ``If-None-Match: *``."""
    answers = {"GET": httpx.Response(404, json={"detail": "flavor h200 has no price"})}
    api["route"] = lambda r: answers.get(r.method) or httpx.Response(201, json=PRICE)
    assert cli.main([*BASE, "admin", "prices", "set", "h200", "--gpu-hour", "2.75"]) == Exit.OK
    get, put = api["sent"]
    assert (get.method, str(get.url)) == ("GET", f"{BILLING}/v1/prices/h200")
    assert (put.method, put.headers["If-None-Match"]) == ("PUT", "*")
    assert "If-Match" not in put.headers


def test_prices_set_of_a_priced_flavor_is_unconditional_as_before(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: (
        httpx.Response(200, json=[PRICE]) if r.method == "GET" else httpx.Response(201, json=PRICE)
    )
    assert cli.main([*BASE, "admin", "prices", "set", "h200", "--gpu-hour", "2.75"]) == Exit.OK
    put = api["sent"][-1]
    assert put.method == "PUT"
    assert "If-None-Match" not in put.headers and "If-Match" not in put.headers


def test_prices_set_refused_because_someone_priced_the_flavor_since_says_so(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Billing's 412 on ``If-None-Match`` is one plain line: nothing changed, someone set
    prices meanwhile, the command that shows them (exit 1)."""
    refused = {
        "detail": "precondition failed",
        "errors": [
            {
                "field": "If-None-Match",
                "message": "the prices of flavor h200 exists already, and If-None-Match: * "
                "asks that it does not: nothing changed (change it with PATCH, or send the "
                "request without the header)",
            }
        ],
    }
    answers = {
        "GET": httpx.Response(404, json={"detail": "flavor h200 has no price"}),
        "PUT": httpx.Response(412, json=refused),
    }
    api["route"] = lambda r: answers[r.method]
    assert cli.main([*BASE, "admin", "prices", "set", "h200", "--gpu-hour", "2.75"]) == Exit.ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "trainyard: error: billing: nothing was changed: someone else made it since you read "
        "it (the prices of flavor h200 exists already). Run `trainyard admin prices show "
        "h200` to see it as it is now, then repeat the command if your change still applies.\n"
    )


DECLARED = {
    "node_id": "gpu-07",
    "gpu_flavor": "h200",
    "gpu_count": 8,
    "topology": None,
    "description": "rack 4",
    "reported": {
        "gpu_flavor": "h200",
        "gpu_count": 16,
        "topology": "rack-4",
        "status": "READY",
        "last_heartbeat": T0,
    },
    "capped": [{"field": "gpu_count", "message": "claims 16 GPUs, declared 8: 8 are placed on"}],
}


def test_node_inventory_set_declares_a_node_and_shows_what_it_claims_and_what_is_capped(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = _absent_then(201, DECLARED)
    argv = ["admin", "node-inventory", "set", "gpu-07", "--flavor", "h200", "--gpus", "8"]
    assert cli.main([*BASE, *argv, "--description", "rack 4"]) == Exit.OK
    path = f"{SCHEDULER}/v1/admin/node-inventory/gpu-07"
    body = {"gpu_flavor": "h200", "gpu_count": 8, "description": "rack 4"}
    assert _sent(api) == [("PATCH", path, body), ("PUT", path, body)]
    assert api["sent"][1].headers["If-None-Match"] == "*"
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "created node declaration gpu-07"
    assert "16 h200 (rack-4), ready" in out
    assert "gpu_count: claims 16 GPUs, declared 8" in out

    # A change names only what its options say; --no-topology takes the claimed one.
    api["route"] = lambda r: httpx.Response(200, json=DECLARED)
    argv = ["admin", "node-inventory", "set", "gpu-07", "--gpus", "4", "--no-topology"]
    assert cli.main([*BASE, *argv]) == Exit.OK
    assert _sent(api)[-1] == ("PATCH", path, {"gpu_count": 4, "topology": None})
