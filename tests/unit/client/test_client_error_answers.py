"""Error answers of any shape: a clear line, the right exit code, never an unexpected error.

Every Trainyard API answers an error as ``{"detail": "...", "errors": [{"field",
"message"}]}``. Anything else came from another server or a proxy in front, and the CLI
showed it badly: an HTML 404 of a wrong URL was ``404 Not Found`` (exit 3, as if a job were
missing, the URL nowhere), ``errors`` items that were no objects failed the command with
``unexpected AttributeError``, a ``detail`` object was printed as a Python dict, and a
detail's escape sequences reached the terminal as they came."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import ERROR_TEXT_MAX, TrainyardClient, TrainyardError, client_version

from .conftest import routed_api


def _refused(status: int, content: bytes, headers: dict[str, str] | None = None) -> TrainyardError:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content, headers=headers or {})

    client = TrainyardClient("http://api.test", "ty_a", transport=httpx.MockTransport(answer))
    with pytest.raises(TrainyardError) as caught:
        client.get_job("abc")
    return caught.value


@pytest.mark.parametrize(
    ("status", "content", "headers", "what"),
    [
        (404, b"<html>nope</html>", {"content-type": "text/html"}, "an HTML page"),
        (502, b"", {}, "an empty answer"),
        (500, b'{"detail": {"a": 1}}', {"content-type": "application/json"}, "JSON without"),
        (400, b"[1]", {"content-type": "application/json"}, "a JSON list"),
        (400, b"bad gateway", {}, "not JSON"),
    ],
)
def test_an_error_no_trainyard_api_answers_names_the_request(
    status: int, content: bytes, headers: dict[str, str], what: str
) -> None:
    error = _refused(status, content, headers)
    assert error.status == status  # the exit code and the retries still go by it
    assert f"from GET http://api.test/v1/jobs/abc ({what}" in str(error)
    assert "is the URL right?" in str(error) and "{'a'" not in str(error)


@pytest.mark.parametrize(
    ("errors", "shown"),
    [
        (["a", 5], [("?", "a"), ("?", "5")]),
        ([{"field": 5, "message": None}], [("?", "null")]),
        ([{"field": "gpus", "message": ["too", "many"]}], [("gpus", '["too", "many"]')]),
        ({"field": "x"}, []),
    ],
)
def test_field_errors_of_another_shape_are_strings(errors: Any, shown: list[Any]) -> None:
    content = json.dumps({"detail": "invalid request", "errors": errors}).encode()
    error = _refused(422, content)
    assert [(e["field"], e["message"]) for e in error.errors] == shown
    assert str(error).startswith("422 invalid request")


def test_a_detail_cannot_drive_the_terminal_or_flood_it() -> None:
    error = _refused(400, json.dumps({"detail": "a\x1b[2J\rb\u202ec\nd"}).encode())
    assert error.message == "a\\x1b[2J\\rb\\u202ec\nd"
    long = _refused(400, json.dumps({"detail": "x" * 50_000}).encode())
    assert len(long.message) < ERROR_TEXT_MAX + 50
    assert long.message.endswith(f"... ({50_000 - ERROR_TEXT_MAX} more characters)")


def test_a_head_answer_has_no_body_to_judge() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401)

    client = TrainyardClient("http://api.test", "ty_a", transport=httpx.MockTransport(answer))
    with pytest.raises(TrainyardError) as caught:
        client.bundle_stored("a" * 64)
    assert str(caught.value) == "401 Unauthorized"


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["ls"], 3), (["describe", "abc"], 3), (["submit", "job.yaml", "--no-code"], 1)],
)
def test_the_cli_says_it_in_one_line(
    argv: list[str],
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: a\ngpus: 1\ngpu_flavor: cpu\nentrypoint: m\n")
    if argv[0] == "submit":
        state["route"] = lambda r: httpx.Response(422, json={"detail": "no", "errors": ["x"]})
    else:
        state["route"] = lambda r: httpx.Response(
            404, text="<h1>404</h1>", headers={"content-type": "text/html"}
        )
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert "unexpected" not in err and "Traceback" not in err
    if argv[0] == "submit":
        assert err.endswith("\ntrainyard: error: job.yaml:1:1: ?: x\n")
    else:
        assert err.startswith("trainyard: error: 404 Not Found from GET http://api.test/v1/jobs")
        assert len(err.splitlines()) == 1


def test_an_error_the_detail_already_says_is_not_said_twice() -> None:
    # A name taken but for its case answers 409 with the field's error as the detail too
    # (shared.http_errors.NameTaken); the line said it twice, once in parentheses.
    said = "a model named 'resnet' exists in team vision; names differ from it only by case"
    body = {"detail": f"name: {said}", "errors": [{"field": "name", "message": said}]}
    error = _refused(409, json.dumps(body).encode())
    assert str(error) == f"409 name: {said}"
    assert error.errors == [{"field": "name", "message": said}]  # still there for callers
    # What the detail does not say is still shown, the rest once.
    body["errors"].append({"field": "team", "message": "too long"})
    assert str(_refused(409, json.dumps(body).encode())) == f"409 name: {said} (team: too long)"


def test_a_route_the_server_does_not_have_names_the_request_and_the_url() -> None:
    # A registry URL that is the submission's (or billing's) answered every model command
    # "404 Not Found", as if the model did not exist: the platform's services answer a
    # path none of their routes has with that bare detail (the dashboard reads it so too).
    body = json.dumps({"detail": "Not Found", "errors": []}).encode()
    error = _refused(404, body, {"content-type": "application/json"})
    assert error.status == 404
    assert str(error).startswith("404 Not Found from GET http://api.test/v1/jobs/abc: ")
    assert "no such route" in str(error) and "is the URL right" in str(error)
    # A thing that does not exist is still said as the service says it.
    missing = json.dumps({"detail": "job abc not found", "errors": []}).encode()
    assert str(_refused(404, missing)) == "404 job abc not found"


def test_a_route_the_server_lacks_may_be_of_a_service_older_than_the_cli() -> None:
    """A new CLI asking an older service for a route it lacks read only ``404 Not Found``
    (the path is new) or ``405 Method Not Allowed`` (a new method of an old path, as
    ``PATCH`` of a budget): now the line says the service may be older than this CLI,
    naming the CLI's version, and what the path allows."""
    version = client_version()
    assert version  # the installed distribution's
    route = json.dumps({"detail": "Not Found", "errors": []}).encode()
    error = _refused(404, route, {"content-type": "application/json"})
    assert f"older than this CLI (trainyard {version})" in str(error)
    method = json.dumps({"detail": "Method Not Allowed", "errors": []}).encode()
    error = _refused(405, method, {"content-type": "application/json", "allow": "PUT, OPTIONS"})
    assert error.status == 405
    assert str(error) == (
        "405 Method Not Allowed from GET http://api.test/v1/jobs/abc: the service at "
        "http://api.test has no GET of this path (it allows PUT): it may be older than this "
        f"CLI (trainyard {version}); upgrade it, or use a CLI of its version"
    )


def test_the_cli_says_an_older_service_lacks_the_route_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = routed_api(
        tmp_path,
        monkeypatch,
        {"TRAINYARD_URL": "http://api.test", "TRAINYARD_BILLING_URL": "http://billing.test"},
    )
    method = {"detail": "Method Not Allowed", "errors": []}
    state["route"] = lambda r: httpx.Response(405, json=method, headers={"allow": "GET, PUT"})
    argv = ["--token", "ty_a", "budget", "set", "ml", "--amount", "10"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: billing: 405 Method Not Allowed from PATCH ")
    assert "may be older than this CLI (trainyard " in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
