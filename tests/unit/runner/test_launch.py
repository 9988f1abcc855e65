"""What a job is started with: its command, its environment, and whether it can run here."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from services.runner import launch
from services.runner.gpus import GpuInventory, virtual_inventory
from shared.control import JobRuntimeEnv
from shared.events.payloads import AllocationGranted, Environment, JobSpec
from shared.settings import StorageSettings

GRANT = AllocationGranted(
    allocation_id="alloc-1",
    job_id="job-1",
    node_id="node-a",
    gpu_indices=[0, 2],
    epoch=5,
    attempt=2,
    granted_at=datetime(2025, 1, 1, tzinfo=UTC),
    spec=JobSpec(
        name="digits",
        team="vision",
        user="alice",
        entrypoint="examples.digits_cnn",
        args=["--fast", "x y"],
        gpus=2,
        gpu_flavor="h200",
        hyperparameters={"lr": 0.01, "epochs": 3},
        seed=7,
        max_runtime_seconds=60,
        dataset="digits@v2",
    ),
)
PREPARED = launch.Prepared(
    checkpoint_uri="s3://ty/jobs/job-1/checkpoints",
    resumed_from=None,
    code_version="src:sha256:" + "0" * 64,
    environment=Environment(
        python="CPython 3.11",
        torch="2.13.0",
        platform="L",
        hostname="h",
        node_id="n",
        gpu_flavor="h200",
    ),
)
STORAGE = StorageSettings(
    uri="s3://ty", s3_endpoint="minio:9000", s3_access_key="ak", s3_secret_key=SecretStr("sk")
)
H200 = GpuInventory(("H200",) * 4, "nvml", "12.4")
BASE = {
    "PATH": "/usr/bin",
    "HOME": "/home/runner",
    "TRAINYARD_RUNNER_NODE_ID": "node-a",
    "TRAINYARD_NATS_URL": "nats://secret:4222",
    "TRAINYARD_DATABASE_URL": "postgresql://user:password@db/x",
    "TRAINYARD_STORAGE_URI": "file://./relative",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}


def env_for(gpus: GpuInventory = H200, **overrides: object) -> dict[str, str]:
    kwargs: dict[str, object] = {
        "base": BASE,
        "storage": STORAGE,
        "store_uri": "s3://ty",
        "gpus": gpus,
        "trace_headers": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    }
    kwargs.update(overrides)
    return launch.job_env(GRANT, PREPARED, **kwargs)  # type: ignore[arg-type]


def test_the_job_is_python_m_its_entrypoint_with_its_args() -> None:
    assert launch.job_argv("/venv/bin/python", GRANT) == [
        "/venv/bin/python",
        "-m",
        "examples.digits_cnn",
        "--fast",
        "x y",
    ]


def test_the_job_reads_its_context_back_from_its_environment() -> None:
    runtime = JobRuntimeEnv.from_env(env_for())
    assert runtime == JobRuntimeEnv(
        job_id="job-1",
        allocation_id="alloc-1",
        attempt=2,
        seed=7,
        hyperparameters={"lr": 0.01, "epochs": 3},
        checkpoint_uri="s3://ty/jobs/job-1/checkpoints",
        dataset="digits@v2",
        gpu_indices=[0, 2],
    )


def test_the_job_sees_its_gpus_the_store_and_the_trace_but_not_the_runners_secrets() -> None:
    env = env_for()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["TRAINYARD_STORAGE_URI"] == "s3://ty"
    assert env["TRAINYARD_STORAGE_S3_ENDPOINT"] == "minio:9000"
    assert env["TRAINYARD_STORAGE_S3_SECRET_KEY"] == "sk"
    assert env["TRAINYARD_STORAGE_S3_SECURE"] == "false"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["TRACEPARENT"].startswith("00-111")
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/runner"
    for withheld in ("TRAINYARD_RUNNER_NODE_ID", "TRAINYARD_NATS_URL", "TRAINYARD_DATABASE_URL"):
        assert withheld not in env


def test_on_virtual_gpus_the_job_sees_no_cuda_device_and_no_trace_when_none() -> None:
    env = env_for(virtual_inventory(4), trace_headers={})
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "TRACEPARENT" not in env


def test_grants_that_can_never_run_here_say_why() -> None:
    assert launch.cannot_run(GRANT, H200) is None
    assert "do not exist" in (launch.cannot_run(GRANT, virtual_inventory(2)) or "")
    bad = GRANT.model_copy(update={"spec": GRANT.spec.model_copy(update={"entrypoint": "a b"})})
    assert "dotted module name" in (launch.cannot_run(bad, H200) or "")


def test_job_logs_live_under_the_work_dir_whatever_the_ids(tmp_path: Path) -> None:
    assert launch.job_log_path(tmp_path, "job-1", "alloc-1") == tmp_path / "jobs/job-1/alloc-1.log"
    hostile = launch.job_log_path(tmp_path, "../..", "../../x")
    assert hostile.parent.parent == tmp_path / "jobs"
