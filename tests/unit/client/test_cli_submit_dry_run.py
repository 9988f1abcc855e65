"""``trainyard submit --dry-run``: the server checks the job as it checks a submission
(``POST /v1/jobs?dry_run=true``) and nothing is submitted; its refusal reads as a
submission's (on the spec file's lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient

SPEC = "apiVersion: trainyard.dev/v1\nkind: Job\nname: a\nentrypoint: train\ngpus: 1\n"
VIEW = {"id": "f" * 8 + "-0000-4000-8000-000000000000", "name": "a", "status": "QUEUED"}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The submission API answering ``state["answer"]`` (status, body); ``state["sent"]``."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.delenv("TRAINYARD_BILLING_URL", raising=False)
    state: dict[str, Any] = {"sent": [], "answer": (200, {})}

    def route(request: httpx.Request) -> httpx.Response:
        state["sent"].append(request)
        status, body = state["answer"]
        return httpx.Response(status, json=body)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.chdir(tmp_path)
    return state


def _submit(*extra: str, flavor: str = "cpu") -> int:
    Path("job.yaml").write_text(SPEC + f"gpu_flavor: {flavor}\n")
    return cli.main(["--url", "http://api.test", "--token", "ty_a", "submit", "job.yaml", *extra])


def test_a_dry_run_asks_the_server_to_check_and_submits_nothing(
    server: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    server["answer"] = (200, {**VIEW, "spec": {"gpus": 1, "gpu_flavor": "cpu"}})
    assert _submit("--no-code", "--dry-run") == Exit.OK
    (request,) = server["sent"]
    assert (request.method, request.url.path) == ("POST", "/v1/jobs")
    assert request.url.params["dry_run"] == "true"
    assert json.loads(request.content)["name"] == "a"
    out = capsys.readouterr().out
    assert out == "the job would be accepted: a (1 x cpu); nothing was submitted\n"


def test_a_dry_run_prints_the_servers_view_with_json(
    server: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    view = {**VIEW, "spec": {"gpus": 1, "gpu_flavor": "cpu"}}
    server["answer"] = (200, view)
    assert _submit("--no-code", "--dry-run", "--json") == Exit.OK
    assert json.loads(capsys.readouterr().out) == view


def test_a_refused_dry_run_reads_as_a_refused_submission(
    server: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    errors = [{"field": "gpu_flavor", "message": "unknown flavor 'tpu'; known: cpu, h100"}]
    server["answer"] = (422, {"detail": "invalid request", "errors": errors})
    assert _submit("--no-code", "--dry-run", flavor="tpu") == Exit.ERROR
    err = capsys.readouterr().err
    assert (
        err
        == "trainyard: error: job.yaml:6:13: gpu_flavor: unknown flavor 'tpu'; known: cpu, h100\n"
    )


def test_a_dry_run_cannot_be_followed(
    server: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _submit("--no-code", "--dry-run", "--follow") == Exit.USAGE
    assert "--follow cannot follow a dry run" in capsys.readouterr().err
    assert server["sent"] == []


def test_a_followed_dry_run_is_refused_before_the_code_is_packed_or_checked(
    server: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error is said before any request: ``--dry-run --follow`` with code to pack
    asked the server about the spec and the bundle first, then said it."""
    Path("train.py").write_text("print('hi')\n")
    assert _submit("--dry-run", "--follow") == Exit.USAGE
    err = capsys.readouterr().err
    assert "--follow cannot follow a dry run" in err
    assert "code:" not in err
    assert server["sent"] == []
