"""The ``trainyard`` CLI: readable output, one-line errors, stable exit codes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli, cli_jobs
from trainyard.cli_render import FollowPrinter, render_job, summary_reason
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
    "attempt": 0,  # the first attempt (0-based index, as the API carries it)
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


SPEC: dict[str, Any] = {
    "apiVersion": "trainyard.dev/v1",
    "kind": "Job",
    "name": "n",
    "entrypoint": "train",
    "gpus": 1,
    "gpu_flavor": "cpu",
}
"""A spec the client's own checks pass (the fake server takes anything)."""


BUDGET_WARNING = (
    "the budget of team nlp is spent (1 of 1 USD spent in 2026-12); the job runs at priority low"
)


class Seen(list[httpx.Request]):
    """The requests the fake server got, and its state."""

    bundles: dict[str, bytes]
    log_pages: list[dict[str, Any]]

    def submitted(self) -> list[dict[str, Any]]:
        return [
            json.loads(r.content) for r in self if r.method == "POST" and r.url.path == "/v1/jobs"
        ]


@pytest.fixture(autouse=True)
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file of the test's own (none yet), never the user's."""
    path = tmp_path / "config" / "config.json"
    monkeypatch.setenv("TRAINYARD_CONFIG", str(path))
    for name in ("URL", "TOKEN", "CONTEXT", "REGISTRY_URL", "BILLING_URL"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)
    return path


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Routes the CLI's client to a fake server; returns the requests it got."""
    seen = Seen()
    seen.bundles = {}
    seen.log_pages = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.startswith("/v1/bundles/"):
            sha = request.url.path.rsplit("/", 1)[1]
            if request.method == "HEAD":
                return httpx.Response(200 if sha in seen.bundles else 404)
            assert hashlib.sha256(request.content).hexdigest() == sha
            seen.bundles[sha] = request.content
            return httpx.Response(201, json={"sha256": sha, "created": True})
        if request.url.path.endswith("/logs"):
            if seen.log_pages:
                return httpx.Response(200, json=seen.log_pages.pop(0))
            after = request.url.params.get("after", "")
            return httpx.Response(200, json=_page([], after, complete=True, terminal=True))
        if request.url.path == "/v1/jobs" and request.method == "GET":
            return httpx.Response(
                200,
                json=[{**VIEW, "gpu_flavor": "h200", "gpus": 2, "cost": 4.0, "currency": "USD"}],
            )
        if request.url.path == "/v1/jobs/missing":
            return httpx.Response(404, json={"detail": "job missing not found", "errors": []})
        if request.method == "POST" and request.url.path == "/v1/jobs":
            spec = json.loads(request.content)
            if spec.get("entrypoint") == "no/module":
                body = {
                    "detail": "invalid job spec",
                    "errors": [{"field": "entrypoint", "message": "must be a dotted module"}],
                }
                return httpx.Response(422, json=body)
            warned = spec.get("name") == "warned"
            headers = {"Trainyard-Budget-Warning": BUDGET_WARNING} if warned else {}
            return httpx.Response(201, json={**VIEW, "status": "QUEUED"}, headers=headers)
        return httpx.Response(200, json=VIEW)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_env")
    monkeypatch.setenv("TRAINYARD_URL", "http://env.test")
    monkeypatch.delenv("TRAINYARD_BUNDLE_MAX_BYTES", raising=False)
    monkeypatch.setattr(cli_jobs.time, "sleep", lambda _: None)
    return seen


def _page(
    chunks: list[tuple[str, int, str]], cursor: str, complete: bool = False, terminal: bool = False
) -> dict[str, Any]:
    return {
        "chunks": [{"stream": s, "seq": n, "text": t} for s, n, t in chunks],
        "cursor": cursor,
        "streams_complete": complete,
        "job_terminal": terminal,
    }


def test_status_is_readable(api: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "job-1"]) == 0
    out = capsys.readouterr().out
    assert "SUCCEEDED (attempt 1 on node-1, GPUs 0,1)" in out
    assert "acc=0.97 loss=0.1235" in out
    assert "digits v2 s3://m/2" in out
    assert "4.000000 USD for 2.000 GPU-hours at 2.000000 USD/GPU-hour (final)" in out
    assert "2024-06-01 12:00:00Z  QUEUED     submitted" in out
    assert api[0].headers["Authorization"] == "Bearer ty_env"
    assert str(api[0].url).startswith("http://env.test/")


