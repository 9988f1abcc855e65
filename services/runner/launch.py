"""Everything decided before a job process starts: whether it can run here, what it is
(code version, environment, checkpoint to resume from), its command and its environment.

The job's environment is the runner's own (``os.environ``) minus the runner's settings
(``TRAINYARD_RUNNER_*``, ``TRAINYARD_NATS_*``, ``TRAINYARD_DATABASE_*``: a job has no business
with the bus or a database), plus:

- ``TRAINYARD_STORAGE_*`` of the runner's object store, its URI made absolute (a job runs
  in ``code_dir``, where a relative ``file://./...`` would point elsewhere);
- the ``shared.control.JobRuntimeEnv`` variables (job, allocation, attempt, seed,
  hyperparameters, checkpoint folder ``<store>/jobs/<job_id>/checkpoints``, dataset, GPUs);
  the control pipe's fd is added when the process is spawned;
- ``CUDA_VISIBLE_DEVICES`` (and ``CUDA_DEVICE_ORDER``) confining it to its GPUs;
- ``PYTHONUNBUFFERED=1`` so its output arrives line by line, and ``TRACEPARENT`` with the
  job's trace for code that wants to continue it.

``prepare`` blocks (git, a probe of the interpreter, store listings): run it in a thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.runner.checkpoints import latest_complete_checkpoint
from services.runner.config import Settings
from services.runner.gpus import GpuInventory
from services.runner.ledger import safe_file_name
from services.runner.provenance import ENTRYPOINT_PATTERN, capture_environment, code_version
from shared.control import JobRuntimeEnv
from shared.events.payloads import AllocationGranted, Environment
from shared.settings import StorageSettings
from shared.storage import ObjectStore, open_store

WITHHELD_ENV_PREFIXES = ("TRAINYARD_RUNNER_", "TRAINYARD_NATS_", "TRAINYARD_DATABASE_")


@dataclass(frozen=True)
class Prepared:
    """What is known about a job before it starts."""

    checkpoint_uri: str
    resumed_from: str | None
    code_version: str
    environment: Environment


def cannot_run(grant: AllocationGranted, gpus: GpuInventory) -> str | None:
    """Why ``grant`` can never run on this node, or None."""
    if not ENTRYPOINT_PATTERN.match(grant.spec.entrypoint):
        return f"entrypoint {grant.spec.entrypoint!r} is not a dotted module name"
    return gpus.invalid_indices(grant.gpu_indices)


def prepare(
    grant: AllocationGranted, settings: Settings, store: ObjectStore, gpus: GpuInventory
) -> Prepared:
    checkpoint_uri = store.uri_for(f"jobs/{grant.job_id}/checkpoints")
    checkpoints = open_store(checkpoint_uri, settings.storage)
    return Prepared(
        checkpoint_uri=checkpoint_uri,
        resumed_from=latest_complete_checkpoint(checkpoints),
        code_version=code_version(settings.code_dir, grant.spec.entrypoint),
        environment=capture_environment(
            python=settings.python,
            code_dir=settings.code_dir,
            node_id=settings.node_id,
            gpu_flavor=settings.gpu_flavor,
            gpus=gpus,
            gpu_indices=grant.gpu_indices,
        ),
    )


def job_argv(python: str, grant: AllocationGranted) -> list[str]:
    return [python, "-m", grant.spec.entrypoint, *grant.spec.args]


def job_env(
    grant: AllocationGranted,
    prepared: Prepared,
    *,
    base: Mapping[str, str],
    storage: StorageSettings,
    store_uri: str,
    gpus: GpuInventory,
    trace_headers: Mapping[str, str],
) -> dict[str, str]:
    """The job's environment (see the module docstring); ``base`` is the runner's."""
    env = {k: v for k, v in base.items() if not k.startswith(WITHHELD_ENV_PREFIXES)}
    env.update(storage_env(storage, store_uri))
    env.update(
        JobRuntimeEnv(
            job_id=grant.job_id,
            allocation_id=grant.allocation_id,
            attempt=grant.attempt,
            seed=grant.spec.seed,
            hyperparameters=grant.spec.hyperparameters,
            checkpoint_uri=prepared.checkpoint_uri,
            dataset=grant.spec.dataset,
            gpu_indices=grant.gpu_indices,
        ).to_env()
    )
    env.update(gpus.job_env(grant.gpu_indices))
    env["PYTHONUNBUFFERED"] = "1"
    if "traceparent" in trace_headers:
        env["TRACEPARENT"] = trace_headers["traceparent"]  # the W3C environment carrier
    return env


def runner_environ() -> dict[str, str]:
    """The runner's own environment, the base a job's is built on."""
    return dict(os.environ)


def storage_env(settings: StorageSettings, root_uri: str) -> dict[str, str]:
    """``TRAINYARD_STORAGE_*`` for the job: the runner's store, its URI made absolute."""
    return {
        "TRAINYARD_STORAGE_URI": root_uri,
        "TRAINYARD_STORAGE_S3_ENDPOINT": settings.s3_endpoint,
        "TRAINYARD_STORAGE_S3_ACCESS_KEY": settings.s3_access_key,
        "TRAINYARD_STORAGE_S3_SECRET_KEY": settings.s3_secret_key.get_secret_value(),
        "TRAINYARD_STORAGE_S3_SECURE": "true" if settings.s3_secure else "false",
        "TRAINYARD_STORAGE_S3_REGION": settings.s3_region,
    }


def job_log_path(work_dir: Path, job_id: str, allocation_id: str) -> Path:
    """``<work_dir>/jobs/<job>/<allocation>.log`` (ids made safe as file names)."""
    return work_dir / "jobs" / safe_file_name(job_id) / f"{safe_file_name(allocation_id)}.log"
