"""Reproducibility against the whole local stack: the example job (``examples/``) on CPU
with its fixed seed is reproduced with ``trainyard rerun --reproduce`` and the registry says
"identical" (metrics and checkpoint bytes equal); reproduced with another dataset version it
says "different" and names the dataset. The record of the job is complete (code, data,
environment, hardware; no GPU library invented on CPU), and another team can neither
reproduce the job nor read its record or verdict.
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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
CLI = Path(sys.executable).parent / "trainyard"
TEAM = "repro-team"


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-repro-"))
    try:
        # Job uids of its own: other stacks on this host may be up.
        own_uids = {"TRAINYARD_RUNNER_JOB_UID_BASE": "282128"}
        with LocalStack(data, storage="file", extra_env=own_uids) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """The example's spec with one epoch and a registered dataset version."""
    path = Path(tempfile.mkdtemp(prefix="repro-"))
    spec = json.loads((ROOT / "examples" / "digits.job.json").read_text())
    spec["hyperparameters"]["epochs"] = 1
    spec["datasets"] = [f"{TEAM}/digits:1"]
    (path / "job.json").write_text(json.dumps(spec))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def env(stack: LocalStack, folder: Path) -> dict[str, str]:
    token = stack.bootstrap_admin(TEAM, "rita")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "TRAINYARD_URL": stack.submission_url,
        "TRAINYARD_TOKEN": token,
        "TRAINYARD_CONFIG": str(folder / "config.json"),
        "TRAINYARD_REGISTRY_URL": stack.service_urls["registry"],
    }


