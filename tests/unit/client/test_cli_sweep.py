"""``trainyard sweep`` against a simulated API: the trials it submits, how many at once,
what it prints, and resuming by running the same command again."""

from __future__ import annotations

import json
from collections.abc import Callable
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
        self.running_status = False
        """Whether a job is RUNNING between its first look and its end (else QUEUED)."""
        """How many requests from now on are answered 503 (the API restarting)."""
        self.checked: list[dict[str, Any]] = []
        """The specs of the dry runs (``?dry_run=true``), stored nowhere."""
        self.refuse: Callable[[dict[str, Any]], list[dict[str, str]]] = lambda spec: []
        """The field errors the server finds in a spec (a dry run's and a submission's)."""

    def route(self, request: httpx.Request) -> httpx.Response:
        if self.away:
            self.away -= 1
            return httpx.Response(503, json={"detail": "restarting", "errors": []})
        if request.method == "POST" and request.url.path == "/v1/jobs":
            spec = json.loads(request.content)
            key = request.headers["Idempotency-Key"]
            errors = self.refuse(spec)
            if errors:
                return httpx.Response(422, json={"detail": "invalid request", "errors": errors})
            if request.url.params.get("dry_run") == "true":
                self.checked.append(spec)
                job_id = self.by_key.get(key, "ffffffff-0000-4000-8000-000000000000")
                view = self.jobs.get(job_id, {"id": job_id, "name": spec["name"]})
                return httpx.Response(200, json={"status": "QUEUED", **view})
            if key not in self.by_key:
                job_id = f"{len(self.jobs) + 1:08x}-0000-4000-8000-000000000000"
                self.by_key[key] = job_id
                self.jobs[job_id] = {"id": job_id, "name": spec["name"], "status": "QUEUED"}
                self.looks[job_id] = 0
                self.submitted.append(spec)
            unfinished = sum(1 for j in self.jobs.values() if j["status"] == "QUEUED")
            self.most_unfinished = max(self.most_unfinished, unfinished)
            return httpx.Response(201, json=self.jobs[self.by_key[key]])
        parts = request.url.path.split("/")  # "", "v1", "jobs", id[, "metrics", key | "cancel"]
        job = self.jobs[parts[3]]
        if request.url.host == "registry.test":
            points = [
                {"step": step, "time": "2026-12-06T00:00:00Z", "value": self.acc(job["id"])}
                for step in range(1, self.looks[job["id"]] + 1)
            ]
            if not points:
                return httpx.Response(404, json={"detail": "no such metric", "errors": []})
            curve = {"job_id": job["id"], "key": parts[5], "total": len(points), "points": points}
            return httpx.Response(200, json={**curve, "downsampled": False})
        if parts[-1] == "cancel":
            job["status"] = "CANCELLED"
            return httpx.Response(200, json=job)
        self.looks[job["id"]] += 1
        if job["status"] == "QUEUED" and self.looks[job["id"]] >= self.polls:
            if self.lr(job["id"]) in self.failing:
                job.update(status="FAILED", metrics={})
            else:
                job.update(status="SUCCEEDED", metrics={"acc": self.acc(job["id"])})
        elif job["status"] == "QUEUED":
            job["status"] = "RUNNING" if self.running_status else "QUEUED"
        elif job["status"] == "RUNNING" and self.looks[job["id"]] >= self.polls:
            job.update(status="SUCCEEDED", metrics={"acc": self.acc(job["id"])})
        return httpx.Response(200, json=job)

    def lr(self, job_id: str) -> float:
        return float(self.submitted[int(job_id[:8], 16) - 1]["hyperparameters"]["lr"])

    def acc(self, job_id: str) -> float:
        return 1.0 - abs(self.lr(job_id) - 0.01)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_URL", "http://api.test")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_test")
    monkeypatch.delenv("TRAINYARD_BILLING_URL", raising=False)
    monkeypatch.delenv("TRAINYARD_REGISTRY_URL", raising=False)
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


