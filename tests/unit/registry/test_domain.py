"""The registry's rules: version numbering, artifact choice, lineage building."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainyard_platform.services.registry import domain
from trainyard_platform.services.registry.domain import (
    ModelVersion,
    NoArtifact,
    RecordedCheckpoint,
    Run,
)
from trainyard_platform.services.registry.schemas import VersionDetail, VersionSummary
from trainyard_platform.shared.events.payloads import (
    CheckpointRef,
    Environment,
    JobSpec,
    JobStarted,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SPEC = JobSpec(
    name="digits",
    team="vision",
    user="alice",
    entrypoint="examples.digits_cnn",
    gpus=1,
    gpu_flavor="cpu",
    hyperparameters={"lr": 0.003},
    seed=42,
    max_runtime_seconds=600,
    dataset="digits@v1",
)
ENV = Environment(
    python="CPython 3.11.9",
    torch="2.13.0",
    platform="Linux",
    hostname="h",
    node_id="node-a",
    gpu_flavor="cpu",
)


def ref(step: int, name: str = "a") -> CheckpointRef:
    return CheckpointRef(
        uri=f"s3://b/jobs/j/checkpoints/step-{step:08d}/{name}.pt",
        manifest_uri=f"s3://b/jobs/j/checkpoints/step-{step:08d}/manifest.json",
        step=step,
        size_bytes=10,
        sha256="f" * 64,
    )


def run(allocation: str, attempt: int, minutes: int, resumed_from: str | None = None) -> Run:
    return Run(
        allocation_id=allocation,
        job_id="job-1",
        attempt=attempt,
        epoch=attempt + 1,
        node_id=f"node-{attempt}",
        started_at=T0 + timedelta(minutes=minutes),
        spec=SPEC,
        code_version=f"git:{attempt:040d} src:sha256:{'0' * 64}",
        environment=ENV.model_copy(update={"node_id": f"node-{attempt}"}),
        resumed_from=resumed_from,
    )


def test_versions_count_from_one() -> None:
    assert domain.next_version(0) == 1
    assert domain.next_version(1) == 2
    assert domain.next_version(41) == 42
    with pytest.raises(ValueError):
        domain.next_version(-1)


def test_the_reported_artifact_wins() -> None:
    recorded = [RecordedCheckpoint(ref(100), T0)]
    assert domain.choose_artifact(ref(5), recorded) == ref(5)


def test_without_a_reported_artifact_the_newest_recorded_checkpoint_is_used() -> None:
    recorded = [
        RecordedCheckpoint(ref(50, "old"), T0),
        RecordedCheckpoint(ref(100, "first"), T0 + timedelta(seconds=1)),
        RecordedCheckpoint(ref(100, "again"), T0 + timedelta(seconds=2)),
        RecordedCheckpoint(ref(20, "late"), T0 + timedelta(seconds=3)),
    ]
    assert domain.choose_artifact(None, recorded) == ref(100, "again")


def test_no_checkpoint_at_all_is_no_artifact() -> None:
    with pytest.raises(NoArtifact):
        domain.choose_artifact(None, [])


def test_lineage_comes_from_the_run_that_succeeded_and_counts_every_attempt() -> None:
    first = run("alloc-1", 0, minutes=0)
    second = run("alloc-2", 1, minutes=10, resumed_from=ref(50).uri)
    third = run("alloc-3", 2, minutes=20, resumed_from=ref(90).uri)
    lineage = domain.build_lineage(third, [third, first, second])
    assert lineage.job_id == "job-1"
    assert lineage.spec == SPEC
    assert lineage.code_version == third.code_version
    assert lineage.environment.node_id == "node-2"
    assert (lineage.dataset, lineage.seed) == ("digits@v1", 42)
    assert lineage.attempts == 3
    assert lineage.parent_checkpoints == [ref(50).uri, ref(90).uri]


def test_a_checkpoint_resumed_from_twice_is_one_parent() -> None:
    a = run("alloc-1", 0, minutes=0, resumed_from=ref(50).uri)
    b = run("alloc-2", 1, minutes=5, resumed_from=ref(50).uri)
    assert domain.build_lineage(b, [a, b]).parent_checkpoints == [ref(50).uri]


def test_a_run_is_built_from_its_started_event() -> None:
    started = JobStarted(
        job_id="job-1",
        allocation_id="alloc-9",
        node_id="node-a",
        attempt=0,
        epoch=1,
        started_at=T0,
        code_version="src:sha256:" + "1" * 64,
        environment=ENV,
        spec=SPEC,
        resumed_from=None,
    )
    built = Run.from_event(started)
    assert built.allocation_id == "alloc-9" and built.spec == SPEC and built.environment == ENV


def version() -> ModelVersion:
    final = run("alloc-2", 1, minutes=10, resumed_from=ref(50).uri)
    return ModelVersion(
        id="7d5f1f1e-8d43-4a30-b2c3-0a4c1f4a9e11",
        team="vision",
        model_name="digits",
        version=3,
        job_id="job-1",
        allocation_id="alloc-2",
        artifact=ref(120),
        metrics={"val_accuracy": 0.97},
        lineage=domain.build_lineage(final, [run("alloc-1", 0, 0), final]),
        registered_at=T0,
    )


def test_model_registered_carries_the_version_artifact_and_lineage() -> None:
    event = version().to_event()
    assert (event.model_name, event.team, event.version) == ("digits", "vision", 3)
    assert event.artifact_uri == ref(120).uri and event.artifact_sha256 == "f" * 64
    assert event.lineage.attempts == 2 and event.metrics == {"val_accuracy": 0.97}


def test_a_version_round_trips_through_a_row() -> None:
    v = version()
    row = {
        "id": v.id,
        "team": v.team,
        "name": v.model_name,
        "version": v.version,
        "job_id": v.job_id,
        "allocation_id": v.allocation_id,
        "artifact_uri": v.artifact.uri,
        "artifact_manifest_uri": v.artifact.manifest_uri,
        "artifact_step": v.artifact.step,
        "artifact_size_bytes": v.artifact.size_bytes,
        "artifact_sha256": v.artifact.sha256,
        "metrics": {"val_accuracy": 0.97},
        "lineage": v.lineage.model_dump(mode="json"),
        "registered_at": v.registered_at,
        "origin": "job_success",
        "source_uri": None,
        "artifact_key": None,
        "tags": [],
        "description": "",
        "created_by": "registry",
        "deleted_at": None,
    }
    assert ModelVersion.from_row(row) == v
    assert not v.owned  # registered before the registry kept its own copies


def test_http_views_of_a_version() -> None:
    v = version()
    summary = VersionSummary.from_domain(v)
    assert summary.model == "digits" and summary.artifact.step == 120
    detail = VersionDetail.from_domain(v)
    assert detail.lineage == v.lineage and detail.allocation_id == "alloc-2"
