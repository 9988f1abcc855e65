"""What ``submit`` checks before it uploads (the spec against the code it packed) and what it
says after (a job refused at once)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli import main
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient

HEAD = "apiVersion: trainyard.dev/v1\nkind: Job\nname: a\ngpus: 1\ngpu_flavor: cpu\n"


def submit(
    tmp_path: Path, spec: str, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str]]:
    (tmp_path / "job.yaml").write_text(HEAD + spec)
    code = main(["--token", "ty_a", "submit", str(tmp_path / "job.yaml")])
    return code, capsys.readouterr().err.splitlines()


def test_an_entrypoint_script_missing_from_the_code_is_refused_before_the_upload(
    tmp_path: Path, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    """``entrypoint: missing.py`` beside only ``train.py`` was packed, uploaded and accepted;
    the job then failed four times ("can't open file .../missing.py") before it ended."""
    (tmp_path / "train.py").write_text("print(1)\n")
    code, err = submit(tmp_path, "entrypoint: missing.py\n", sent, capsys)
    assert code == Exit.ERROR
    assert err == [
        f"trainyard: error: {tmp_path / 'job.yaml'}:6:13: entrypoint: no file missing.py in "
        f"the code packed from {tmp_path}"
    ]
    assert sent == []  # nothing uploaded, nothing submitted


def test_an_entrypoint_script_left_out_by_an_ignore_file_says_so(
    tmp_path: Path, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("print(1)\n")
    (tmp_path / ".gitignore").write_text("scripts/\n")
    code, err = submit(tmp_path, "entrypoint: scripts/train.py\n", sent, capsys)
    assert code == Exit.ERROR
    assert err == [
        f"trainyard: error: {tmp_path / 'job.yaml'}:6:13: entrypoint: scripts/train.py is in "
        f"{tmp_path} but not packed: a .gitignore or .trainyardignore leaves it out, or a "
        "folder never packed (.git/, .venv/, __pycache__/, .trainyard/) holds it"
    ]
    assert sent == []


@pytest.mark.parametrize(
    "entrypoint",
    [
        "train.py",  # the script is there
        "pkg/run.py",
        "some.module",  # a module may come from the requirements: the runner finds out
    ],
)
def test_an_entrypoint_in_the_code_or_a_module_goes_on_to_the_upload(
    tmp_path: Path, entrypoint: str, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "run.py").write_text("print(1)\n")
    submit(tmp_path, f"entrypoint: {entrypoint}\n", sent, capsys)
    # The spec's dry run without its code (``_spec_refused``), then the bundle's upload.
    assert [(r.method, r.url.path) for r in sent][:2] == [
        ("POST", "/v1/jobs"),
        ("HEAD", sent[1].url.path),
    ]
    assert sent[0].url.params["dry_run"] == "true"
    assert sent[1].url.path.startswith("/v1/bundles/")


def _job(status: str, **more: object) -> dict[str, object]:
    return {"id": "5689e086-0000", "name": "a", "status": status, "history": [], **more}


@pytest.mark.parametrize(
    ("later", "code", "error"),
    [
        (
            _job(
                "FAILED",
                failure={
                    "failure_kind": "rejected",
                    "reason": "refused: priority class 'urgent' does not exist",
                },
            ),
            Exit.JOB_FAILED,
            "trainyard: error: job 5689e086-0000 ended FAILED: refused: priority class "
            "'urgent' does not exist",
        ),
        (_job("SCHEDULED"), Exit.OK, None),
        # A job that ran and failed before the first look: `wait` says how it ended.
        (_job("FAILED", failure={"failure_kind": "user_error", "reason": "x"}), Exit.OK, None),
    ],
)
def test_a_job_refused_at_once_is_reported_with_its_reason_and_exit_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    later: dict[str, object],
    code: int,
    error: str | None,
) -> None:
    """``priority: urgent`` (no such class): the scheduler refused the job at once, and
    submit printed "status: FAILED" and exited 0, without the reason, so a script went on
    and a person had to run describe to learn why."""

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json=_job("QUEUED"))
        return httpx.Response(200, json=later)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    (tmp_path / "job.yaml").write_text(HEAD + "entrypoint: train\npriority: urgent\n")
    assert main(["--token", "ty_a", "submit", str(tmp_path / "job.yaml"), "--no-code"]) == code
    out, err = capsys.readouterr()
    assert out.splitlines() == ["submitted job 5689e086-0000 (a)", f"status: {later['status']}"]
    assert [line for line in err.splitlines() if "error" in line] == ([error] if error else [])


@pytest.mark.parametrize("command", [["wait", "5689e086"], ["attach", "5689e086"]])
def test_a_timeout_says_the_job_goes_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    """``submit --follow --timeout 3`` of a job that waits ended "did not finish within 3s
    (last status: PENDING)": nothing said the job still waits for GPUs, and how to stop it or
    follow it again (Ctrl-C says so)."""

    waiting = _job("PENDING", checkpoints=[], metrics={}, step=None, cost={"final": False})

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":  # a list row's cost is a number, not a view's
            return httpx.Response(200, json=[{**waiting, "cost": 0.0}])
        if request.url.path.endswith("/logs"):
            page = {"chunks": [], "cursor": "", "streams_complete": False, "job_terminal": False}
            return httpx.Response(200, json=page)
        return httpx.Response(200, json=waiting)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    assert main(["--token", "ty_a", *command, "--timeout", "0"]) == Exit.TIMEOUT
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        "trainyard: error: job 5689e086-0000 did not finish within 0s (last status: PENDING); "
        "it goes on: trainyard attach 5689e086-0000, or trainyard cancel 5689e086-0000"
    ]
