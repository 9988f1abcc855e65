"""``trainyard model``, ``dataset``, ``lineage`` and ``cost`` against the whole local stack
(one stack for the module, a local object store: downloads go through the registry's
``content`` route with the caller's token).

A dataset is registered and granted, a job reads it and commits a checkpoint, the checkpoint
becomes a model version; aliases move and their history shows; a download is verified and
leaves no file when the reference is wrong; lineage is printed both ways; costs are read
from billing as a table, as JSON, as CSV and per job, and a version's cost (from billing's
events, through the registry) equals its job's bill; a grant opens a model to another team
(and ``model ls`` lists it there, marked granted) and a revoke closes it; malformed references are refused before any call (exit 2), unknown
things answer 3, server-refused input names its field.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
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
TEAM = "models-team"

TRAIN = textwrap.dedent(
    """
    import torch
    from trainyard import sdk

    ctx = sdk.init()
    model = torch.nn.Linear(4, 1)
    for step in range(1, 4):
        ctx.report_metrics(step, loss=1.0 / step)
    ctx.save_checkpoint(3, {"model": model.state_dict()})
    """
)

SPEC = textwrap.dedent(
    f"""\
    apiVersion: trainyard.dev/v1
    kind: Job
    name: linear
    project: lineage
    entrypoint: train.py
    gpus: 1
    gpu_flavor: cpu
    max_restarts: 0
    max_runtime_seconds: 600
    datasets: ["{TEAM}/digits:1"]
    """
)


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-models-"))
    try:
        # Job uids of its own: other stacks on this host (test_cli's, the browser's) may be up.
        own_uids = {"TRAINYARD_RUNNER_JOB_UID_BASE": "272128"}
        with LocalStack(data, storage="file", extra_env=own_uids) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cli-models-"))
    (path / "train.py").write_text(TRAIN)
    (path / "job.yaml").write_text(SPEC)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def env(stack: LocalStack, folder: Path) -> dict[str, str]:
    token = stack.bootstrap_admin(TEAM, "maria")
    stack.bootstrap_admin("grantee-team", "gina")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "TRAINYARD_URL": stack.submission_url,
        "TRAINYARD_TOKEN": token,
        "TRAINYARD_CONFIG": str(folder / "config.json"),
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


def eventually(check: Callable[[], str | None], timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(1)


@pytest.fixture(scope="module")
def job(env: dict[str, str], folder: Path) -> str:
    """A succeeded job that read ``digits:1`` and committed one checkpoint."""
    sha = hashlib.sha256(b"digits").hexdigest()
    registered = run(
        env,
        "dataset",
        "register",
        f"{TEAM}/digits",
        "--uri",
        "s3://data/digits.parquet",
        "--sha256",
        sha,
        "--size",
        "6",
        "--feature-version",
        "git:abc",
    )
    assert f"registered {TEAM}/digits:1" in registered
    out = run(env, "submit", str(folder / "job.yaml"))
    match = re.search(r"submitted job ([0-9a-f-]{36})", out)
    assert match, out
    assert "SUCCEEDED" in run(env, "wait", match.group(1), timeout=400)
    return match.group(1)


@pytest.fixture(scope="module")
def version(env: dict[str, str], job: str) -> dict[str, object]:
    answer: dict[str, object] = json.loads(
        run(
            env,
            "model",
            "register",
            f"{TEAM}/linear",
            "--job",
            job[:8],
            "--tag",
            "baseline",
            "--description",
            "first",
            "--json",
        )
    )
    return answer


def test_models_are_registered_listed_and_shown(
    env: dict[str, str], job: str, version: dict[str, object]
) -> None:
    assert (version["version"], version["tags"], version["job_id"]) == (1, ["baseline"], job)
    listed = run(env, "model", "ls").splitlines()
    header = ["MODEL", "PROJECT", "VERSIONS", "LATEST", "ALIASES", "CREATED", "ACCESS"]
    assert listed[0].split() == header
    assert listed[1].split()[:4] == [f"{TEAM}/linear", "lineage", "1", "1"]
    assert listed[1].split()[-1] == "-"  # the team's own
    assert "cost" in version  # the registration answers the version as GET does
    assert run(env, "model", "ls", "--project", "elsewhere").startswith(
        "no models match --project elsewhere"
    )
    shown = run(env, "model", "show", f"{TEAM}/linear")
    assert "VERSION  ALIASES  JOB" in shown and job[:8] in shown
    one = run(env, "model", "show", f"{TEAM}/linear:1")
    assert "tags:        baseline" in one and "description: first" in one
    run(env, "model", "show", f"{TEAM}/nothing", code=3)
    run(env, "model", "show", f"{TEAM}/linear:7", code=3)


def test_aliases_move_and_keep_their_history(
    env: dict[str, str], job: str, version: dict[str, object]
) -> None:
    second = json.loads(
        run(env, "model", "register", f"{TEAM}/linear", "--job", job, "--json", stdout_only=True)
    )
    assert second["version"] == 2
    assert "-> version 1 (new)" in run(env, "model", "alias", "set", f"{TEAM}/linear", "prod", "1")
    assert "-> version 2 (was 1)" in run(
        env, "model", "alias", "set", f"{TEAM}/linear", "prod", "2"
    )
    assert "prod" in run(env, "model", "show", f"{TEAM}/linear@prod")
    # A version an alias points at cannot go: the server's reason names the alias.
    assert "prod" in run(env, "model", "rm", f"{TEAM}/linear", "2", code=1)
    assert "was version 2" in run(env, "model", "alias", "rm", f"{TEAM}/linear", "prod")
    moves = run(env, "model", "alias", "history", f"{TEAM}/linear", "prod").splitlines()
    assert moves[0].split() == ["AT", "FROM", "TO", "BY"]
    assert [m.split()[-3:] for m in moves[1:]] == [
        ["-", "1", f"{TEAM}/maria"],
        ["1", "2", f"{TEAM}/maria"],
        ["2", "(deleted)", f"{TEAM}/maria"],
    ]
    assert "freed 1 objects" in run(env, "model", "rm", f"{TEAM}/linear", "2")
    run(env, "model", "show", f"{TEAM}/linear:2", code=3)


def test_a_download_is_verified_and_never_partial(
    env: dict[str, str], folder: Path, version: dict[str, object]
) -> None:
    out = folder / "model.pt"
    said = run(env, "model", "download", f"{TEAM}/linear:1", "-o", str(out))
    assert "sha256 verified" in said
    artifact = version["artifact"]
    assert isinstance(artifact, dict)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == artifact["sha256"]
    latest = folder / "latest.pt"
    run(env, "model", "download", f"{TEAM}/linear", "-o", str(latest))
    assert latest.read_bytes() == out.read_bytes()
    missing = folder / "missing.pt"
    run(env, "model", "download", f"{TEAM}/linear:9", "-o", str(missing), code=3)
    run(env, "model", "download", f"{TEAM}/linear@nobody", "-o", str(missing), code=3)
    assert not missing.exists()
    assert [p.name for p in folder.iterdir() if p.name.endswith(".part")] == []


def test_malformed_references_are_refused_locally(env: dict[str, str]) -> None:
    assert "TEAM/NAME" in run(env, "model", "show", "linear", code=2)
    assert "version must be 1 or more" in run(env, "model", "show", f"{TEAM}/x:0", code=2)
    assert "names no version" in run(env, "lineage", "up", f"{TEAM}/linear", code=2)
    assert "argument ALIAS" in run(env, "model", "alias", "set", f"{TEAM}/x", "Prod", "1", code=2)
    assert "argument --by" in run(env, "cost", "--by", "team,colour", code=2)
    # What only the server can check comes back with its field and reason.
    refused = run(env, "model", "register", f"{TEAM}/linear", "--job", "x" * 300, code=1)
    assert "job_id" in refused


def test_datasets_grants_and_lineage(env: dict[str, str], job: str, version: object) -> None:
    assert f"{TEAM}/digits" in run(env, "dataset", "ls")
    assert "read by: its team only" in run(env, "dataset", "show", f"{TEAM}/digits")
    assert "grantee-team may read" in run(env, "dataset", "grant", f"{TEAM}/digits", "grantee-team")
    assert "read by: grantee-team" in run(env, "dataset", "show", f"{TEAM}/digits")
    assert "may not read" in run(env, "dataset", "revoke", f"{TEAM}/digits", "grantee-team")
    assert "features:  git:abc" in run(env, "dataset", "show", f"{TEAM}/digits:1")
    up = run(env, "lineage", "up", f"{TEAM}/linear:1").splitlines()
    assert up[0] == f"model {TEAM}/linear:1"
    assert any(f"job {job[:8]}" in line for line in up)
    assert any(f"dataset {TEAM}/digits:1" in line and "read_by" in line for line in up)
    down = run(env, "lineage", "down", f"{TEAM}/digits:1")
    assert f"model {TEAM}/linear:1" in down
    events = json.loads(
        run(env, "lineage", "up", f"{TEAM}/linear:1", "--openlineage", stdout_only=True)
    )["events"]
    assert [e["run"]["runId"] for e in events] == [job]
    run(env, "lineage", "down", f"{TEAM}/nothing:1", code=3)


def test_costs_from_the_ledger(env: dict[str, str], job: str) -> None:
    def billed() -> str | None:
        out = run(env, "cost", "--by", "project", "--granularity", "day")
        return out if "lineage" in out else None

    table = eventually(billed).splitlines()
    assert table[0].split() == ["BUCKET", "PROJECT", "GPU-HOURS", "COST"]
    report = json.loads(run(env, "cost", "--by", "team,project", "--json", stdout_only=True))
    assert report["group_by"] == ["team", "project"]
    assert {(r["team"], r["project"]) for r in report["rows"]} == {(TEAM, "lineage")}
    csv = run(env, "cost", "--by", "project", "--csv").splitlines()
    # The first columns keep their order; CPU and memory columns are appended after them.
    assert csv[0] == (
        "project,currency,gpu_seconds,cost,gpu_cost,cpu_seconds,cpu_cost,unpriced_cpu_seconds,"
        "memory_gib_seconds,memory_cost,unpriced_memory_gib_seconds"
    )
    assert csv[1].startswith("lineage,")
    bill = run(env, "cost", job[:8])
    assert bill.startswith(f"job {job}") and "ATTEMPT" in bill and "total:" in bill
    refused = run(env, "cost", "--from", "2026-12-01T10:30:00Z", code=1)
    assert "from" in refused and "whole UTC hour" in refused


def test_a_versions_cost_is_its_bill_and_a_grant_opens_it_to_another_team(
    stack: LocalStack, env: dict[str, str], folder: Path, job: str, version: object
) -> None:
    def costed() -> str | None:
        shown = json.loads(
            run(env, "model", "show", f"{TEAM}/linear:1", "--json", stdout_only=True)
        )
        return json.dumps(shown["cost"]) if shown["cost"]["by_currency"] else None

    # Billing's cost.recorded reached the registry over the real bus (its NATS user's rules).
    cost = json.loads(eventually(costed))
    bill = json.loads(run(env, "cost", job[:8], "--json", stdout_only=True))
    totals = {t["currency"]: Decimal(str(t["cost"])) for t in bill["totals"]}
    assert Decimal(cost["own_job"]) == totals[cost["currency"]] > 0
    assert (cost["upstream"], cost["total"], cost["complete"]) == (
        "0.000000",
        cost["own_job"],
        True,
    )
    assert [(j["job_id"], j["relation"]) for j in cost["jobs"]] == [(job, "own")]
    assert f"cost:        {cost['total']} {cost['currency']}" in run(
        env, "model", "show", f"{TEAM}/linear:1"
    )

    guest = {**env, "TRAINYARD_TOKEN": stack.bootstrap_admin("model-guests", "gus")}
    out = folder / "guest.pt"
    run(guest, "model", "show", f"{TEAM}/linear:1", code=3)  # as if it did not exist
    run(guest, "model", "download", f"{TEAM}/linear:1", "-o", str(out), code=3)
    assert "model-guests may read" in run(env, "model", "grant", f"{TEAM}/linear", "model-guests")
    assert "read by: model-guests" in run(env, "model", "show", f"{TEAM}/linear")
    listed = run(guest, "model", "ls")
    assert f"{TEAM}/linear" in listed and f"granted by {TEAM}" in listed
    assert f"granted by {TEAM}" in run(guest, "model", "ls", "--team", TEAM)
    granted = json.loads(run(guest, "model", "ls", "--granted", "--json", stdout_only=True))
    assert [(m["team"], m["name"], m["granted"]) for m in granted] == [(TEAM, "linear", True)]
    assert f"granted by {TEAM}" not in run(env, "model", "ls")  # the owner's own: not granted
    assert "cost:" in run(guest, "model", "show", f"{TEAM}/linear:1")
    assert "sha256 verified" in run(guest, "model", "download", f"{TEAM}/linear:1", "-o", str(out))
    run(guest, "model", "grant", f"{TEAM}/linear", "model-guests", code=3)  # not its to give
    assert "may not read" in run(env, "model", "revoke", f"{TEAM}/linear", "model-guests")
    assert f"{TEAM}/linear" not in run(guest, "model", "ls")
    run(guest, "model", "show", f"{TEAM}/linear:1", code=3)


def test_a_reader_that_closes_the_pipe_early(env: dict[str, str], version: object) -> None:
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{CLI} model ls | head -1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr and len(done.stdout.splitlines()) == 1
