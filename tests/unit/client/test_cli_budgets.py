"""``trainyard budget ls|show|set|rm``: the requests they send billing (bodies as its budget
routes take them: ``set`` a merge patch of only what its options name), what they print, and how a refusal reads (one line naming the field, the
CLI's exit codes). Team admins wrote these JSON bodies by hand before: the CLI had no budget
command."""

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

BILLING = "http://billing.test"
BASE = ["--url", "http://submission.test", "--token", "ty_admin"]
BUDGET = {
    "team": "ml",
    "project": None,
    "amount": "1000.000000",
    "currency": "EUR",
    "thresholds": [50, 80, 100],
    "policy": "refuse",
    "on_exhausted": "stop",
    "month": "2026-12",
    "spent": "812.504000",
    "remaining": "187.496000",
    "percent_spent": "81.25",
    "exhausted": False,
    "runs_out_at": "2026-12-19T06:00:00Z",
    "forecast": "at this rate the budget runs out on 2026-12-19",
    "updated_by": "ann",
    "updated_at": "2026-12-01T10:00:00Z",
}
PROJECT = {
    **BUDGET,
    "project": "vision",
    "amount": "200.000000",
    "spent": "0",
    "remaining": "200.000000",
    "percent_spent": "0.00",
    "policy": "warn",
    "on_exhausted": "finish",
    "runs_out_at": None,
    "forecast": "nothing spent this month",
}