def run(
    env: dict[str, str], *args: str, code: int = 0, timeout: float = 400, stdout_only: bool = False
) -> str:
    done = subprocess.run(
        [str(CLI), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == code, f"trainyard {' '.join(args)}: {done.stderr}\n{done.stdout}"
    assert "Traceback" not in done.stderr
    # A --json answer is stdout alone: a show's ``etag:`` line goes to stderr.
    return done.stdout if stdout_only else done.stdout + done.stderr


def eventually(check: Callable[[], Any], timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(1)


def registry(stack: LocalStack, env: dict[str, str], path: str) -> httpx.Response:
    return httpx.get(
        stack.service_urls["registry"] + path,
        headers={"Authorization": f"Bearer {env['TRAINYARD_TOKEN']}"},
        timeout=30,
    )


def submitted(out: str) -> str:
    match = re.search(r"submitted job ([0-9a-f-]{36})", out)
    assert match, out
    return match.group(1)


@pytest.fixture(scope="module")
def original(env: dict[str, str], folder: Path) -> str:
    """The example job, succeeded, having read ``digits:1``."""
    for version, content in ((1, b"digits v1"), (2, b"digits v2")):
        out = run(
            env,
            "dataset",
            "register",
            f"{TEAM}/digits",
            "--uri",
            f"s3://data/digits-v{version}.npz",
            "--sha256",
            hashlib.sha256(content).hexdigest(),
            "--size",
            str(len(content)),
            "--feature-version",
            "git:features-1",
        )
        assert f"registered {TEAM}/digits:{version}" in out
    job = submitted(
        run(env, "submit", str(folder / "job.json"), "--workdir", str(ROOT / "examples"))
    )
    assert "SUCCEEDED" in run(env, "wait", job)
    return job


def test_the_record_is_complete_and_invents_nothing_on_cpu(
    stack: LocalStack, env: dict[str, str], original: str
) -> None:
    def ended() -> dict[str, Any] | None:
        response = registry(stack, env, f"/v1/jobs/{original}/record")
        found: dict[str, Any] = response.json()
        return found if response.status_code == 200 and found["outcome"] is not None else None

    answer = eventually(ended)
    record = answer["record"]
    assert record["code"]["bundle_sha256"] and record["code"]["version"]
    assert record["code"]["source"]["kind"] == "bundle"
    (dataset,) = record["data"]["datasets"]
    assert dataset["reference"] == f"{TEAM}/digits:1"
    assert dataset["sha256"] == hashlib.sha256(b"digits v1").hexdigest()
    assert dataset["feature_version"] == "git:features-1"
    assert record["seed"] == 42 and record["hyperparameters"]["epochs"] == 1
    assert record["spec"]["entrypoint"] == "digits_cnn.py"
    environment = record["environment"]
    assert environment["packages"] and re.fullmatch(r"[0-9a-f]{64}", environment["packages_sha256"])
    assert environment["python"] and environment["torch"]
    # A CPU run: no CUDA, cuDNN, NCCL or driver, rather than a guess.
    assert [environment[k] for k in ("cuda", "cudnn", "nccl", "driver")] == [None] * 4
    assert record["hardware"]["gpu_count"] == 1 and record["hardware"]["gpu_flavor"] == "cpu"
    assert record["hardware"]["node_id"] and record["hardware"]["hostname"]
    outcome = answer["outcome"]
    assert outcome["status"] == "succeeded" and "val_accuracy" in outcome["metrics"]
    assert re.fullmatch(r"[0-9a-f]{64}", outcome["checkpoint_sha256"])


def test_a_reproduction_of_the_example_is_identical(
    stack: LocalStack, env: dict[str, str], original: str
) -> None:
    out = run(env, "rerun", "--reproduce", original[:8], "--follow")
    job = submitted(out)
    assert "verdict: identical" in out, out
    verdict = registry(stack, env, f"/v1/jobs/{job}/reproduction").json()
    assert verdict["verdict"] == "identical" and verdict["original_job_id"] == original
    assert verdict["differences"] == []
    assert verdict["weights"]["compared"] and verdict["weights"]["equal"]
    assert verdict["weights"]["deterministic"]
    compared = {k: m for k, m in verdict["metrics"].items() if m.get("compared", True)}
    assert all(m["relative_difference"] == 0 for m in compared.values())
    assert "samples_per_s" in verdict["metrics"] and "samples_per_s" not in compared
    assert "val_accuracy" in verdict["metrics"]
    view = json.loads(run(env, "describe", job, "--json", stdout_only=True))
    assert view["spec"]["reproduces"] == original and view["spec"]["register_model"] is False


def test_another_dataset_version_is_different_and_named(
    stack: LocalStack, env: dict[str, str], original: str
) -> None:
    out = run(env, "rerun", "--reproduce", original, "--dataset", f"{TEAM}/digits:2")
    job = submitted(out)
    assert "SUCCEEDED" in run(env, "wait", job)

    def decided() -> dict[str, Any] | None:
        found: dict[str, Any] = registry(stack, env, f"/v1/jobs/{job}/reproduction").json()
        return found if found.get("verdict") is not None else None

    verdict = eventually(decided)
    assert verdict["verdict"] == "different"
    assert [d["field"] for d in verdict["differences"]] == ["data.datasets"]
    (difference,) = verdict["differences"]
    assert difference["original"][0].startswith(f"{TEAM}/digits:1 ")
    assert difference["reproduction"][0].startswith(f"{TEAM}/digits:2 ")
    shown = run(env, "reproduction", job)
    assert "verdict: different" in shown and "differs: data.datasets" in shown


def test_another_team_can_neither_reproduce_nor_read(
    stack: LocalStack, env: dict[str, str], original: str
) -> None:
    other = {**env, "TRAINYARD_TOKEN": stack.bootstrap_admin("other-repro-team", "olga")}
    refused = httpx.post(
        f"{stack.submission_url}/v1/jobs/{original}/reproduce",
        headers={"Authorization": f"Bearer {other['TRAINYARD_TOKEN']}"},
        json={},
        timeout=30,
    )
    assert refused.status_code == 404, refused.text
    assert registry(stack, other, f"/v1/jobs/{original}/record").status_code == 404
    made = registry(stack, env, f"/v1/jobs/{original}/record").json()["reproductions"]
    assert len(made) >= 1
    assert registry(stack, other, f"/v1/jobs/{made[0]['job_id']}/reproduction").status_code == 404
    # Nor does a job that is not a reproduction have a verdict.
    assert registry(stack, env, f"/v1/jobs/{original}/reproduction").status_code == 404
