"""``trainyard sweep`` against a simulated API: the trials it submits, how many at once,
what it prints, and resuming by running the same command again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli, cli_sweep
from trainyard.client import TrainyardClient

SPEC = """\
apiVersion: trainyard.dev/v1
kind: Job
name: digits
entrypoint: train
gpus: 1
gpu_flavor: cpu
hyperparameters:
  epochs: 2
"""


class FakeApi:
    """Jobs by idempotency key; each job ends after ``polls`` looks at it, SUCCEEDED with
    ``acc`` a function of its ``lr`` (best at lr = 0.01), or FAILED when ``lr`` is in
    ``failing``."""

    def __init__(self, polls: int = 2, failing: frozenset[float] = frozenset()) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.looks: dict[str, int] = {}
        self.polls = polls
        self.failing = failing
        self.submitted: list[dict[str, Any]] = []
        self.most_unfinished = 0
        self.away = 0
        """How many requests from now on are answered 503 (the API restarting)."""

    def route(self, request: httpx.Request) -> httpx.Response:
        if self.away:
            self.away -= 1
            return httpx.Response(503, json={"detail": "restarting", "errors": []})
        if request.method == "POST" and request.url.path == "/v1/jobs":
            spec = json.loads(request.content)
            key = request.headers["Idempotency-Key"]
            if key not in self.by_key:
                job_id = f"{len(self.jobs) + 1:08x}-0000-4000-8000-000000000000"
                self.by_key[key] = job_id
                self.jobs[job_id] = {"id": job_id, "name": spec["name"], "status": "QUEUED"}
                self.looks[job_id] = 0
                self.submitted.append(spec)
            unfinished = sum(1 for j in self.jobs.values() if j["status"] == "QUEUED")
            self.most_unfinished = max(self.most_unfinished, unfinished)
            return httpx.Response(201, json=self.jobs[self.by_key[key]])
        job_id = request.url.path.rsplit("/", 1)[1]
        job = self.jobs[job_id]
        self.looks[job_id] += 1
        if job["status"] == "QUEUED" and self.looks[job_id] >= self.polls:
            spec = self.submitted[int(job_id[:8], 16) - 1]
            lr = spec["hyperparameters"]["lr"]
            if lr in self.failing:
                job.update(status="FAILED", metrics={})
            else:
                job.update(status="SUCCEEDED", metrics={"acc": 1.0 - abs(lr - 0.01)})
        return httpx.Response(200, json=job)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_URL", "http://api.test")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_test")
    monkeypatch.delenv("TRAINYARD_BILLING_URL", raising=False)
    monkeypatch.setattr(cli_sweep, "POLL_SECONDS", 0.0)
    monkeypatch.setattr(cli_sweep, "RETRY_SECONDS", 0.0)
    fake = FakeApi()

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(fake.route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    (tmp_path / "job.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    return fake


GRID = ["sweep", "job.yaml", "--no-code", "--grid", "lr=0.1,0.01,0.001", "--grid", "bs=32,64"]


def test_a_grid_sweep_runs_each_trial_at_most_parallel_at_once_and_ranks_them(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main([*GRID, "--parallel", "2", "--metric", "acc", "--set", "epochs=3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [(s["hyperparameters"]["lr"], s["hyperparameters"]["bs"]) for s in api.submitted] == [
        (0.1, 32),
        (0.1, 64),
        (0.01, 32),
        (0.01, 64),
        (0.001, 32),
        (0.001, 64),
    ]
    assert api.most_unfinished == 2
    first = api.submitted[0]
    assert first["hyperparameters"]["epochs"] == 3  # --set applies to every trial
    assert first["experiment"] == "digits-sweep"
    assert first["labels"]["sweep-trial"] == "1"
    assert len({s["labels"]["sweep"] for s in api.submitted}) == 1
    lines = out.splitlines()
    assert lines[0].split() == ["TRIAL", "JOB", "STATUS", "LR", "BS", "ACC"]
    assert [line.split()[0] for line in lines[1:7]] == ["3", "4", "5", "6", "1", "2"]
    assert lines[7].startswith("best: trial 3, job 00000003: acc=1 (lr=0.01 bs=32)")
    assert "trainyard compare digits-sweep" in lines[8]


def test_running_the_same_sweep_again_submits_nothing_twice(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*GRID, "--metric", "acc"]) == 0
    assert len(api.submitted) == 6
    assert cli.main([*GRID, "--metric", "acc"]) == 0
    assert len(api.submitted) == 6  # the same keys: the same six jobs
    assert cli.main([*GRID, "--metric", "acc", "--set", "epochs=9"]) == 0
    assert len(api.submitted) == 12  # another spec: another sweep


def test_an_api_that_is_away_for_a_while_is_waited_out(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.away = 5
    assert cli.main([*GRID, "--metric", "acc"]) == 0
    assert len(api.submitted) == 6
    assert "503 restarting; trying again" in capsys.readouterr().err


def test_random_trials_and_the_json_report(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--json", "sweep", "job.yaml", "--no-code", "--random", "5", "--seed", "3"]
    code = cli.main([*argv, "--log-uniform", "lr=1e-4:1e-1", "--metric", "acc", "--goal", "min"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["experiment"] == "digits-sweep" and report["goal"] == "min"
    values = [t["metric"] for t in report["trials"]]
    assert values == sorted(values) and len(values) == 5
    assert report["best"] == report["trials"][0]
    assert all(1e-4 <= t["hyperparameters"]["lr"] <= 1e-1 for t in report["trials"])


def test_a_sweep_whose_every_trial_failed_exits_as_a_failed_job(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.failing = frozenset({0.1, 0.01, 0.001})
    assert cli.main([*GRID, "--metric", "acc"]) == 10
    out, _ = capsys.readouterr()
    assert "best: none (no succeeded trial reported acc)" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "nothing to sweep"),
        (["--uniform", "lr=0:1"], "need --random N"),
        (["--grid", "lr=1,2", "--set", "lr=3"], "--grid lr: is also set by --set"),
        (["--grid", "lr=1", "--parallel", "0"], "--parallel: 0; give 1 or more"),
        (["--random", "2", "--log-uniform", "lr=0:1"], "LOW must be above 0"),
    ],
)
def test_a_sweep_that_cannot_run_is_a_usage_error_before_any_request(
    api: FakeApi, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert cli.main(["sweep", "job.yaml", "--no-code", *extra]) == 2
    assert message in capsys.readouterr().err
    assert api.submitted == []


@pytest.mark.parametrize("option", ["--grid lr", "--grid =1", "--uniform lr=1", "--uniform lr=a:b"])
def test_a_malformed_option_is_a_usage_error(
    api: FakeApi, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    name, value = option.split(" ")
    with pytest.raises(SystemExit) as ended:
        cli.main(["sweep", "job.yaml", "--no-code", name, value])
    assert ended.value.code == 2
    assert "sweep" in capsys.readouterr().err
