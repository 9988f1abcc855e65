"""One real training job travels the whole system, every component a real process.

NATS JetStream, PostgreSQL, an S3 endpoint (moto's server speaking the S3 protocol — the
same wire protocol MinIO serves in deployment), the five services and one runner run as
separate processes on loopback; the job is the real digits CNN from ``examples/``.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from minio import Minio

from trainyard.bundle import DEFAULT_MAX_BYTES
from trainyard.cli import upload_code
from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
SERVICES = {"submission", "scheduler", "runner", "registry", "billing"}


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    # Not pytest's tmp_path: another pytest run resets its base folder to mode 0700, which
    # locks out PostgreSQL (it runs as its own system user when we are root).
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-"))
    try:
        with LocalStack(data, storage="s3", span_file=data / "spans.jsonl") as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> TrainyardClient:
    return TrainyardClient(stack.submission_url, stack.bootstrap_admin("ml-research", "alice"))


@pytest.fixture(scope="module")
def finished_job(client: TrainyardClient) -> dict[str, Any]:
    spec = json.loads((ROOT / "examples" / "digits.job.json").read_text())
    spec["code"] = upload_code(client, ROOT / "examples", DEFAULT_MAX_BYTES)
    submitted_at = time.time()
    job = client.submit(spec)
    final = client.wait(job["id"], timeout_s=300)
    final["_observed_wall_s"] = time.time() - submitted_at
    return final


def test_job_succeeds(finished_job: dict[str, Any]) -> None:
    assert finished_job["status"] == "SUCCEEDED", (
        finished_job.get("failure"),
        finished_job.get("history"),
    )
    statuses = [h["status"] for h in finished_job["history"]]
    assert statuses[0] == "QUEUED" and statuses[-1] == "SUCCEEDED"
    assert "SCHEDULED" in statuses and "RUNNING" in statuses
    assert finished_job["node"] == "local-node-1"


def test_checkpoint_in_s3_opens_with_plain_torch_load(
    stack: LocalStack, finished_job: dict[str, Any]
) -> None:
    assert finished_job["checkpoints"], "the job reported no checkpoint"
    s3 = stack.s3
    assert s3 is not None
    minio = Minio(s3.endpoint, s3.access_key, s3.secret_key, secure=False, region="us-east-1")
    for checkpoint in (
        finished_job["checkpoints"][-1]["uri"],
        finished_job["model"]["artifact_uri"],
    ):
        bucket, _, key = checkpoint.removeprefix("s3://").partition("/")
        response = minio.get_object(bucket, key)
        try:
            state = torch.load(io.BytesIO(response.read()), weights_only=True)
        finally:
            response.close()
            response.release_conn()
        assert "model" in state and any(torch.is_tensor(t) for t in state["model"].values())


def test_model_version_has_lineage(finished_job: dict[str, Any]) -> None:
    model = finished_job["model"]
    assert model["name"] == "digits-cnn" and model["version"] >= 1
    lineage = model["lineage"]
    assert lineage["job_id"] == finished_job["id"]
    assert lineage["seed"] == 42 and lineage["dataset"] == "sklearn:digits"
    assert lineage["spec"]["hyperparameters"]["epochs"] == 8
    assert "sha256:" in lineage["code_version"]
    env = lineage["environment"]
    assert env["torch"] == torch.__version__.split("+")[0] or env["torch"] == torch.__version__
    assert env["python"] and env["node_id"] == "local-node-1" and env["gpu_flavor"] == "cpu"


def test_cost_is_gpu_seconds_times_price_within_the_allocation(
    finished_job: dict[str, Any],
) -> None:
    cost = finished_job["cost"]
    assert cost["currency"] == "USD"
    assert cost["gpu_seconds"] > 0
    assert cost["cost"] == pytest.approx(
        cost["gpu_seconds"] * cost["price_per_gpu_hour"] / 3600, rel=1e-6, abs=1e-6
    )
    gpus = finished_job["spec"]["gpus"]
    ran = _seconds(finished_job["finished_at"]) - _seconds(finished_job["started_at"])
    # The lease covers the run and fits inside what the client saw from submit to the end.
    assert gpus * ran <= cost["gpu_seconds"] + 1e-6
    assert cost["gpu_seconds"] <= gpus * finished_job["_observed_wall_s"]


def test_one_trace_spans_all_five_services(stack: LocalStack, finished_job: dict[str, Any]) -> None:
    assert stack.span_file is not None
    spans = [json.loads(line) for line in stack.span_file.read_text().splitlines()]
    job_id = finished_job["id"]
    job_traces = {
        s["trace_id"]
        for s in spans
        if s["attributes"].get("cloudevents.event_subject") == job_id
        and s["attributes"].get("cloudevents.event_type") == "trainyard.job.submitted.v1"
    }
    assert len(job_traces) == 1, job_traces
    (trace_id,) = job_traces
    services = {s["service"] for s in spans if s["trace_id"] == trace_id}
    assert services >= SERVICES, f"missing: {SERVICES - services}"


def _seconds(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()
