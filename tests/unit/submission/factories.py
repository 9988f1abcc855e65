"""Builders of the events the submission service consumes, with sensible defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    CheckpointSaved,
    CostRecorded,
    Environment,
    FailureKind,
    JobCancelled,
    JobFailed,
    JobPending,
    JobPreempted,
    JobProgress,
    JobSpec,
    JobStarted,
    JobSucceeded,
    Lineage,
    ModelRegistered,
)

T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spec(**changes: object) -> JobSpec:
    fields: dict[str, object] = {
        "name": "digits-cnn",
        "team": "ml",
        "user": "alice",
        "entrypoint": "examples.digits_cnn",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "hyperparameters": {"lr": 0.01},
        "seed": 7,
        "max_runtime_seconds": 3600,
    }
    return JobSpec.model_validate({**fields, **changes})


def environment(node: str = "node-1") -> Environment:
    return Environment(
        python="3.11.9",
        torch="2.3.0",
        platform="linux",
        hostname=node,
        node_id=node,
        gpu_flavor="cpu",
    )


def pending(job_id: str, reason: str = "waiting for 1 free cpu", position: int = 1) -> JobPending:
    return JobPending(job_id=job_id, reason=reason, position=position, estimated_start=at(60))


def granted(
    job_id: str, allocation: str = "alloc-1", attempt: int = 1, node: str = "node-1"
) -> AllocationGranted:
    return AllocationGranted(
        allocation_id=allocation,
        job_id=job_id,
        node_id=node,
        gpu_indices=[0, 1],
        epoch=attempt,
        attempt=attempt,
        granted_at=at(10 * attempt),
        spec=spec(),
    )


def started(job_id: str, allocation: str = "alloc-1", attempt: int = 1) -> JobStarted:
    return JobStarted(
        job_id=job_id,
        allocation_id=allocation,
        node_id="node-1",
        attempt=attempt,
        epoch=attempt,
        started_at=at(10 * attempt + 1),
        code_version="git:abc123",
        environment=environment(),
        spec=spec(),
    )


def progress(job_id: str, step: int, allocation: str = "alloc-1", **metrics: float) -> JobProgress:
    return JobProgress(job_id=job_id, allocation_id=allocation, step=step, metrics=metrics)


def ref(step: int, job_id: str = "job") -> CheckpointRef:
    base = f"s3://ckpt/jobs/{job_id}/checkpoints/step-{step:08d}"
    return CheckpointRef(
        uri=f"{base}/checkpoint.pt",
        manifest_uri=f"{base}/manifest.json",
        step=step,
        size_bytes=1000 + step,
        sha256=f"{step:064x}",
    )


def checkpoint(job_id: str, step: int, allocation: str = "alloc-1") -> CheckpointSaved:
    return CheckpointSaved(
        job_id=job_id,
        allocation_id=allocation,
        epoch=1,
        checkpoint=ref(step, job_id),
        saved_at=at(100 + step),
    )


def succeeded(job_id: str, allocation: str = "alloc-1", **metrics: float) -> JobSucceeded:
    return JobSucceeded(
        job_id=job_id,
        allocation_id=allocation,
        node_id="node-1",
        epoch=1,
        finished_at=at(500),
        metrics=metrics,
        artifact=ref(100, job_id),
    )


def failed(
    job_id: str,
    allocation: str = "alloc-1",
    exit_code: int | None = 1,
    *,
    reason: str = "process exited",
    failure_kind: FailureKind = "user_error",
    log_tail: str = "Traceback ...\nValueError: bad batch",
    finished_at: float = 400,
) -> JobFailed:
    """A ``job.failed``: the runner's report of an attempt, or (sent with the scheduler's
    source) the scheduler's final word."""
    return JobFailed(
        job_id=job_id,
        allocation_id=allocation,
        node_id="node-1",
        epoch=1,
        finished_at=at(finished_at),
        exit_code=exit_code,
        reason=reason,
        log_tail=log_tail,
        failure_kind=failure_kind,
    )


def preempted_by_scheduler(
    job_id: str, allocation: str = "alloc-1", reason: str | None = None, attempt: int = 1
) -> JobPreempted:
    """The scheduler's ``job.preempted`` for a failed attempt it restarts."""
    return JobPreempted(
        job_id=job_id,
        allocation_id=allocation,
        node_id="node-1",
        epoch=attempt,
        finished_at=at(400),
        reason=reason
        or f"attempt {attempt} failed (user_error: process exited); restarting in 5 s",
    )


def preempted(job_id: str, allocation: str = "alloc-1") -> JobPreempted:
    return JobPreempted(
        job_id=job_id,
        allocation_id=allocation,
        node_id="node-1",
        epoch=1,
        finished_at=at(300),
        reason="reclaimed by team vision",
        checkpoint=ref(50, job_id),
    )


def cancelled(job_id: str) -> JobCancelled:
    return JobCancelled(job_id=job_id, reason="cancelled by user")


def model_registered(job_id: str, version: int = 1) -> ModelRegistered:
    return ModelRegistered(
        model_version_id=f"mv-{job_id}-{version}",
        model_name="digits-cnn",
        version=version,
        team="ml",
        job_id=job_id,
        artifact_uri=f"s3://models/digits-cnn/{version}/model.pt",
        artifact_sha256="f" * 64,
        metrics={"accuracy": 0.97},
        lineage=Lineage(
            job_id=job_id,
            spec=spec(),
            code_version="git:abc123",
            dataset=None,
            seed=7,
            environment=environment(),
            attempts=1,
        ),
    )


def cost(
    job_id: str, allocation: str = "alloc-1", gpu_seconds: float = 7200.0, price: float = 2.0
) -> CostRecorded:
    return CostRecorded(
        allocation_id=allocation,
        job_id=job_id,
        team="ml",
        user="alice",
        gpu_flavor="cpu",
        gpus=2,
        started_at=at(10),
        ended_at=at(3610),
        gpu_seconds=gpu_seconds,
        price_per_gpu_hour=price,
        cost=gpu_seconds / 3600 * price,
        currency="USD",
    )
