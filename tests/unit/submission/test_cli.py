"""The ``trainyard`` CLI: readable output, and one-line errors with exit status 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

VIEW: dict[str, Any] = {
    "id": "job-1",
    "name": "digits-cnn",
    "team": "ml",
    "user": "alice",
    "spec": {"gpus": 2, "gpu_flavor": "h200", "entrypoint": "examples.digits_cnn", "args": []},
    "status": "SUCCEEDED",
    "terminal": True,
    "history": [
        {"status": "QUEUED", "at": "2024-06-01T12:00:00Z", "reason": "submitted"},
        {"status": "SUCCEEDED", "at": "2024-06-01T12:10:00+00:00", "reason": None},
    ],
    "pending": None,
    "node": "node-1",
    "gpu_indices": [0, 1],
    "attempt": 1,
    "submitted_at": "2024-06-01T12:00:00Z",
    "started_at": "2024-06-01T12:01:00Z",
    "finished_at": "2024-06-01T12:10:00Z",
    "cancel_requested": False,
    "failure": None,
    "step": 100,
    "metrics": {"loss": 0.123456, "acc": 0.97},
    "checkpoints": [
        {"step": 100, "uri": "s3://c/100", "sha256": "a", "size_bytes": 2048, "saved_at": "x"}
    ],
    "model": {"name": "digits", "version": 2, "artifact_uri": "s3://m/2"},
    "cost": {
        "gpu_seconds": 7200.0,
        "cost": 4.0,
        "currency": "USD",
        "price_per_gpu_hour": 2.0,
        "final": True,
    },
}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Routes the CLI's client to a fake server; returns the requests it got."""
    seen: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/jobs" and request.method == "GET":
            return httpx.Response(
                200,
                json=[{**VIEW, "gpu_flavor": "h200", "gpus": 2, "cost": 4.0, "currency": "USD"}],
            )
        if request.url.path == "/v1/jobs/missing":
            return httpx.Response(404, json={"detail": "job missing not found", "errors": []})
        if request.method == "POST" and request.url.path == "/v1/jobs":
            spec = json.loads(request.content)
            if spec.get("gpus", 1) < 1:
                body = {
                    "detail": "invalid job spec",
                    "errors": [{"field": "gpus", "message": "must be >= 1"}],
                }
                return httpx.Response(422, json=body)
            return httpx.Response(201, json={**VIEW, "status": "QUEUED"})
        return httpx.Response(200, json=VIEW)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_env")
    monkeypatch.setenv("TRAINYARD_URL", "http://env.test")
    return seen


def test_status_is_readable(api: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "job-1"]) == 0
    out = capsys.readouterr().out
    assert "SUCCEEDED (attempt 1 on node-1, GPUs 0,1)" in out
    assert "acc=0.97 loss=0.1235" in out
    assert "digits v2 s3://m/2" in out
    assert "4.0000 USD for 2.000 GPU-hours at 2.00 USD/GPU-hour (final)" in out
    assert "2024-06-01 12:00:00Z  QUEUED     submitted" in out
    assert api[0].headers["Authorization"] == "Bearer ty_env"
    assert str(api[0].url).startswith("http://env.test/")


def test_options_override_the_environment_before_or_after_the_command(
    api: list[httpx.Request],
) -> None:
    assert cli.main(["--token", "ty_a", "status", "job-1"]) == 0
    assert cli.main(["status", "job-1", "--token", "ty_b", "--url", "http://flag.test"]) == 0
    assert [r.headers["Authorization"] for r in api] == ["Bearer ty_a", "Bearer ty_b"]
    assert api[1].url.host == "flag.test"


def test_json_output(api: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "job-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "job-1"


def test_list_is_a_table(api: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--status", "SUCCEEDED"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "NAME", "USER", "STATUS", "GPUS", "SUBMITTED", "COST"]
    assert row.split()[:5] == ["job-1", "digits-cnn", "alice", "SUCCEEDED", "2xh200"]
    assert api[0].url.params["status"] == "SUCCEEDED"


def test_submit_and_follow(
    api: list[httpx.Request], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "digits-cnn", "gpus": 2}))
    assert cli.main(["submit", str(spec)]) == 0
    assert "submitted job job-1" in capsys.readouterr().out
    assert cli.main(["submit", str(spec), "--follow"]) == 0
    out = capsys.readouterr().out
    assert "SUCCEEDED" in out and "model registered: digits v2" in out
    assert "cost: 4.0000 USD" in out


def test_follow_exits_1_when_the_job_fails(
    api: list[httpx.Request],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    failed = {
        **VIEW,
        "status": "FAILED",
        "model": None,
        "failure": {"reason": "out of memory", "exit_code": 137, "log_tail": ""},
    }
    monkeypatch.setattr(TrainyardClient, "wait", lambda *a, **k: failed)
    spec = tmp_path / "job.json"
    spec.write_text("{}")
    assert cli.main(["submit", str(spec), "--follow"]) == 1
    assert capsys.readouterr().err.strip() == (
        "trainyard: error: job job-1 ended FAILED: out of memory"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "missing"], "404 job missing not found"),
        (["submit", "NOFILE"], "cannot read NOFILE"),
        (["submit", "BAD"], "BAD is not valid JSON"),
        (["submit", "LIST"], "must hold one JSON object"),
        (["submit", "NEG"], "422 invalid job spec (gpus: must be >= 1)"),
        (["explode"], "invalid choice"),
        (["status"], "the following arguments are required"),
    ],
)
def test_errors_are_one_line_on_stderr_with_exit_1(
    api: list[httpx.Request],
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("BAD").write_text("{nope")
    Path("LIST").write_text("[]")
    Path("NEG").write_text('{"gpus": -1}')
    code = _exit_code(argv)
    captured = capsys.readouterr()
    assert code == 1
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_missing_token_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINYARD_TOKEN", raising=False)
    assert cli.main(["list"]) == 1
    assert "set TRAINYARD_TOKEN or pass --token" in capsys.readouterr().err


def test_unreachable_server_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(refuse))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_x")
    assert cli.main(["list", "--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: cannot reach http://127.0.0.1:9")
    assert len(err.strip().splitlines()) == 1


def _exit_code(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)