def test_a_rate_limited_sweep_waits_as_long_as_the_server_asks(
    api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(cli_sweep.time, "sleep", slept.append)
    limited = {"left": 3}
    route = api.route

    def rate_limited(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and limited["left"]:
            limited["left"] -= 1
            return httpx.Response(
                429, headers={"Retry-After": "7"}, json={"detail": "slow down", "errors": []}
            )
        return route(request)

    monkeypatch.setattr(api, "route", rate_limited)
    assert cli.main([*GRID, "--metric", "acc"]) == 0
    assert len(api.submitted) == 6
    assert slept.count(7.0) == 3
    assert "429 slow down; trying again in 7 s" in capsys.readouterr().err


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


@pytest.mark.parametrize(
    "values", ["lr=1,1", "lr=0.1, 0.10", "opt=adam,sgd,adam", "x=true,yes,true"]
)
def test_a_grid_value_given_twice_is_a_usage_error_not_a_second_trial(
    api: FakeApi, capsys: pytest.CaptureFixture[str], values: str
) -> None:
    # `--grid lr=1,1` ran two identical trials: twice the GPUs for one result.
    with pytest.raises(SystemExit) as ended:
        cli.main(["sweep", "job.yaml", "--no-code", "--grid", values])
    assert ended.value.code == 2
    assert "twice" in capsys.readouterr().err and api.submitted == []


def test_grid_values_of_other_types_are_not_the_same_value(api: FakeApi) -> None:
    # 1, 1.0 and true compare equal in Python, not in a job's hyper-parameters.
    assert cli.main(["sweep", "job.yaml", "--no-code", "--grid", "lr=1,1.0,true"]) == 0
    assert len(api.submitted) == 3


def test_the_median_rule_stops_a_trial_worse_than_the_finished_ones(
    api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trials one at a time: the first three finish (acc 0.91, 1.0, 0.991); the fourth
    (lr=0.5, acc 0.51 at every step) is worse than their median by step 2 and is cancelled;
    the fifth (lr=0.011, acc 0.999) is not."""
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    api.polls = 4
    api.running_status = True
    argv = ["--json", "sweep", "job.yaml", "--no-code", "--grid", "lr=0.1,0.01,0.001,0.5,0.011"]
    code = cli.main([*argv, "--parallel", "1", "--metric", "acc", "--median-stop", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    by_trial = {t["trial"]: t for t in report["trials"]}
    assert [by_trial[i]["status"] for i in range(1, 6)] == [
        "SUCCEEDED",
        "SUCCEEDED",
        "SUCCEEDED",
        "CANCELLED",
        "SUCCEEDED",
    ]
    assert by_trial[4]["stopped_early"] == (
        "best 0.51 by step 2, worse than the median 0.991 of 3 finished trials by then"
    )
    assert by_trial[5]["stopped_early"] is None  # 0.999 is not worse than the median
    assert "trial 4: stopped early: acc best 0.51" in err


@pytest.mark.parametrize(
    ("extra", "message", "code"),
    [
        (["--median-stop", "2"], "--median-stop needs --metric", 2),
        (["--median-stop", "2", "--metric", "a//b"], "KEY: 'a//b' has an empty", 2),
        (["--median-stop", "2", "--metric", "acc"], "no registry URL", 7),
    ],
)
def test_the_median_rule_needs_a_metric_and_the_registry_before_anything_is_submitted(
    api: FakeApi, capsys: pytest.CaptureFixture[str], extra: list[str], message: str, code: int
) -> None:
    assert cli.main([*GRID, *extra]) == code
    assert message in capsys.readouterr().err
    assert api.submitted == []


def test_a_long_value_is_cut_in_the_table_and_notes_not_in_the_job(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    long = "a" * 500
    argv = ["sweep", "job.yaml", "--no-code", "--grid", "lr=0.01", "--grid", f"note={long}"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert api.submitted[0]["hyperparameters"]["note"] == long
    assert "a" * 39 + "…" in out and long not in out and long not in err
    assert "1 trial of digits" in err


def _control_characters(spec: dict[str, Any]) -> list[dict[str, str]]:
    """What the server says of a hyper-parameter value holding a control character."""
    return [
        {"field": f"hyperparameters.{key}", "message": "control character U+0001"}
        for key, value in spec["hyperparameters"].items()
        if isinstance(value, str) and "\x01" in value
    ]


@pytest.mark.parametrize("parallel", ["1", "3"])
def test_a_trial_the_server_would_refuse_stops_the_sweep_before_anything_is_submitted(
    parallel: str, api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the server refused in a later trial stopped the sweep there, with the trials
    before it submitted and running; run again, it stopped at the same trial. Every trial is
    checked first now (``?dry_run=true``), and nothing is submitted."""
    api.refuse = _control_characters
    argv = [*GRID[:3], "--grid", "lr=0.1,0.01", "--grid", "note=plain,b\x01c", "--parallel"]
    for _ in range(2):  # run again: still nothing submitted
        assert cli.main([*argv, parallel]) == 1
        out, err = capsys.readouterr()
        assert api.submitted == [] and api.jobs == {}, api.submitted
        assert err.splitlines()[1:] == [
            "trainyard: error: trial 2 of 4 (lr=0.1, note='b\\x01c') would be refused, so no "
            "trial was submitted:",
            "trainyard: error: --grid note: hyperparameters.note: control character U+0001",
        ], err
        assert out == ""
    assert [c["labels"]["sweep-trial"] for c in api.checked] == ["1", "1"]  # one good each run


def test_a_refusal_of_another_kind_says_nothing_was_submitted_in_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    def spent(request: httpx.Request) -> httpx.Response:
        detail = "the budget of team ml is spent (12.00 of 10.00 USD); its policy refuses jobs"
        return httpx.Response(409, json={"detail": detail, "errors": []})

    api.route = spent  # type: ignore[method-assign]
    assert cli.main([*GRID]) == 1
    _, err = capsys.readouterr()
    assert err.splitlines()[1:] == [
        "trainyard: error: trial 1 of 6 (lr=0.1, bs=32) would be refused, so no trial was "
        "submitted: 409 the budget of team ml is spent (12.00 of 10.00 USD); its policy refuses "
        "jobs"
    ], err
