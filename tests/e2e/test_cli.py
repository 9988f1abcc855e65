"""The ``trainyard`` command line against the whole local stack, as a user types it.

Tables and ``--json``, exit codes (0 succeeded, 10 failed, 11 cancelled, 3 not found, 1 bad
input), job ids by unique prefix, ``login`` and contexts, ``rerun``, a ``sweep`` resumed by
running it again, ``queue`` with the
reason a job waits, a reader that closes the pipe early, and bad spec files: each problem
named by its line and field, an unknown field with the close name. Operators: ``nodes``
(cordon), and ``admin`` (a cohort and a queue with a quota, defined, listed, deleted). Team
admins: ``budget`` (a project's budget set, listed, changed, refused, removed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = pytest.mark.e2e

CLI = Path(sys.executable).parent / "trainyard"

TRAIN = textwrap.dedent(
    """
    import sys, time
    from trainyard import sdk

    ctx = sdk.init({"steps": 5, "sleep": 0.0, "fail": 0, "spam": 0})
    hp = ctx.hyperparameters
    for step in range(1, int(hp["steps"]) + 1):
        if ctx.should_stop():  # cancelled: stop now, not at the SIGKILL after the grace
            ctx.exit_preempted()
        ctx.report_metrics(step, loss=1.0 / step)
        print(f"step {step}", flush=True)
        time.sleep(float(hp["sleep"]))
    if int(hp["spam"]):
        sys.stdout.write(("x" * 99 + "\\n") * int(hp["spam"]))
        sys.stdout.flush()
    sys.exit(3 if int(hp["fail"]) else 0)
    """
)

SPEC = textwrap.dedent(
    """\
    # yaml-language-server: $schema=job.v1.json
    apiVersion: trainyard.dev/v1
    kind: Job
    name: cli-e2e
    project: cli
    experiment: cli-e2e
    labels: {suite: e2e}
    entrypoint: train.py
    gpus: 1
    gpu_flavor: cpu
    max_restarts: 0
    max_runtime_seconds: 600
    hyperparameters:
      steps: 3
      lr: 1e-3
    """
)


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-cli-"))
    try:
        # Job uids of its own: another stack on this host (the browser tests') may be up.
        own_uids = {"TRAINYARD_RUNNER_JOB_UID_BASE": "264128"}
        with LocalStack(data, storage="file", extra_env=own_uids) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def project() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="cli-project-"))
    (folder / "train.py").write_text(TRAIN)
    (folder / "job.yaml").write_text(SPEC)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def env(stack: LocalStack, project: Path) -> dict[str, str]:
    token = stack.bootstrap_admin("cli-team", "carol")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "TRAINYARD_URL": stack.submission_url,
        "TRAINYARD_TOKEN": token,
        "TRAINYARD_CONFIG": str(project / "config" / "config.json"),
        "TRAINYARD_REGISTRY_URL": stack.service_urls["registry"],
        "TRAINYARD_BILLING_URL": stack.service_urls["billing"],
    }


def run(
    env: dict[str, str], *args: str, code: int = 0, timeout: float = 300, stdout_only: bool = False
) -> str:
    done = subprocess.run(
        [str(CLI), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == code, f"trainyard {' '.join(args)}: {done.stderr}\n{done.stdout}"
    assert "Traceback" not in done.stderr
    # A --json answer is stdout alone: a show's ``etag:`` line goes to stderr.
    return done.stdout if stdout_only else done.stdout + done.stderr


def submitted(output: str) -> str:
    match = re.search(r"submitted job ([0-9a-f-]{36})", output)
    assert match, output
    return match.group(1)


@pytest.fixture(scope="module")
def succeeded(env: dict[str, str], project: Path) -> str:
    job_id = submitted(run(env, "submit", str(project / "job.yaml"), "--name", "ok"))
    assert "SUCCEEDED" in run(env, "wait", job_id[:8], timeout=400)
    return job_id


def test_bad_spec_files_name_the_line_and_field(env: dict[str, str], project: Path) -> None:
    bad = project / "bad.yaml"
    bad.write_text(SPEC.replace("  steps: 3\n", "  steps: 3\n   lr: 2\n"))
    err = run(env, "submit", str(bad), code=1)
    assert (
        f"{bad}:15:6: lr: invalid YAML" in err
        and "lr: invalid YAML: mapping values are not allowed" in err
    )
    bad.write_text(
        SPEC.replace("hyperparameters:", "hyperparameter:").replace("gpus: 1", "gpus: 0")
    )
    lines = run(env, "submit", str(bad), code=1).strip().splitlines()
    assert lines == [
        f"trainyard: error: {bad}:9:7: gpus: must be at least 1",
        f"trainyard: error: {bad}:13:1: hyperparameter: unknown field 'hyperparameter': "
        "did you mean 'hyperparameters'?",
    ]
    bad.write_text(SPEC.replace("entrypoint: train.py", "entrypoint: ../up.py"))
    err = run(env, "submit", str(bad), code=1)  # a rule only the API checks, on its line
    assert f"{bad}:8:13: entrypoint: a script path must not contain '..'" in err


def test_a_job_submitted_from_yaml_is_listed_described_and_followed(
    env: dict[str, str], succeeded: str
) -> None:
    short = succeeded[:8]
    table = run(env, "ls").splitlines()
    assert table[0].split() == [
        "ID", "NAME", "USER", "STATUS", "REASON", "GPUS", "SUBMITTED", "DURATION", "COST"
    ]  # fmt: skip
    row = next(line for line in table if line.startswith(short))
    assert row.split()[1:4] == ["ok", "carol", "SUCCEEDED"]
    listed = json.loads(run(env, "ls", "--json", stdout_only=True))
    assert succeeded in [job["id"] for job in listed]
    in_project = json.loads(
        run(env, "ls", "--project", "cli", "--mine", "--json", stdout_only=True)
    )
    assert succeeded in [job["id"] for job in in_project]
    assert {(j["project"], j["user"]) for j in in_project} == {("cli", "carol")}
    assert json.loads(run(env, "ls", "--project", "elsewhere", "--json", stdout_only=True)) == []
    assert json.loads(run(env, "get", short, "--json", stdout_only=True))["id"] == succeeded
    described = run(env, "describe", short)
    assert "project     cli" in described and "experiment  cli-e2e" in described
    assert "labels      suite=e2e" in described
    spec = json.loads(run(env, "describe", short, "--json", stdout_only=True))["spec"]
    assert spec["hyperparameters"] == {"steps": 3, "lr": 0.001}
    assert "step 3" in run(env, "logs", short)
    assert "SUCCEEDED" in run(env, "attach", short)
    assert json.loads(run(env, "wait", short, "--json", stdout_only=True))["status"] == "SUCCEEDED"


def eventually(check: Callable[[], str | None], timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None or time.monotonic() > deadline:
            assert found is not None, "never came"
            return found
        time.sleep(1)


def test_metrics_experiments_and_compare(env: dict[str, str], succeeded: str) -> None:
    short = succeeded[:8]

    def metrics() -> str | None:
        out = run(env, "metrics", short)
        return out if "loss" in out else None

    table = eventually(metrics).splitlines()
    assert table[0].split() == ["KEY", "POINTS", "STEPS", "LAST", "BEST", "MIN", "MAX"]
    assert table[1].split()[:4] == ["loss", "3", "1..3", "0.3333"]
    curve = run(env, "metrics", short, "loss").splitlines()
    assert curve[0].startswith("loss  █") and curve[1].startswith("steps 1..3, 3 points")
    points = json.loads(run(env, "metrics", short, "loss", "--json", stdout_only=True))["points"]
    assert [p["step"] for p in points] == [1, 2, 3]
    assert "cli-e2e" in run(env, "experiments", "--project", "cli")
    runs = run(env, "experiments", "cli-e2e")
    assert short in runs and "LOSS" in runs.splitlines()[0]
    compared = run(env, "compare", "cli-e2e", "--keys", "loss")
    assert "final loss" in compared and short in compared
    run(env, "experiments", "no-such-experiment", code=3)
    assert f"{short} tags: baseline best" in run(env, "tag", short, "best", "baseline")
    assert f"{short} tags: baseline" in run(env, "tag", short, "best", "--rm")
    assert f"{short} note: first try" in run(env, "note", short, "first try")
    (row,) = json.loads(run(env, "experiments", "cli-e2e", "--json", stdout_only=True))["runs"][:1]
    assert (row["tags"], row["note"]) == (["baseline"], "first try")

    def cost() -> str | None:
        out = run(env, "cost")
        return out if "GPU-HOURS" in out else None

    assert "USER" in eventually(cost)


def test_exit_codes_say_how_a_job_ended(env: dict[str, str], project: Path) -> None:
    spec = str(project / "job.yaml")
    failing = submitted(run(env, "submit", spec, "--name", "crash", "--set", "fail=1"))
    err = run(env, "wait", failing, code=10, timeout=400)
    assert f"job {failing} ended FAILED" in err
    slow_args = ("--name", "slow", "--set", "steps=600", "--set", "sleep=0.5")
    slow = submitted(run(env, "submit", spec, *slow_args))
    said = run(env, "cancel", slow[:10])  # waiting, or already running
    assert said.startswith((f"job {slow} is cancelled before it starts", "cancellation requested"))
    run(env, "wait", slow[:10], code=11, timeout=300)
    run(env, "describe", "0123abcd", code=3)
    run(env, "describe", "not-a-job", code=3)
    run(env, "ls", "--status", "sleeping", code=2)


def test_rerun_submits_the_same_spec_again(env: dict[str, str], succeeded: str) -> None:
    again = submitted(run(env, "rerun", succeeded[:8], "--set", "steps=2"))
    assert again != succeeded
    view = json.loads(run(env, "wait", again, "--json", timeout=400, stdout_only=True))
    assert view["status"] == "SUCCEEDED"
    assert view["spec"]["labels"] == {"suite": "e2e", "trainyard.dev/rerun-of": succeeded}
    assert view["spec"]["hyperparameters"]["steps"] == 2
    assert (
        view["spec"]["code"]
        == json.loads(run(env, "get", succeeded, "--json", stdout_only=True))["spec"]["code"]
    )


def test_a_sweep_runs_one_job_per_trial_and_ranks_them(env: dict[str, str], project: Path) -> None:
    # A trial the server would refuse (a control character in its value) stops the sweep
    # before any trial is submitted (the server's dry run checks each first).
    refused = (str(project / "job.yaml"), "--grid", "note=fine,b\x01c", "--experiment", "cli-bad")
    said = run(env, "sweep", *refused, code=1)
    assert "trial 2 of 2 (note='b\\x01c') would be refused, so no trial was submitted" in said
    assert "--grid note: hyperparameters.note: " in said
    assert json.loads(run(env, "ls", "--experiment", "cli-bad", "--json", stdout_only=True)) == []
    sweep = (str(project / "job.yaml"), "--grid", "steps=2,4", "--experiment", "cli-sweep")
    done = subprocess.run(
        [str(CLI), "--json", "sweep", *sweep, "--metric", "loss", "--goal", "min"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "trial 2: SUCCEEDED, loss=0.25" in done.stderr  # progress goes to stderr
    report = json.loads(done.stdout)
    assert [t["status"] for t in report["trials"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert report["best"]["hyperparameters"] == {"steps": 4}
    assert report["best"]["metric"] == pytest.approx(0.25)
    trials = json.loads(
        run(env, "ls", "--label", f"sweep={report['sweep']}", "--json", stdout_only=True)
    )
    assert sorted(t["id"] for t in trials) == sorted(t["job_id"] for t in report["trials"])

    def runs() -> str | None:
        found = json.loads(
            run(env, "experiments", "cli-sweep", "--project", "cli", "--json", stdout_only=True)
        )
        ids = sorted(r["job_id"] for r in found["runs"])
        return " ".join(ids) if len(ids) == 2 else None

    assert eventually(runs) == " ".join(sorted(t["id"] for t in trials))  # one experiment
    again = run(env, "sweep", *sweep, "--metric", "loss", "--goal", "min")
    assert f"best: trial 2, job {report['best']['job_id'][:8]}: loss=0.25 (steps=4)" in again
    assert (
        len(
            json.loads(
                run(env, "ls", "--label", f"sweep={report['sweep']}", "--json", stdout_only=True)
            )
        )
        == 2
    )


def test_nodes_are_listed_and_cordoned_by_an_operator_only(
    env: dict[str, str], stack: LocalStack
) -> None:
    scheduler = {**env, "TRAINYARD_SCHEDULER_URL": stack.service_urls["scheduler"]}
    operator = {
        **scheduler,
        "TRAINYARD_TOKEN": stack.bootstrap_admin("ops", "olga", role="operator"),
    }
    first = json.loads(run(operator, "--json", "nodes", "ls", stdout_only=True))[0]
    node = first["node_id"]
    assert first["status"] == "READY" and first["cordon"] is None
    try:
        said = run(operator, "nodes", "cordon", node, "--reason", "e2e: replacing a fan")
        assert said.startswith(f"cordoned {node}: by ") and "replacing a fan" in said, said
        row = next(line for line in run(operator, "nodes", "ls").splitlines() if node in line)
        assert " cordoned " in row and row.endswith(": e2e: replacing a fan"), row
    finally:
        assert run(operator, "nodes", "uncordon", node).startswith(f"uncordoned {node}")
    after = json.loads(run(operator, "--json", "nodes", "ls", stdout_only=True))
    assert [n["cordon"] for n in after if n["node_id"] == node] == [None]
    assert "scheduler: 403 " in run(scheduler, "nodes", "ls", code=4)  # a team's admin
    assert "scheduler: 404 " in run(operator, "nodes", "uncordon", "no-such-node", code=3)


def test_an_operator_defines_a_cohort_and_a_queue_with_a_quota(
    env: dict[str, str], stack: LocalStack
) -> None:
    """``trainyard admin``, the scheduler's real answers: a queue with a quota in a cohort,
    listed, the cohort's delete refused while the queue is in it (409), a team's admin
    refused (403), then both deleted. The queue is the operator's own team's (``gov``), whose
    no job runs here."""
    scheduler = {**env, "TRAINYARD_SCHEDULER_URL": stack.service_urls["scheduler"]}
    operator = {
        **scheduler,
        "TRAINYARD_TOKEN": stack.bootstrap_admin("gov", "gail", role="operator"),
    }
    assert run(operator, "admin", "cohorts", "set", "e2e-research").startswith(
        "created cohort e2e-research"
    )
    try:
        said = run(
            operator,
            *("admin", "queues", "set", "e2e-ops", "--team", "gov", "--cohort", "e2e-research"),
            *("--quota", "cpu=1", "--borrow", "cpu=2"),
        )
        assert said.startswith("created queue e2e-ops"), said
        row = next(
            line
            for line in run(operator, "admin", "queues", "ls").splitlines()
            if "e2e-ops" in line
        )
        assert row.split() == ["e2e-ops", "gov", "e2e-research", "1", "cpu=1", "(borrow", "2)"]
        # A set of an existing queue changes only what it names (a PATCH).
        said = run(operator, "admin", "queues", "set", "e2e-ops", "--weight", "3")
        assert said.splitlines()[2].split() == [
            *("e2e-ops", "gov", "e2e-research", "3", "cpu=1", "(borrow", "2)")
        ], said
        refused = run(operator, "admin", "cohorts", "rm", "e2e-research", code=1)
        assert "scheduler: 409 cohort e2e-research is in use by queues e2e-ops" in refused
        assert "scheduler: 403 " in run(scheduler, "admin", "cohorts", "rm", "e2e-research", code=4)
        unknown = run(operator, "admin", "queues", "set", "e2e-ops", "--team", "gov", "--quota",
                      "nope=1", code=1)  # fmt: skip
        assert "scheduler: 422 " in unknown and "quotas.nope: unknown flavor nope" in unknown
    finally:
        assert run(operator, "admin", "queues", "rm", "e2e-ops") == "removed queue e2e-ops\n"
        assert run(operator, "admin", "cohorts", "rm", "e2e-research").startswith("removed")
    prices = run(operator, "admin", "prices", "ls", "--flavor", "cpu").splitlines()
    assert prices[1].split()[0] == "cpu" and " GPU-hour " in prices[1], prices  # from billing


def test_a_team_admin_sets_lists_changes_and_removes_a_budget(env: dict[str, str]) -> None:
    """``trainyard budget``, billing's real answers: a project budget created, listed with
    what is spent this month, changed in one field (the others kept), refused with billing's
    422 naming the field, removed. The project is one no job of this module runs in."""
    scope = ("cli-team", "--project", "budget-e2e")
    said = run(env, "budget", "set", *scope, "--amount", "1e3", "--on-exhausted", "stop")
    assert said.startswith("created budget of project cli-team/budget-e2e\n"), said
    try:
        mine = [
            b
            for b in json.loads(run(env, "--json", "budget", "ls", stdout_only=True))
            if b["project"]
        ]
        assert [
            (b["team"], b["project"], Decimal(b["amount"]), b["policy"], b["on_exhausted"])
            for b in mine
        ] == [("cli-team", "budget-e2e", Decimal(1000), "warn", "stop")]
        assert (Decimal(mine[0]["spent"]), mine[0]["exhausted"]) == (0, False)
        row = next(line for line in run(env, "budget", "ls").splitlines() if "budget-e2e" in line)
        assert row.split() == [
            *("cli-team", "budget-e2e", mine[0]["month"], "1000.000000", mine[0]["currency"]),
            *("0.000000", "0.00%", "ok", "warn", "stop"),
        ], row
        # A set of a budget that exists changes only what it names.
        run(env, "budget", "set", *scope, "--policy", "refuse", "--thresholds", "50,90")
        shown = json.loads(run(env, "budget", "show", *scope, "--json", stdout_only=True))
        assert (Decimal(shown["amount"]), shown["policy"], shown["on_exhausted"]) == (
            Decimal(1000),
            "refuse",
            "stop",
        )
        assert shown["thresholds"] == [50, 90]
        zero = run(env, "budget", "set", *scope, "--amount", "0", code=1)
        assert zero.startswith("trainyard: error: billing: 422 invalid request (amount: "), zero
        twice = run(env, "budget", "set", *scope, "--thresholds", "50,50", code=1)
        assert "billing: 422 invalid request (thresholds: each threshold at most once)" in twice
        new = run(env, "budget", "set", "cli-team", "--project", "e2e-none", "--policy", "refuse",
                  code=1)  # fmt: skip
        assert "billing: 422 invalid request (amount: field required)" in new, new
    finally:
        removed = run(env, "budget", "rm", *scope)
        assert removed == "removed budget of project cli-team/budget-e2e\n"
    gone = run(env, "budget", "show", *scope, code=3)
    assert gone.startswith("trainyard: error: billing: 404 "), gone


def test_queue_shows_why_a_job_waits(env: dict[str, str], project: Path) -> None:
    both = project / "both.yaml"
    both.write_text(SPEC.replace("gpus: 1", "gpus: 2"))  # every GPU of the runner
    slow = ("--set", "steps=600", "--set", "sleep=0.5")
    holder = submitted(run(env, "submit", str(both), "--name", "holder", *slow))
    waiting = submitted(run(env, "submit", str(project / "job.yaml"), "--name", "waits", *slow))
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            listed = json.loads(run(env, "queue", "--json", stdout_only=True))
            mine = [v for v in listed if v["id"] == waiting]
            if mine and mine[0]["status"] == "PENDING" and mine[0]["pending"]["reason"]:
                break
            time.sleep(1)
        else:
            pytest.fail(f"job {waiting} never waited with a reason: {listed}")
        table = run(env, "queue").splitlines()
        assert table[0].split()[:3] == ["POS", "ID", "NAME"]
        row = next(line for line in table if waiting[:8] in line)
        assert mine[0]["pending"]["reason"][:20] in row
        listing = run(env, "ls", "--status", "pending")
        row = next(line for line in listing.splitlines() if line.startswith(waiting[:8]))
        assert " ".join(mine[0]["pending"]["reason"].split())[:20] in row  # the REASON column
    finally:
        run(env, "cancel", holder, waiting)


def test_a_reader_that_closes_the_pipe_early(env: dict[str, str], project: Path) -> None:
    spec = str(project / "job.yaml")
    chatty = submitted(run(env, "submit", spec, "--name", "chatty", "--set", "spam=20000"))
    run(env, "wait", chatty, timeout=400)
    for command in (f"logs {chatty}", "ls"):
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", f"{CLI} {command} | head -1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        for bad in ("Error", "Traceback", "unexpected", "error:"):
            assert bad not in done.stderr, done.stderr
        assert len(done.stdout.splitlines()) == 1


def test_login_stores_a_private_context(env: dict[str, str], stack: LocalStack) -> None:
    bare = {k: v for k, v in env.items() if k not in ("TRAINYARD_URL", "TRAINYARD_TOKEN")}
    assert "no contexts" in run(bare, "context", "ls")
    run(bare, "ls", code=7)  # no token anywhere: not configured
    done = subprocess.run(
        [str(CLI), "login", stack.submission_url, "--token-stdin", "--name", "local"],
        env=bare,
        input=env["TRAINYARD_TOKEN"] + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "as cli-team/carol (context 'local'" in done.stdout
    config = Path(env["TRAINYARD_CONFIG"])
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert "ID" in run(bare, "ls")
    assert run(bare, "context", "ls").splitlines()[1].split()[:2] == ["*", "local"]