def test_describe_shows_the_priority_class_the_job_runs_at() -> None:
    # A job let in by a spent budget (policy deprioritize) runs at priority low; describe
    # showed no class at all, so nothing said why it waited behind the team's other jobs.
    assert re.search(r"^priority +normal$", render_job(VIEW), re.M)
    low = {**VIEW, "spec": {**VIEW["spec"], "priority": "low"}}
    assert re.search(r"^priority +low$", render_job(low), re.M)


def test_describe_shows_from_what_class_a_budget_lowered_the_job() -> None:
    # Once the budget is raised or the month ends nothing else says why the job runs at low:
    # its first history entry (written at submission) does, and describe shows it whole.
    reason = (
        "submitted; priority lowered from normal to low: the budget of team ml is spent "
        "(12 of 10 USD spent in 2026-12) (policy deprioritize)"
    )
    first = {**VIEW["history"][0], "reason": reason}
    out = render_job({**VIEW, "history": [first, *VIEW["history"][1:]]})
    assert "QUEUED     submitted; priority lowered from normal to low: the budget" in out
    assert "(policy deprioritize)" in out


def test_describe_counts_attempts_from_one() -> None:
    # The view's attempt is the 0-based index (the scheduler's first attempt is 0); describe
    # said "attempt 0 on node-1" where the dashboard and the history say "attempt 1".
    first = render_job({**VIEW, "attempt": 0})
    assert re.search(r"^status +SUCCEEDED \(attempt 1 on node-1, GPUs 0,1\)$", first, re.M)


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
    assert header.split() == [
        "ID", "NAME", "USER", "STATUS", "REASON", "GPUS", "SUBMITTED", "DURATION", "COST"
    ]  # fmt: skip
    assert row.split()[:6] == ["job-1", "digits-cnn", "alice", "SUCCEEDED", "-", "2xh200"]
    assert row.split()[8] == "9m00s"
    assert api[0].url.params["status"] == "SUCCEEDED"


def test_submit_and_follow(api: Seen, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({**SPEC, "name": "digits-cnn", "gpus": 2}))
    assert cli.main(["submit", str(spec)]) == 0
    assert "submitted job job-1" in capsys.readouterr().out
    api.log_pages = [_page([("a0000-node-1", 0, "epoch 1\n")], "c1", complete=True, terminal=True)]
    assert cli.main(["submit", str(spec), "--follow"]) == 0
    captured = capsys.readouterr()
    assert "SUCCEEDED" in captured.out and "model registered: digits v2" in captured.out
    assert "cost: 4.000000 USD" in captured.out
    assert "epoch 1\n" in captured.out and "==> attempt 1 on node-1 <==" in captured.err


