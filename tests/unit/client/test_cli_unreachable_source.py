"""An API that does not answer was said as ``cannot reach http://127.0.0.1:57301: [Errno
111] Connection refused``, exit 5, with no word of where that URL came from. A new user
meets it in two ways: never logged in (the default URL), or after restarting ``dev.py up``,
which takes new ports at each start (the context names the old ones). The second line now
says where the URL came from and what to do."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    for name in ("URL", "TOKEN", "CONTEXT"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)
    state = routed_api(tmp_path, monkeypatch, {})
    state["route"] = _refused
    state["config"] = tmp_path / "config.json"
    return state


def test_a_context_s_url_that_does_not_answer_says_how_to_log_in_again(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    config = state["config"]
    assert isinstance(config, Path)
    config.write_text(
        '{"current": "local", "contexts": {"local": {"url": "http://127.0.0.1:1", '
        '"token": "ty_a"}}}\n'
    )
    config.chmod(0o600)
    assert cli.main(["ls"]) == 5
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("trainyard: error: cannot reach http://127.0.0.1:1")
    assert lines[1] == (
        "trainyard: error: that is the URL of context 'local': is the API up there? (dev.py "
        "up takes new ports at each start: log in again with the URL it prints, trainyard "
        "login URL --name local)"
    )


def test_the_default_url_that_does_not_answer_says_to_log_in(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    assert cli.main(["ls"]) == 5
    assert capsys.readouterr().err.splitlines()[1] == (
        "trainyard: error: no URL is configured, so http://127.0.0.1:8080 (a local stack's) "
        "was tried: trainyard login URL, set TRAINYARD_URL or pass --url"
    )


def test_a_url_from_the_environment_is_named_as_such(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setenv("TRAINYARD_URL", "http://127.0.0.1:2")
    assert cli.main(["ls"]) == 5
    assert capsys.readouterr().err.splitlines()[1] == (
        "trainyard: error: that is the URL from TRAINYARD_URL: is the API up there?"
    )


def test_a_url_from_the_option_is_the_error_alone(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL given by --url is on the command line the user just typed: the error names it,
    and a second line saying where it came from would tell nothing new."""
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    assert cli.main(["--url", "http://127.0.0.1:3", "ls"]) == 5
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trainyard: error: cannot reach http://127.0.0.1:3/: ")


def test_another_service_s_url_from_the_environment_is_named(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Billing, the registry and the scheduler have URLs of their own: one that did not
    answer was said with no word of where it came from."""
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://127.0.0.1:4")
    assert cli.main(["cost"]) == 5
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("trainyard: error: billing: cannot reach http://127.0.0.1:4/: ")
    assert lines[1] == (
        "trainyard: error: that is the billing URL from TRAINYARD_BILLING_URL: is the billing "
        "API up there?"
    )


def test_another_service_s_url_of_a_context_says_how_to_log_in_again(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINYARD_REGISTRY_URL", raising=False)
    config = state["config"]
    assert isinstance(config, Path)
    config.write_text(
        '{"current": "local", "contexts": {"local": {"url": "http://127.0.0.1:1", '
        '"token": "ty_a", "registry_url": "http://127.0.0.1:5"}}}\n'
    )
    config.chmod(0o600)
    assert cli.main(["model", "ls"]) == 5
    lines = capsys.readouterr().err.splitlines()
    assert "cannot reach http://127.0.0.1:5/: " in lines[0]
    assert lines[1] == (
        "trainyard: error: that is the registry URL of context 'local' (login --registry-url): "
        "is the registry API up there? (dev.py up takes new ports at each start: log in again "
        "with the URLs it prints, trainyard login URL --name local --registry-url REGISTRY_URL)"
    )


def test_a_submission_api_asked_for_another_service_s_command_is_named(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`waste --job` asks the submission API which job JOB is, then billing."""
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setenv("TRAINYARD_URL", "http://127.0.0.1:2")
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://127.0.0.1:4")
    assert cli.main(["waste", "--job", "abc1"]) == 5
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("trainyard: error: submission: cannot reach http://127.0.0.1:2/")
    assert lines[1] == "trainyard: error: that is the URL from TRAINYARD_URL: is the API up there?"


@pytest.mark.parametrize("command", [["ls"], ["model", "ls"]])
def test_a_remote_context_s_url_is_not_told_about_dev_py(
    command: list[str], state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """``dev.py up`` moves the ports of a stack on this machine only: a context of a remote
    stack that does not answer was told to log in again with the URL dev.py prints."""
    config = state["config"]
    assert isinstance(config, Path)
    config.write_text(
        '{"current": "prod", "contexts": {"prod": {"url": "https://ty.example.com", '
        '"token": "ty_a", "registry_url": "https://registry.example.com"}}}\n'
    )
    config.chmod(0o600)
    assert cli.main(command) == 5
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("trainyard: error: that is the ") and "context 'prod'" in lines[1]
    assert lines[1].endswith("API up there?"), lines[1]
    assert "dev.py" not in "\n".join(lines)
