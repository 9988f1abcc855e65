"""The runner running the reference job (``examples.digits_cnn``) for real, on CPU."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from tests.integration.runner.conftest import EventLog, StartRunner, grant, publish, upload_bundle
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import (
    CheckpointSaved,
    JobProgress,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.storage import open_store, split_uri

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(
    not (REPO / "examples" / "digits_cnn.py").is_file(), reason="examples.digits_cnn not present"
)
@pytest.mark.timeout(240)
async def test_digits_cnn_trains_and_its_artifact_loads_with_plain_torch(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog
) -> None:
    settings = settings.model_copy(update={"code_dir": REPO})
    await start_runner(settings)
    code = upload_bundle(open_store(settings.storage.uri), "team-a", REPO / "examples")
    allocation = grant(settings.node_id, [], entrypoint="digits_cnn.py", code=code)
    allocation = allocation.model_copy(
        update={
            "spec": allocation.spec.model_copy(update={"hyperparameters": {"epochs": 2}, "seed": 7})
        }
    )
    await publish(bus, allocation, settings.node_id)

    done = await events.first(JobSucceeded, allocation.job_id, timeout=180)
    started = await events.first(JobStarted, allocation.job_id)
    assert started.code_version == f"sha256:{code.sha256}"
    assert "torch==" + importlib.metadata.version("torch") in started.environment.packages
    assert started.environment.torch == importlib.metadata.version("torch")
    assert events.of(JobProgress, allocation.job_id)
    assert events.of(CheckpointSaved, allocation.job_id)

    assert done.artifact is not None
    assert {"loss", "val_accuracy"} <= set(done.metrics)
    assert done.metrics["val_accuracy"] > 0.5
    folder, name = split_uri(done.artifact.uri)
    local = Path(settings.work_dir) / "artifact.pt"
    open_store(folder).get_file(name, local)
    state = torch.load(local, weights_only=True)
    assert "model" in state and state["step"] == done.artifact.step
