"""A successful answer that is not what its route answers — a list key missing, an object
missing, a list or a string where an object belongs, a page whose rows are no list or whose
``next`` is no cursor — ends every command with one line naming the request and what was
wrong, exit 1 (the API answered: not exit 5), never a ``KeyError`` or ``TypeError`` or a
traceback (docs/cli.md, "Exit codes")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

COMMANDS = [
    ["ls"],
    ["get", "j-1"],
    ["describe", "j-1"],
    ["queue"],
    ["metrics", "j-1"],
    ["experiments"],
    ["experiments", "e"],
    ["compare", "e"],
    ["reproduction", "j-1"],
    ["models", "m"],
    ["model", "ls"],
    ["model", "show", "ml/m"],
    ["model", "show", "ml/m:1"],
    ["model", "show", "ml/m@prod"],
    ["model", "alias", "history", "ml/m", "prod"],
    ["model", "download", "ml/m", "-o", "{tmp}/m.pt"],
    ["dataset", "ls"],
    ["dataset", "show", "ml/d"],
    ["dataset", "show", "ml/d:1"],
    ["lineage", "up", "ml/m:1"],
    ["cost"],
    ["cost", "j-1"],
    ["waste"],
    ["whoami"],
    ["tokens"],
    ["user", "list"],
    ["audit"],
    ["deadletters", "list"],
]
PAGED = ("models", "versions", "datasets", "moves", "experiments", "runs", "jobs", "rows")
BODIES: dict[str, Any] = {
    "an empty object": {},
    "a list": [],
    "a string": "ok",
    "rows that are no list": {**{f: "x" for f in PAGED}, "next": None},
    "a next that is no cursor": {**{f: [] for f in PAGED}, "next": 5},
}


@pytest.fixture
def answering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every service answers 200 with ``answering["body"]``."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://billing.test")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    answer: dict[str, Any] = {}

    def route(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer["body"])

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    return answer


UNPAGED = ("cost", "waste")
"""Reports read by rendering, not paged: the client does not know the type of their rows
(a string where a list belongs is not checked there)."""
CASES = [
    pytest.param(argv, body, id=f"{' '.join(argv)}: {body}")
    for argv in COMMANDS
    for body in BODIES
    if not (body == "rows that are no list" and argv[0] in UNPAGED)
]


@pytest.mark.parametrize(("argv", "body"), CASES)
def test_a_malformed_answer_is_one_line_naming_the_request_and_exit_1(
    argv: list[str],
    body: str,
    answering: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    answering["body"] = BODIES[body]
    code = cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    captured = capsys.readouterr()
    if code == 0:  # a command that read nothing the answer lacks
        assert captured.err == ""
        return
    lines = captured.err.splitlines()
    assert code == 1 and len(lines) == 1, captured.err
    assert re.match(r"trainyard: error: (\w+: )?unexpected answer to GET /v1/", lines[0]), lines

    assert "Error" not in captured.err and "Traceback" not in captured.out + captured.err


STUCK = [
    (["ls", "--all"], "/v1/jobs"),
    (["logs", "j-1"], "/v1/jobs/j-1/logs"),
    (["tokens"], "/v1/tokens"),
    (["audit"], "/v1/audit"),
    (["deadletters", "discard", "--all"], "/v1/deadletters"),
]


@pytest.mark.parametrize(("argv", "path"), STUCK, ids=[" ".join(a) for a, _ in STUCK])
def test_a_page_that_names_itself_as_the_next_ends_the_command(
    argv: list[str],
    path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server whose every page names the page just read as the next (the same cursor, the
    same ``Link``, a ``next_after`` that does not advance, log chunks with the cursor
    unchanged) kept these commands asking, and printing, forever. Now that page is a
    malformed answer: one line, exit 1, after a few requests."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    asked: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if len(asked) > 20:  # the old loop: refuse to go on, so the test ends either way
            return httpx.Response(500, json={"detail": "asked again and again"})
        if request.url.path == "/v1/jobs/j-1":
            return httpx.Response(200, json={"id": "j-1", "status": "RUNNING"})
        if request.url.path.endswith("/logs"):
            chunk = {"stream": "stdout", "seq": 1, "text": "again\n"}
            body = {"chunks": [chunk], "cursor": "c1", "streams_complete": False}
            return httpx.Response(200, json={**body, "job_terminal": False})
        if request.url.path == "/v1/deadletters":
            return httpx.Response(200, json={"dead_letters": [{"sequence": 1}], "next_after": 0})
        link = f'<{request.url.copy_set_param("after", "c1")}>; rel="next"'
        return httpx.Response(200, json=[{"id": "x"}], headers={"Link": link})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 1 and len(asked) <= 3, (code, len(asked), err)
    said = [line for line in err.splitlines() if line.startswith("trainyard: error:")]
    assert len(said) == 1, err  # (``logs`` names the stream it printed from, on stderr)
    assert re.match(rf"trainyard: error: unexpected answer to GET {path}: ", said[0]), err
    assert "Traceback" not in err