Route = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Billing's API, answering what ``state["route"]`` says; ``state["sent"]``: every
    request the CLI made."""
    return routed_api(tmp_path, monkeypatch, {"TRAINYARD_BILLING_URL": BILLING})


def _sent(state: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [
        (r.method, str(r.url), json.loads(r.content) if r.content else None) for r in state["sent"]
    ]


def test_ls_follows_every_page_and_shows_spent_and_state(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    spent = {**PROJECT, "spent": "200.000000", "percent_spent": "100.00", "exhausted": True}

    def route(request: httpx.Request) -> httpx.Response:
        if "after" in request.url.params:
            return httpx.Response(200, json=[spent])
        link = f'<{BILLING}/v1/budgets?team=ml&limit=100&after=c1>; rel="next"'
        return httpx.Response(200, json=[BUDGET], headers={"Link": link})

    api["route"] = route
    assert cli.main([*BASE, "budget", "ls", "--team", "ml"]) == Exit.OK
    assert [url for _, url, _ in _sent(api)] == [
        f"{BILLING}/v1/budgets?team=ml",
        f"{BILLING}/v1/budgets?team=ml&limit=100&after=c1",
    ]
    assert capsys.readouterr().out.splitlines() == [
        "TEAM  PROJECT  MONTH    AMOUNT           SPENT       SPENT %  STATE                "
        "POLICY  ON EXHAUSTED",
        "ml    -        2026-12  1000.000000 EUR  812.504000  81.25%   runs out 2026-12-19  "
        "refuse  stop",
        "ml    vision   2026-12  200.000000 EUR   200.000000  100.00%  exhausted            "
        "warn    finish",
    ]


def test_ls_json_is_billings_answer_and_none_is_said(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, json=[BUDGET, PROJECT])
    assert cli.main([*BASE, "budget", "ls", "--json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == [BUDGET, PROJECT]
    api["route"] = lambda r: httpx.Response(200, json=[])
    assert cli.main([*BASE, "budget", "ls"]) == Exit.OK
    assert (
        capsys.readouterr().out == "no budgets (trainyard budget set TEAM --amount A creates one)\n"
    )


def test_show_names_the_team_or_the_project_as_one_path_segment_each(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, json=PROJECT)
    assert cli.main([*BASE, "budget", "show", "ml", "--project", "a/b"]) == Exit.OK
    assert cli.main([*BASE, "budget", "show", "ml"]) == Exit.OK
    assert [url for _, url, _ in _sent(api)] == [
        f"{BILLING}/v1/budgets/ml/a%2Fb",
        f"{BILLING}/v1/budgets/ml",
    ]
    shown = capsys.readouterr().out.splitlines()[:6]  # the first of the two
    assert shown[1].split()[:2] == ["ml", "vision"]
    assert shown[2:] == [
        "remaining: 200.000000 EUR",
        "thresholds: 50%, 80%, 100%",
        "forecast: nothing spent this month",
        "updated by ann at 2026-12-01 10:00:00Z",
    ]


def test_set_of_a_new_budget_sends_only_its_options(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """No budget yet (the patch's 404): the options alone with ``PUT``, billing defaulting
    the rest."""

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            return httpx.Response(404, json={"detail": "no budget of team ml", "errors": []})
        return httpx.Response(201, json=BUDGET)

    api["route"] = route
    argv = ["budget", "set", "ml", "--amount", "1e3", "--policy", "refuse"]
    assert cli.main([*BASE, *argv, "--on-exhausted", "stop", "--thresholds", "80,50"]) == Exit.OK
    options = {"amount": "1e3", "policy": "refuse", "on_exhausted": "stop", "thresholds": [80, 50]}
    assert _sent(api) == [
        ("PATCH", f"{BILLING}/v1/budgets/ml", options),
        ("PUT", f"{BILLING}/v1/budgets/ml", options),
    ]
    assert api["sent"][1].headers["If-None-Match"] == "*"  # creates, replaces nothing
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "created budget of team ml"
    assert out[2].split()[:4] == ["ml", "-", "2026-12", "1000.000000"]


def test_set_does_not_replace_a_budget_another_admin_created_since_its_patch(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The patch finds no budget (404), then another admin creates one with a ``refuse``
    policy. Before, ``set`` then put its options alone and the other admin's budget was
    replaced (its policy back to ``warn``). Now its ``PUT`` says ``If-None-Match: *``:
    billing answers 412 and ``set`` patches the budget that is there."""
    kept: dict[str, Any] = {}

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH" and not kept:
            kept.update({**BUDGET, "amount": "5.000000"})  # the other admin's, just after
            return httpx.Response(404, json={"detail": "no budget of team ml", "errors": []})
        if request.method == "PUT" and request.headers.get("If-None-Match") == "*":
            return httpx.Response(412, json={"detail": "the budget exists already", "errors": []})
        kept.update(json.loads(request.content))
        return httpx.Response(200, json=kept)

    api["route"] = route
    assert cli.main([*BASE, "budget", "set", "ml", "--amount", "2000"]) == Exit.OK
    assert [r.method for r in api["sent"]] == ["PATCH", "PUT", "PATCH"]
    assert api["sent"][1].headers["If-None-Match"] == "*"
    assert (kept["amount"], kept["policy"], kept["on_exhausted"]) == ("2000", "refuse", "stop")
    assert capsys.readouterr().out.startswith("set budget of team ml\n")


def test_set_of_a_budget_that_exists_patches_only_what_its_options_name(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Raising the amount must not turn a ``refuse`` policy into the ``PUT``'s default
    ``warn`` (nor ``stop`` into ``finish``): the options alone, as a merge patch."""
    api["route"] = lambda r: httpx.Response(200, json={**BUDGET, "amount": "2000.000000"})
    assert cli.main([*BASE, "budget", "set", "ml", "--amount", "2000", "--json"]) == Exit.OK
    assert _sent(api) == [("PATCH", f"{BILLING}/v1/budgets/ml", {"amount": "2000"})]
    assert json.loads(capsys.readouterr().out)["amount"] == "2000.000000"


def test_two_admins_setting_different_fields_at_once_both_keep_their_change(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Another admin sets the policy to ``refuse`` while ``set --amount 2000`` is under
    way: right after billing first hears from this ``set``. Before, ``set`` read the budget
    and ``PUT`` it back whole with its old ``warn`` policy, undoing the other change; now it
    sends only the amount, and billing keeps both."""
    kept = {**PROJECT}
    others_done = False

    def route(request: httpx.Request) -> httpx.Response:
        nonlocal others_done
        answer = httpx.Response(200, json=kept)
        if request.method == "PUT":
            kept.clear()
            kept.update({**PROJECT, "policy": "warn", "on_exhausted": "finish"})
            kept.update(json.loads(request.content))
            answer = httpx.Response(200, json=kept)
        elif request.method == "PATCH":
            kept.update(json.loads(request.content))
            answer = httpx.Response(200, json=kept)
        if not others_done:  # the other admin's change lands just after this request
            others_done = True
            kept["policy"] = "refuse"
        return answer

    api["route"] = route
    argv = ["budget", "set", "ml", "--project", "vision", "--amount", "2000"]
    assert cli.main([*BASE, *argv]) == Exit.OK
    assert (kept["amount"], kept["policy"]) == ("2000", "refuse")
    assert capsys.readouterr().out.startswith("set budget of project ml/vision\n")


def test_set_replace_sends_only_its_options_without_reading(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, json=PROJECT)
    argv = ["budget", "set", "ml", "--project", "vision", "--amount", "200", "--replace"]
    assert cli.main([*BASE, *argv]) == Exit.OK
    assert _sent(api) == [("PUT", f"{BILLING}/v1/budgets/ml/vision", {"amount": "200"})]
    assert capsys.readouterr().out.startswith("set budget of project ml/vision\n")


def test_rm_deletes_and_says_which(api: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    api["route"] = lambda r: httpx.Response(204)
    assert cli.main([*BASE, "budget", "rm", "ml", "--project", "vision"]) == Exit.OK
    assert cli.main([*BASE, "budget", "rm", "ml", "--json"]) == Exit.OK
    assert _sent(api) == [
        ("DELETE", f"{BILLING}/v1/budgets/ml/vision", None),
        ("DELETE", f"{BILLING}/v1/budgets/ml", None),
    ]
    out = capsys.readouterr().out
    assert out.startswith("removed budget of project ml/vision\n")
    assert json.loads(out.split("\n", 1)[1]) == {"removed": {"team": "ml", "project": None}}


def _refusal(status: int, detail: str, errors: list[dict[str, str]] | None = None) -> Route:
    return lambda r: httpx.Response(status, json={"detail": detail, "errors": errors or []})


@pytest.mark.parametrize(
    ("argv", "route", "code", "line"),
    [
        (
            ["set", "ml", "--amount", "0", "--replace"],
            _refusal(
                422,
                "invalid request",
                [{"field": "amount", "message": "must be greater than 0"}],
            ),
            Exit.ERROR,
            "billing: 422 invalid request (amount: must be greater than 0)",
        ),
        (
            ["set", "ml", "--thresholds", "50,50", "--replace"],
            _refusal(
                422,
                "invalid request",
                [
                    {"field": "amount", "message": "field required"},
                    {"field": "thresholds", "message": "each threshold at most once"},
                ],
            ),
            Exit.ERROR,
            "billing: 422 invalid request (amount: field required; "
            "thresholds: each threshold at most once)",
        ),
        (
            ["set", "ml", "--amount", "5"],
            _refusal(403, "PATCH /v1/budgets/ml needs the admin role; you are member"),
            Exit.DENIED,
            "billing: 403 PATCH /v1/budgets/ml needs the admin role; you are member",
        ),
        (["show", "nlp"], _refusal(404, "no budget of team nlp"), Exit.NOT_FOUND, None),
        (["rm", "nlp"], _refusal(404, "no budget of team nlp"), Exit.NOT_FOUND, None),
        (
            ["ls"],
            _refusal(401, "no valid token"),
            Exit.DENIED,
            # A token any service refused says which token it was, and what to do.
            "billing: 401 no valid token\ntrainyard: error: the token from --token was "
            "refused (expired or revoked?): give a valid one",
        ),
    ],
)
def test_a_refusal_is_one_line_naming_the_field_with_its_exit_code(
    argv: list[str],
    route: Route,
    code: Exit,
    line: str | None,
    api: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    api["route"] = route
    assert cli.main([*BASE, "budget", *argv]) == code
    captured = capsys.readouterr()
    said = line or "billing: 404 no budget of team nlp"
    assert (captured.out, captured.err) == ("", f"trainyard: error: {said}\n")


def test_a_refused_patch_is_the_set_s_refusal_and_nothing_else_is_sent(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a 404 (no budget yet) leads on to the ``PUT`` that creates one."""
    api["route"] = _refusal(401, "no valid token")
    assert cli.main([*BASE, "budget", "set", "ml", "--amount", "5"]) == Exit.DENIED
    assert capsys.readouterr().err == (
        "trainyard: error: billing: 401 no valid token\n"
        "trainyard: error: the token from --token was refused (expired or revoked?): "
        "give a valid one\n"
    )
    assert [method for method, _, _ in _sent(api)] == ["PATCH"]
    api["sent"].clear()
    api["route"] = _refusal(
        422, "invalid request", [{"field": "thresholds", "message": "each threshold at most once"}]
    )
    assert cli.main([*BASE, "budget", "set", "ml", "--thresholds", "5,5"]) == Exit.ERROR
    assert capsys.readouterr().err == (
        "trainyard: error: billing: 422 invalid request (thresholds: each threshold at most once)\n"
    )
    assert [method for method, _, _ in _sent(api)] == ["PATCH"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([], "give at least one of --amount, --policy, --on-exhausted, --thresholds"),
        (["--replace"], "give at least one of --amount"),
        (["--amount", "abc"], "'abc' is not a decimal number such as 1000"),
        (["--amount", "nan"], "'nan' is not a decimal number such as 1000"),
        (["--amount", ""], "'' is not a decimal number such as 1000"),
        (["--thresholds", "50,x"], "'50,x' is not whole percents separated by commas"),
        (["--thresholds", "50,,80"], "'50,,80' is not whole percents"),
        (["--policy", "block"], "argument --policy: invalid choice: 'block'"),
        (["--on-exhausted", "kill"], "argument --on-exhausted: invalid choice: 'kill'"),
        (["--amount", "5", "--project", ""], "--project is empty"),
    ],
)
def test_set_refuses_what_the_cli_can_judge_before_any_request(
    argv: list[str], line: str, api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main([*BASE, "budget", "set", "ml", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    assert code == Exit.USAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and line in err, err
    assert api["sent"] == []


def test_without_a_billing_url_it_says_how_to_give_one(
    api: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINYARD_BILLING_URL")
    assert cli.main([*BASE, "budget", "ls"]) == Exit.NOT_CONFIGURED
    assert capsys.readouterr().err == (
        "trainyard: error: no billing URL: set TRAINYARD_BILLING_URL or "
        "trainyard login URL --billing-url BILLING_URL\n"
    )
    assert api["sent"] == []


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        ({"exhausted": True, "runs_out_at": None}, "exhausted"),
        ({"exhausted": False, "runs_out_at": "2026-12-19T06:00:00+00:00"}, "runs out 2026-12-19"),
        ({"exhausted": False, "runs_out_at": None}, "ok"),
    ],
)
def test_the_state_says_spent_or_when_it_runs_out(answer: dict[str, Any], state: str) -> None:
    from trainyard.cli_budgets import state_text

    assert state_text(answer) == state


STALE = {
    "detail": 'If-Match: the budget of team ml was changed since it was read (its ETag is now "b", '
    'not "a"): nothing changed; read it again and make the change to what it is now',
    "errors": [
        {
            "field": "If-Match",
            "message": 'the budget of team ml was changed since it was read (its ETag is now "b", '
            'not "a"): nothing changed; read it again and make the change to what it is now',
        }
    ],
}
"""Billing's 412 when the budget changed since its ETag ``"a"`` was read."""


def test_show_prints_the_etag_set_and_rm_send_it_back_with_if_match(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``show`` prints the budget's ETag; ``set`` and ``rm`` with ``--if-match`` send it as
    ``If-Match`` (``set``: with its patch only), so the change goes ahead only while the
    budget is as shown. Without the option, no condition, as before. (Before, ``show``
    printed no tag and no command could send one: a change made between a ``show`` and a
    ``set`` was overwritten silently.)"""

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, json=BUDGET, headers={"ETag": '"a"'})

    api["route"] = route
    assert cli.main([*BASE, "budget", "show", "ml"]) == Exit.OK
    assert capsys.readouterr().out.splitlines()[-1] == 'etag: "a"'
    assert cli.main([*BASE, "budget", "set", "ml", "--amount", "9", "--if-match", '"a"']) == Exit.OK
    assert (
        cli.main([*BASE, "budget", "set", "ml", "--amount", "9", "--replace", "--if-match", '"a"'])
        == Exit.OK
    )
    assert cli.main([*BASE, "budget", "rm", "ml", "--project", "v", "--if-match", '"a"']) == Exit.OK
    assert cli.main([*BASE, "budget", "set", "ml", "--amount", "9"]) == Exit.OK
    assert cli.main([*BASE, "budget", "rm", "ml"]) == Exit.OK
    sent = [(r.method, r.headers.get("If-Match")) for r in api["sent"]]
    assert sent == [
        ("GET", None),
        ("PATCH", '"a"'),
        ("PUT", '"a"'),
        ("DELETE", '"a"'),
        ("PATCH", None),
        ("DELETE", None),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["set", "ml", "--amount", "9", "--if-match", '"a"'],
        ["set", "ml", "--amount", "9", "--replace", "--if-match", '"a"'],
        ["rm", "ml", "--if-match", '"a"'],
    ],
)
def test_a_change_refused_as_stale_says_plainly_what_happened_and_what_to_do(
    argv: list[str], api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Another admin changed the budget since its ETag was read: billing's 412 is one
    plain line (someone changed it, nothing was changed, run ``show`` and repeat with the
    new ETag), exit 1, no traceback, and nothing else is sent (no ``PUT`` after the
    patch)."""
    api["route"] = lambda r: httpx.Response(412, json=STALE)
    assert cli.main([*BASE, "budget", *argv]) == Exit.ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "trainyard: error: billing: nothing was changed: someone else changed it since you "
        'read it (the budget of team ml was changed since it was read (its ETag is now "b", '
        'not "a")). Run `trainyard budget show ml` to see it as it is now, then repeat the '
        "command with --if-match set to its new ETag if your change still applies.\n"
    )
    assert len(api["sent"]) == 1


def test_set_with_if_match_of_a_budget_deleted_since_does_not_create_it(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The budget read was deleted since: the patch's 404 is the answer, never a ``PUT``
    that would make a new one from the options alone."""
    api["route"] = _refusal(404, "no budget of team ml")
    argv = ["budget", "set", "ml", "--amount", "9", "--if-match", '"a"']
    assert cli.main([*BASE, *argv]) == Exit.NOT_FOUND
    assert [r.method for r in api["sent"]] == ["PATCH"]
    assert capsys.readouterr().err == "trainyard: error: billing: 404 no budget of team ml\n"
