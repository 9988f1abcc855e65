"""``trainyard whoami | token | user | audit``: the right request for each, and the output."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

ME = {
    "user": "ada",
    "team": "ml",
    "role": "member",
    "token_id": 7,
    "token_name": "laptop",
    "expires_at": "2027-03-01T00:00:00Z",
}
MADE = {
    "id": 8,
    "name": "laptop",
    "user": "ada",
    "team": "ml",
    "created_at": "2026-12-03T00:00:00Z",
    "expires_at": None,
    "token": "ty_new",
}


@pytest.fixture(autouse=True)
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    requests: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        path, method = request.url.path, request.method
        if path == "/v1/me":
            return httpx.Response(200, json=ME)
        if path in ("/v1/tokens", "/v1/tokens/rotate") and method == "POST":
            return httpx.Response(201, json=MADE)
        if path.startswith("/v1/tokens/") and method == "DELETE":
            return httpx.Response(204)
        if path == "/v1/admin/users" and method == "POST":
            return httpx.Response(
                201, json={"user": "bo", "team": "ml", "role": "viewer", "token": "ty_bo"}
            )
        if path.startswith("/v1/admin/users/") and method == "PATCH":
            role = json.loads(request.content)["role"]
            return httpx.Response(200, json={"name": "bo", "team": "ml", "role": role})
        if path == "/v1/audit":
            return httpx.Response(
                403,
                json={
                    "detail": "GET /v1/audit needs the operator role; you are member",
                    "errors": [],
                },
            )
        return httpx.Response(404, json={"detail": "nope", "errors": []})

    def make(base_url: str, token: str, timeout: float = 10, **_: Any) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_old")
    return requests


def test_whoami_names_user_team_role_and_expiry(
    seen: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["whoami"]) == 0
    out = capsys.readouterr().out
    assert "ada of team ml (member)" in out and "2027-03-01" in out
    assert seen[0].headers["authorization"] == "Bearer ty_old"


def test_rotate_prints_only_the_new_token_and_sends_the_lifetime(
    seen: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["token", "rotate", "--days", "30"]) == 0
    assert capsys.readouterr().out == "ty_new\n"
    assert seen[0].url.path == "/v1/tokens/rotate"
    assert json.loads(seen[0].content) == {"expires_in_days": 30}


def test_revoke_and_user_add(seen: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "revoke", "12"]) == 0
    assert seen[-1].method == "DELETE" and seen[-1].url.path == "/v1/tokens/12"
    assert cli.main(["user", "add", "bo", "--role", "viewer"]) == 0
    assert json.loads(seen[-1].content) == {"name": "bo", "role": "viewer"}
    assert capsys.readouterr().out.splitlines() == ["token 12 revoked", "ty_bo"]


def test_user_role_sends_the_new_role_to_the_users_path(
    seen: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["user", "role", "bo", "admin", "--team", "ml"]) == 0
    assert (seen[-1].method, seen[-1].url.path) == ("PATCH", "/v1/admin/users/bo")
    assert seen[-1].url.params["team"] == "ml"
    assert json.loads(seen[-1].content) == {"role": "admin"}
    assert capsys.readouterr().out == "user bo is admin now\n"
    with pytest.raises(SystemExit) as refused:
        cli.main(["user", "role", "bo", "root"])
    assert refused.value.code == 2  # usage: not a role


def test_a_refusal_is_one_line_naming_the_role(
    seen: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["audit"]) == 4  # not allowed
    err = capsys.readouterr().err.strip()
    assert "403" in err and "operator role" in err and "\n" not in err


def test_status_filter_takes_any_case_and_names_the_valid_ones(
    seen: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    cli.main(["list", "--status", "running"])
    assert seen[-1].url.params["status"] == "RUNNING"
    with pytest.raises(SystemExit) as refused:
        cli.main(["list", "--status", "runing"])
    assert refused.value.code == 2  # usage
    err = capsys.readouterr().err
    assert "'runing' is not a status" in err and "running, succeeded" in err


def test_the_example_named_in_help_exists(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    with pytest.raises(SystemExit):
        cli.main(["submit", "--help"])
    named = re.search(r"(examples/\S+\.(?:json|yaml))", capsys.readouterr().out)
    assert named is not None
    assert (Path(__file__).parents[3] / named.group(1)).is_file()


def test_a_reader_that_goes_away_is_not_an_error() -> None:
    """``trainyard whoami | head -0``: the pipe closes before the CLI writes."""
    import subprocess
    import sys

    script = (
        "import sys, trainyard.cli as c\n"
        "class Gone:\n"
        "    def write(self, *_): raise BrokenPipeError\n"
        "    def flush(self): pass\n"
        "    def fileno(self): return sys.__stdout__.fileno()\n"
        "c.TrainyardClient.list_page = lambda self, **_: ([], None)\n"
        "sys.stdout = Gone()\n"
        "sys.exit(c.main(['list', '--token', 't']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr


def test_a_token_past_the_live_limit_is_one_line_with_the_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    full = "user ml/ada has 100 live tokens, the most a user may have is 100"
    refusal = {
        "detail": f"Authorization: {full}; revoke one first (DELETE /v1/tokens/{{id}}), or "
        "rotate one "
        "(POST /v1/tokens/rotate)",
        "errors": [{"field": "Authorization", "message": full}],
    }

    def make(base_url: str, token: str, timeout: float = 10, **_: Any) -> TrainyardClient:
        answer = httpx.MockTransport(lambda _: httpx.Response(409, json=refusal))
        return TrainyardClient(base_url, token, timeout, transport=answer)

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_old")
    assert cli.main(["token", "create"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"trainyard: error: 409 {refusal['detail']}\n"  # the field once