def test_submit_says_the_budget_warning(
    api: Seen, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seen on a local stack: a team's spent budget (policy deprioritize) made its job run at
    # priority low, and submission said so in its Trainyard-Budget-Warning header, which the
    # CLI dropped: the user learnt nothing of why the job waited behind every other.
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({**SPEC, "name": "warned"}))
    for extra in ([], ["--json"]):
        assert cli.main(["submit", str(spec), *extra]) == 0
        captured = capsys.readouterr()
        assert f"warning: {BUDGET_WARNING}" in captured.err.splitlines()
    spec.write_text(json.dumps(SPEC))
    assert cli.main(["submit", str(spec)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_submit_packs_and_uploads_the_spec_folder_once(
    api: Seen, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "big.bin").write_bytes(b"x" * 10)
    (tmp_path / ".trainyardignore").write_text("*.bin\n")
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({**SPEC, "entrypoint": "train.py"}))
    assert cli.main(["submit", str(spec)]) == 0
    ((sha, data),) = api.bundles.items()
    code = api.submitted()[-1]["code"]
    assert code == {"kind": "bundle", "sha256": sha, "size_bytes": len(data)}
    err = capsys.readouterr().err
    assert err.startswith("code: ") and f"B bundle {sha[:7]} (uploaded)" in err
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(data)
    with tarfile.open(bundle) as tar:
        assert sorted(tar.getnames()) == [".trainyardignore", "job.json", "train.py"]
    bundle.unlink()

    assert cli.main(["submit", str(spec)]) == 0  # the same contents: not uploaded again
    assert f"bundle {sha[:7]} (already stored)" in capsys.readouterr().err
    assert [r.method for r in api if r.url.path.startswith("/v1/bundles/")] == [
        "HEAD",
        "PUT",
        "HEAD",
    ]
    assert api.submitted()[-1]["code"] == code


def test_workdir_no_code_and_a_spec_that_names_its_code(
    api: Seen, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("1")
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(SPEC))
    assert cli.main(["submit", str(spec), "--workdir", str(src)]) == 0
    (data,) = api.bundles.values()
    (tmp_path / "b.tgz").write_bytes(data)
    with tarfile.open(tmp_path / "b.tgz") as tar:
        assert tar.getnames() == ["train.py"]
    assert cli.main(["submit", str(spec), "--no-code"]) == 0
    assert "code" not in api.submitted()[-1]
    git = {"kind": "git", "repository": "https://h/r.git", "commit": "a" * 40}
    spec.write_text(json.dumps({**SPEC, "code": git}))
    capsys.readouterr()
    requests = len(api)
    assert cli.main(["submit", str(spec)]) == 0
    assert api.submitted()[-1]["code"] == git
    assert len(api) == requests + 2  # the submission, and one look at where it waits
    assert "code:" not in capsys.readouterr().err
    assert _exit_code(["submit", str(spec), "--no-code", "--workdir", "."]) == 2  # usage


def test_a_bundle_over_the_limit_is_a_one_line_error(
    api: Seen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "weights.pt").write_bytes(os.urandom(16 * 1024))
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(SPEC))
    monkeypatch.setenv("TRAINYARD_BUNDLE_MAX_BYTES", "1000")
    assert cli.main(["submit", str(spec)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "weights.pt (16.0 KiB)" in err and ".trainyardignore" in err
    assert api.bundles == {} and api.submitted() == []
    monkeypatch.setenv("TRAINYARD_BUNDLE_MAX_BYTES", "lots")
    assert cli.main(["submit", str(spec)]) == 1
    assert "TRAINYARD_BUNDLE_MAX_BYTES" in capsys.readouterr().err


def test_logs_prints_chunks_with_stream_headers(
    api: Seen, capsys: pytest.CaptureFixture[str]
) -> None:
    api.log_pages = [
        _page([("a0000-node-1", 0, "one\n"), ("a0000-node-1", 1, "two (no newline)")], "c1"),
        _page([("a0001-node-1", 0, "retry\n")], "c2"),
        _page([], "c2"),
    ]
    assert cli.main(["logs", "job-1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "one\ntwo (no newline)\nretry\n"
    # Streams are keyed by the 0-based attempt index; people read attempts from 1.
    assert captured.err == "==> attempt 1 on node-1 <==\n==> attempt 2 on node-1 <==\n"
    logs = [r for r in api if r.url.path == "/v1/jobs/job-1/logs"]
    assert [r.url.params["after"] for r in logs] == ["", "c1", "c2"]


def test_logs_follow_until_the_job_ended_and_its_streams_are_complete(
    api: Seen, capsys: pytest.CaptureFixture[str]
) -> None:
    api.log_pages = [
        _page([], ""),
        _page([("a0001-n", 0, "a\n")], "c1"),
        _page([], "c1"),
        _page([], "c1", terminal=True),  # ended, but the last chunk is not in yet
        _page([("a0001-n", 1, "b\n")], "c2", complete=True, terminal=True),
        _page([], "c2", complete=True, terminal=True),
    ]
    assert cli.main(["logs", "job-1", "-f"]) == 0
    assert capsys.readouterr().out == "a\nb\n"
    assert api.log_pages == []


def test_logs_follow_gives_up_on_streams_that_never_complete(
    api: Seen, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(cli_jobs.time, "monotonic", lambda: float(next(clock)))
    api.log_pages = [_page([], "", terminal=True)] * 10
    assert cli.main(["logs", "job-1", "--follow"]) == 0
    assert len(api.log_pages) == 7  # ended at t=0, still incomplete at t=5, given up at t=10


def test_logs_ctrl_c_is_quiet(
    api: Seen, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_jobs.time, "sleep", interrupt)
    api.log_pages = [_page([("a0001-n", 0, "a\n")], "c1"), _page([], "c1")]
    assert cli.main(["logs", "job-1", "-f"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "a\n" and "Traceback" not in captured.err
    assert "interrupted" not in captured.err and "error" not in captured.err


def test_logs_json_prints_one_chunk_per_line(api: Seen, capsys: pytest.CaptureFixture[str]) -> None:
    api.log_pages = [_page([("a0001-n", 0, "a\n")], "c1"), _page([], "c1")]
    assert cli.main(["logs", "job-1", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {"stream": "a0001-n", "seq": 0, "text": "a\n"}


def test_status_shows_a_command_and_its_code(
    api: Seen, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        **VIEW["spec"],
        "entrypoint": "",
        "command": ["bash", "run.sh", "--lr", "0.1 0.2"],
        "code": {"kind": "bundle", "sha256": "3fa2c1d" + "0" * 57, "size_bytes": 1_258_291},
    }
    monkeypatch.setattr(TrainyardClient, "get_job", lambda *_: {**VIEW, "spec": spec})
    assert cli.main(["status", "job-1"]) == 0
    out = capsys.readouterr().out
    assert "2 x h200, bash run.sh --lr '0.1 0.2'" in out
    assert "bundle 3fa2c1d (1.2 MiB)" in out


def test_follow_exits_10_when_the_job_fails(
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
    spec.write_text(json.dumps(SPEC))
    assert cli.main(["submit", str(spec), "--follow", "--no-code"]) == 10
    assert capsys.readouterr().err.strip() == (
        "trainyard: error: job job-1 ended FAILED: out of memory"
    )


@pytest.mark.parametrize(
    ("argv", "message", "exit_code"),
    [
        (["status", "missing"], "404 job missing not found", 3),
        (["submit", "NOFILE"], "NOFILE: cannot read", 1),
        (["submit", "BAD"], "BAD:1:2: invalid JSON: Expecting property name", 1),
        (["submit", "LIST"], "LIST:1:1: must hold one mapping", 1),
        (["submit", "NEG", "--no-code"], "NEG:1:95: gpus: must be at least 1", 1),
        (["submit", "SERVER", "--no-code"], "SERVER:5:15: entrypoint: must be a dotted module", 1),
        (["explode"], "invalid choice", 2),
        (["status"], "the following arguments are required", 2),
        (["ls", "--status", "running", "--limit", "0"], "'0' is not a positive integer", 2),
        (["ls", "--status", "sleeping"], "use one of queued, pending", 2),
    ],
)
def test_errors_are_one_line_on_stderr_with_their_exit_code(
    api: list[httpx.Request],
    argv: list[str],
    message: str,
    exit_code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("BAD").write_text("{nope")
    Path("LIST").write_text("[]")
    Path("NEG").write_text(json.dumps({**SPEC, "gpus": -1}))
    Path("SERVER").write_text(json.dumps({**SPEC, "entrypoint": "no/module"}, indent=0))
    code = _exit_code(argv)
    captured = capsys.readouterr()
    assert code == exit_code
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_missing_token_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINYARD_TOKEN", raising=False)
    assert cli.main(["list"]) == 7  # not configured
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
    assert cli.main(["list", "--url", "http://127.0.0.1:9"]) == 5
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: cannot reach http://127.0.0.1:9")
    assert len(err.strip().splitlines()) == 1


def _exit_code(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)


def test_metrics_without_the_registry_are_the_latest_values(
    api: Seen, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["metrics", "job-1"]) == 0
    assert capsys.readouterr().out.strip() == "step 100: acc=0.97 loss=0.1235"
    assert cli.main(["metrics", "job-1", "loss"]) == 7  # not configured
    assert "no registry URL: set TRAINYARD_REGISTRY_URL" in capsys.readouterr().err
    assert cli.main(["experiments"]) == 7


def test_wait_exits_with_the_jobs_final_state(
    api: Seen, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for status, code in (("SUCCEEDED", 0), ("FAILED", 10), ("CANCELLED", 11)):
        view = {**VIEW, "status": status}
        monkeypatch.setattr(TrainyardClient, "wait", lambda *a, _v=view, **k: _v)
        assert cli.main(["wait", "job-1"]) == code
        assert capsys.readouterr().out.startswith(f"job-1  {status}")

    def late(*_: Any, **__: Any) -> dict[str, Any]:
        raise TimeoutError("job job-1 did not finish within 1s (last status: RUNNING)")

    monkeypatch.setattr(TrainyardClient, "wait", late)
    assert cli.main(["wait", "job-1", "--timeout", "1"]) == 6
    assert "did not finish within 1s" in capsys.readouterr().err


def test_ls_pages_and_filters(
    api: Seen, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ls", "--all", "--user", "alice", "--project", "p", "--label", "a=b=c", "--json"]
    assert cli.main(argv) == 0
    params = api[-1].url.params
    assert (params["limit"], params["user"], params["project"]) == ("500", "alice", "p")
    assert params["label"] == "a=b=c"
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == ["job-1"]
    assert cli.main(["ls", "--user", "bob", "--json"]) == 0  # held to it here too
    assert json.loads(capsys.readouterr().out) == []


def test_submit_reads_a_spec_from_stdin(
    api: Seen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr(
        "sys.stdin", io.StringIO("name: piped\nentrypoint: t\ngpus: 1\ngpu_flavor: cpu\n")
    )
    assert cli.main(["submit", "-", "--no-code"]) == 0
    assert api.submitted()[-1]["name"] == "piped"
    monkeypatch.setattr("sys.stdin", io.StringIO("name: piped\ngpu: 1\n"))
    assert cli.main(["submit", "-", "--no-code"]) == 1
    assert "<stdin>:2:1: gpu: unknown field 'gpu': did you mean 'gpus'?" in capsys.readouterr().err


def test_get_gives_a_job_the_reason_ls_gives_it() -> None:
    # Seen on a local stack: `trainyard get` of a cancelled job said REASON "-", where the
    # line GET /v1/jobs gives it (what `ls` shows) says "cancelled by user": get read only a
    # failure or a pending reason, so it also showed a job running again after a failed
    # attempt with that old failure. get now chooses as GET /v1/jobs does.
    def entry(status: str, reason: str | None) -> dict[str, Any]:
        return {"status": status, "at": "2024-06-01T12:00:00Z", "reason": reason}

    cancelled = {
        **VIEW,
        "status": "CANCELLED",
        "history": [entry("QUEUED", "submitted"), entry("CANCELLED", "cancelled by user")],
    }
    assert summary_reason(cancelled) == "cancelled by user"
    again = {
        **VIEW,
        "status": "RUNNING",
        "failure": {"reason": "attempt 1 failed: user_error: exited with status 1"},
        "history": [entry("SCHEDULED", "attempt 2 on node-1 (GPUs 0)"), entry("RUNNING", None)],
    }
    assert summary_reason(again) is None
    failed = {**again, "status": "FAILED", "failure": {"reason": "max restarts (1) reached"}}
    assert summary_reason(failed) == "max restarts (1) reached"
    waiting = {**VIEW, "status": "PENDING", "pending": {"reason": "no cpu GPU is free"}}
    assert summary_reason(waiting) == "no cpu GPU is free"


def test_describe_says_a_job_that_held_no_gpu_cost_nothing_final() -> None:
    # Seen on a local stack: a job cancelled while it waited showed "cost  nothing billed
    # yet (final)": "yet" promises more, "final" says none will come.
    nothing = {"gpu_seconds": 0.0, "cost": 0.0, "currency": None, "price_per_gpu_hour": None}
    ended = render_job({**VIEW, "status": "CANCELLED", "cost": {**nothing, "final": True}})
    assert re.search(r"^cost +nothing billed \(final\)$", ended, re.M)
    waiting = render_job({**VIEW, "status": "PENDING", "cost": {**nothing, "final": False}})
    assert re.search(r"^cost +nothing billed yet \(so far\)$", waiting, re.M)


def test_describe_keeps_a_reason_of_several_lines_in_its_column() -> None:
    # Seen on a local stack: a job whose environment could not be built failed with the
    # installer's output in its reason; describe printed its further lines at the left
    # margin, among the labels, in the failure row and in the history.
    reason = "platform_error: could not build the job's environment:\nerror: No solution found"
    failed = {
        **VIEW,
        "status": "FAILED",
        "failure": {"reason": reason, "exit_code": None, "log_tail": ""},
        "history": [{"status": "FAILED", "at": "2024-06-01T12:00:00Z", "reason": reason}],
    }
    lines = render_job(failed).splitlines()
    failure = lines.index("failure     platform_error: could not build the job's environment:")
    assert lines[failure + 1] == " " * 12 + "error: No solution found"
    assert lines[-1] == " " * 12 + "error: No solution found"
    assert all(line[:12].strip() in LABELS for line in lines)


LABELS = {
    "", "job", "status", "owner", "project", "resources", "priority", "times", "duration",
    "metrics", "checkpoints", "model", "cost", "failure", "history",
}  # fmt: skip


def test_attach_keeps_a_reason_of_several_lines_under_its_entry() -> None:
    # attach and submit --follow print new history entries; a reason holding a tool's
    # output (a failed environment build) put its further lines at the left margin, where
    # the entries' times go.
    reason = "platform_error: could not build the job's environment:\nerror: No solution found"
    view = {
        **VIEW,
        "status": "FAILED",
        "history": [{"status": "FAILED", "at": "2024-06-01T12:00:00Z", "reason": reason}],
    }
    lines = "\n".join(FollowPrinter().changes(view)).splitlines()
    assert lines[0].startswith("2024-06-01 12:00:00Z  FAILED  platform_error: could not")
    assert lines[1] == " " * 10 + "error: No solution found"
