"""A team's own project on the whole stack, every component a real process.

- Code that exists only in a temporary folder outside the repository, with a requirement
  the platform does not have, submitted with the ``trainyard`` CLI, succeeds; a second,
  identical submission reuses the cached environment.
- A job that exits 1 with ``max_restarts: 2`` runs three times, then fails with its
  classification and last log lines.
- The runner is killed with SIGKILL while a job that ignores SIGTERM trains: no job process
  survives it, the restarted runner resumes the job from its latest checkpoint, and the
  final weights equal those of an uninterrupted run of the same script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import RUNNER_NODE_ID, LocalStack
from trainyard_platform.services.runner.sandbox import leftover_processes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
CLI = Path(sys.executable).parent / "trainyard"

TRAIN = textwrap.dedent(
    '''
    """A deterministic job: the batch of each step depends only on (seed, step)."""
    import hashlib, os, signal, sys, time
    import torch
    from trainyard import sdk

    defaults = {"seed": 11, "steps": 60, "checkpoint_every": 10, "sleep": 0.0, "ignore_term": 0}
    ctx = sdk.init(defaults)
    hp = ctx.hyperparameters
    if int(hp["ignore_term"]):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job that will not stop politely
    torch.set_num_threads(1)
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    restored = ctx.restore_latest()
    if restored is not None:
        step, state = restored
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        print(f"resumed at step {step}", flush=True)
    while step < int(hp["steps"]):
        g = torch.Generator().manual_seed(ctx.seed * 100_003 + step)
        x = torch.randn(32, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        ctx.report_metrics(step, loss=loss.item())
        if step % int(hp["checkpoint_every"]) == 0:
            ctx.save_checkpoint(step, {"model": model.state_dict(), "optimizer": opt.state_dict()})
        time.sleep(float(hp["sleep"]))
    digest = hashlib.sha256(b"".join(
        t.detach().numpy().tobytes() for t in model.state_dict().values())).hexdigest()
    print(f"FINAL_WEIGHTS sha256={digest}", flush=True)
    ctx.save_checkpoint(step, {"model": model.state_dict(), "optimizer": opt.state_dict()})
    '''
)

WITH_REQUIREMENT = textwrap.dedent(
    """
    import tabulate
    from trainyard import sdk

    with sdk.init() as ctx:
        print(tabulate.tabulate([["team", "vision"]], tablefmt="plain"), flush=True)
        print("tabulate", tabulate.__version__, flush=True)
        for step in range(1, 1201):  # faster than the runner's 1 s batches: several of them
            ctx.report_metrics(step, loss=1.0 / step, accuracy=step / 1200)
        ctx.report_metrics(1201, loss=float("nan"), accuracy=float("inf"))
    """
)

CRASHES = textwrap.dedent(
    """
    import os, sys
    print("attempt", os.environ["TRAINYARD_ATTEMPT"], "starting", flush=True)
    print("ValueError: the data is not where I thought", file=sys.stderr, flush=True)
    sys.exit(1)
    """
)


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-user-"))
    restarts = {
        "TRAINYARD_SCHEDULER_RESTART_BACKOFF_SECONDS": "0.5",
        "TRAINYARD_SCHEDULER_RESTART_BACKOFF_MAX_SECONDS": "2",
    }
    try:
        with LocalStack(data, storage="file", extra_env=restarts) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def token(stack: LocalStack) -> str:
    return stack.bootstrap_admin("vision", "alice")


@pytest.fixture(scope="module")
def client(stack: LocalStack, token: str) -> TrainyardClient:
    return TrainyardClient(stack.submission_url, token)


@pytest.fixture
def project() -> Iterator[Path]:
    """A user's project folder, outside the repository."""
    folder = Path(tempfile.mkdtemp(prefix="my-project-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def write_project(folder: Path, files: dict[str, str], spec: dict[str, Any]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / ".gitignore").write_text("data/\n")
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "big.bin").write_bytes(b"\0" * 1024)  # ignored: never uploaded
    path = folder / "job.json"
    path.write_text(json.dumps({"gpus": 1, "gpu_flavor": "cpu", **spec}))
    return path


def cli(stack: LocalStack, token: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "TRAINYARD_URL": stack.submission_url, "TRAINYARD_TOKEN": token}
    done = subprocess.run(
        [str(CLI), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"trainyard {' '.join(args)}: {done.stderr}\n{done.stdout}"
    return done.stdout + done.stderr


def job_id_of(output: str) -> str:
    match = re.search(r"submitted job ([0-9a-f-]{36})", output)
    assert match, output
    return match.group(1)


def logs(client: TrainyardClient, job_id: str) -> str:
    text, cursor = [], ""
    while True:
        page = client.logs(job_id, after=cursor)
        text += [chunk["text"] for chunk in page["chunks"]]
        if not page["chunks"]:
            return "".join(text)
        cursor = page["cursor"]


def runner_log(stack: LocalStack) -> str:
    return stack.log_path("runner").read_text(errors="replace")


def ended_how(stack: LocalStack, view: dict[str, Any]) -> str:
    """What a failed assertion on a job's end shows: its history, failure and the logs."""
    shown = {k: view.get(k) for k in ("status", "history", "failure", "failed_attempts")}
    tails = {
        name: stack.log_path(name).read_text(errors="replace")[-4000:]
        for name in ("runner", "scheduler")
    }
    return f"{json.dumps(shown, indent=1, default=str)}\n" + "\n".join(
        f"--- {name} log (tail) ---\n{tail}" for name, tail in tails.items()
    )


def assert_every_point_arrived(stack: LocalStack, token: str, job_id: str) -> None:
    """Every point the job reported is in the registry, NaN and infinity included."""
    registry = httpx.Client(
        base_url=stack.service_urls["registry"],
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    deadline = time.monotonic() + 60
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        response = registry.get(f"/v1/jobs/{job_id}/metrics")
        if response.status_code == 200:
            counts = {m["key"]: m["count"] for m in response.json()["metrics"]}
            if counts.get("loss") == 1201 and counts.get("accuracy") == 1201:
                break
        time.sleep(0.5)
    assert counts.get("loss") == 1201 and counts.get("accuracy") == 1201, counts
    curve = registry.get(f"/v1/jobs/{job_id}/metrics/loss?max_points=5000").json()
    assert curve["downsampled"] is False
    assert [p["step"] for p in curve["points"]] == list(range(1, 1202))
    assert curve["points"][0]["value"] == 1.0 and curve["points"][-1]["value"] == "NaN"
    accuracy = registry.get(f"/v1/jobs/{job_id}/metrics").json()["metrics"]
    assert {m["key"]: m["last"] for m in accuracy}["accuracy"] == "Infinity"


def test_a_project_outside_the_repository_with_its_own_requirement_runs(
    stack: LocalStack, token: str, client: TrainyardClient, project: Path
) -> None:
    spec_path = write_project(
        project,
        {"report.py": WITH_REQUIREMENT},
        {"name": "with-req", "entrypoint": "report.py", "requirements": ["tabulate==0.9.0"]},
    )
    first = job_id_of(cli(stack, token, "submit", str(spec_path), "--follow", timeout=400))
    view = client.get_job(first)
    assert view["status"] == "SUCCEEDED", ended_how(stack, view)
    output = logs(client, first)
    assert "tabulate 0.9.0" in output and "team  vision" in output
    assert_every_point_arrived(stack, token, first)

    second_out = cli(stack, token, "submit", str(spec_path), "--follow", timeout=400)
    assert "already stored" in second_out, "an identical bundle is uploaded once"
    second = job_id_of(second_out)
    assert client.get_job(second)["status"] == "SUCCEEDED"
    environments = re.findall(
        r"job (\S+): environment (\w+) \(1 requirements\) (\w+)", runner_log(stack)
    )
    by_job = {job: (key, how) for job, key, how in environments}
    assert by_job[first][1] == "built" and by_job[second] == (by_job[first][0], "cached")


def test_a_crashing_job_runs_max_restarts_plus_one_times_then_fails(
    stack: LocalStack, token: str, client: TrainyardClient, project: Path
) -> None:
    spec_path = write_project(
        project,
        {"crash.py": CRASHES},
        {"name": "crashes", "entrypoint": "crash.py", "max_restarts": 2},
    )
    job_id = job_id_of(cli(stack, token, "submit", str(spec_path)))
    view = client.wait(job_id, timeout_s=180)
    assert view["status"] == "FAILED", view
    failure = view["failure"]
    assert failure["failure_kind"] == "user_error", failure
    assert "ValueError: the data is not where I thought" in failure["log_tail"]
    assert "3 attempts" in failure["reason"], failure
    output = logs(client, job_id)
    assert [f"attempt {n} starting" in output for n in (0, 1, 2)] == [True] * 3, output


def test_a_runner_killed_mid_training_leaves_no_process_and_the_job_resumes_exactly(
    stack: LocalStack, token: str, client: TrainyardClient, project: Path
) -> None:
    hyper = {"steps": 60, "checkpoint_every": 10, "sleep": 0.15, "ignore_term": 1}
    spec_path = write_project(
        project,
        {"train.py": TRAIN},
        {"name": "stubborn", "entrypoint": "train.py", "seed": 11, "hyperparameters": hyper},
    )
    # The reference: the same script, uninterrupted, outside the platform.
    bare = subprocess.run(
        [sys.executable, "train.py"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    shutil.rmtree(project / ".trainyard", ignore_errors=True)
    [reference] = re.findall(r"FINAL_WEIGHTS sha256=(\w+)", bare.stdout)
    job_id = job_id_of(cli(stack, token, "submit", str(spec_path)))

    deadline = time.monotonic() + 120
    while not client.get_job(job_id)["checkpoints"]:
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.5)
    node = httpx.get(
        f"{stack.service_urls['runner']}/v1/node",
        headers={"Authorization": f"Bearer {stack.admin_token}"},
    ).json()
    uids = range(node["job_uids"]["first"], node["job_uids"]["last"] + 1)
    assert leftover_processes(uids, []), "the job runs as a job user"
    stack.kill_service("runner")
    deadline = time.monotonic() + 10
    while leftover_processes(uids, []):
        assert time.monotonic() < deadline, "a job process outlived its runner"
        time.sleep(0.2)

    stack.start_service("runner")
    view = client.wait(job_id, timeout_s=240)
    assert view["status"] == "SUCCEEDED", ended_how(stack, view)
    output = logs(client, job_id)
    assert re.search(r"resumed at step [1-9]\d*", output), output
    [final] = re.findall(r"FINAL_WEIGHTS sha256=(\w+)", output)
    assert final == reference


SLEEPS = textwrap.dedent(
    """
    import time
    print("working", flush=True)
    time.sleep(300)
    """
)


def test_every_view_counts_a_jobs_attempts_alike_and_a_cancel_is_no_preemption(
    stack: LocalStack, token: str, client: TrainyardClient, project: Path
) -> None:
    # What each view says of a job's life, across the services. Attempts are counted from 1
    # in every text (the API's attempt is the 0-based index): the history said "attempt 0
    # on ..." and "attempt 0 failed" beside the scheduler's "attempt 1 failed (...)",
    # describe "attempt 0 on ...", logs "==> a0000-..."; the restart read PREEMPTED, and so
    # did the stop of a cancelled job.
    spec_path = write_project(
        project,
        {"crash.py": CRASHES},
        {"name": "crashes-twice", "entrypoint": "crash.py", "max_restarts": 1},
    )
    job_id = job_id_of(cli(stack, token, "submit", str(spec_path)))
    view = client.wait(job_id, timeout_s=180)
    assert view["status"] == "FAILED", ended_how(stack, view)
    assert (view["attempt"], view["failure"]["attempt"]) == (1, 1)  # indices: the second
    reasons = [h["reason"] or "" for h in view["history"]]
    placed = [r for r in reasons if r.startswith("attempt ") and " on " in r]
    assert [r.split(" on ")[0] for r in placed] == ["attempt 1", "attempt 2"], reasons
    assert any(r.startswith("attempt 1 failed: user_error") for r in reasons), reasons
    assert any(r.startswith("attempt 1 failed (user_error") for r in reasons), reasons
    assert any(r.startswith("attempt 2 failed: user_error") for r in reasons), reasons
    assert "max restarts (1) reached after 2 attempts" in view["failure"]["reason"]
    # Restarted after its failure, it waited QUEUED; nothing preempted it.
    assert "PREEMPTED" not in [h["status"] for h in view["history"]], reasons
    assert f"FAILED (attempt 2 on {RUNNER_NODE_ID}" in cli(stack, token, "describe", job_id)
    shown = cli(stack, token, "logs", job_id)
    assert f"==> attempt 1 on {RUNNER_NODE_ID} <==" in shown
    assert f"==> attempt 2 on {RUNNER_NODE_ID} <==" in shown
    # The job's own variable keeps the index (docs/job-spec.md).
    assert "attempt 0 starting" in shown and "attempt 1 starting" in shown

    # A running job its user cancels ends CANCELLED, and was never PREEMPTED.
    spec_path = write_project(
        project, {"sleeps.py": SLEEPS}, {"name": "sleeps", "entrypoint": "sleeps.py"}
    )
    job_id = job_id_of(cli(stack, token, "submit", str(spec_path)))
    deadline = time.monotonic() + 120
    while client.get_job(job_id)["status"] != "RUNNING":
        assert time.monotonic() < deadline, "not running within 120 s"
        time.sleep(0.5)
    cli(stack, token, "cancel", job_id)
    view = client.wait(job_id, timeout_s=120)
    assert view["status"] == "CANCELLED", ended_how(stack, view)
    statuses = [h["status"] for h in view["history"]]
    assert "PREEMPTED" not in statuses and statuses[-2:] == ["RUNNING", "CANCELLED"], statuses
