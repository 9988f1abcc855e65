"""The registry's pure rules: version numbers, which checkpoint becomes the artifact, and how
a model version's lineage is assembled from the runs of its job.

Contract:
- Versions of one model count 1, 2, 3, ... in registration order (``next_version``).
- The artifact of a version is the checkpoint the succeeded run reported last; when the
  runner reported none, the newest checkpoint recorded for the job (highest step, then the
  latest saved). No checkpoint at all: ``NoArtifact`` (the job produced no model).
- The lineage names the spec, code version and environment of the run that succeeded, the
  dataset and seed of its spec, how many runs (attempts) the job took, and the checkpoints
  its runs resumed from, in the order they started.
- A run is a ``job.started`` that says what the scheduler granted (``unlike_its_grant``:
  job, node, attempt, epoch, and the spec by its digest, ``spec_digest``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from trainyard_platform.shared.bus import NotYet
from trainyard_platform.shared.events.payloads import (
    CheckpointRef,
    Environment,
    JobSpec,
    JobStarted,
    Lineage,
    ModelRegistered,
)

Origin = Literal["job_success", "explicit"]
"""How a version came to be: on its job's success, or by an explicit registration."""


class NoArtifact(ValueError):
    """A succeeded job without any checkpoint: there is nothing to register."""


class RunNotRecorded(NotYet, LookupError):
    """The succeeded run's ``job.started`` has not been recorded (yet): events overtook it,
    or another replica holds it (``bus.NotYet``: retried past ``ack_wait``)."""


def spec_digest(spec: JobSpec) -> str:
    """The sha256 of ``spec`` as the events carry it: a grant's and the ``job.started``
    that answers it have the same (the runner copies the grant's spec)."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def unlike_its_grant(started: JobStarted, grant: Mapping[str, Any]) -> str | None:
    """Why ``started`` is not the start of the allocation the scheduler granted (``grant``:
    its ``granted_allocations`` row), or None."""
    said = (
        ("job", started.job_id, grant["job_id"]),
        ("node", started.node_id, grant["node_id"]),
        ("attempt", started.attempt, grant["attempt"]),
        ("epoch", started.epoch, grant["epoch"]),
    )
    for field, theirs, granted in said:
        if theirs != granted:
            return (
                f"job.started of allocation {started.allocation_id} says {field} {theirs!r}; "
                f"the scheduler granted it for {field} {granted!r}"
            )
    if spec_digest(started.spec) != grant["spec_sha256"]:
        return (
            f"job.started of allocation {started.allocation_id} (job {started.job_id}) says "
            "another spec than the one the scheduler granted"
        )
    return None


@dataclass(frozen=True)
class Run:
    """One started allocation of a job, as ``job.started`` described it."""

    allocation_id: str
    job_id: str
    attempt: int
    epoch: int
    node_id: str
    started_at: datetime
    spec: JobSpec
    code_version: str
    environment: Environment
    resumed_from: str | None

    @classmethod
    def from_event(cls, event: JobStarted) -> Run:
        return cls(
            allocation_id=event.allocation_id,
            job_id=event.job_id,
            attempt=event.attempt,
            epoch=event.epoch,
            node_id=event.node_id,
            started_at=event.started_at,
            spec=event.spec,
            code_version=event.code_version,
            environment=event.environment,
            resumed_from=event.resumed_from,
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            allocation_id=row["allocation_id"],
            job_id=row["job_id"],
            attempt=row["attempt"],
            epoch=row["epoch"],
            node_id=row["node_id"],
            started_at=row["started_at"],
            spec=JobSpec.model_validate(row["spec"]),
            code_version=row["code_version"],
            environment=Environment.model_validate(row["environment"]),
            resumed_from=row["resumed_from"],
        )


@dataclass(frozen=True)
class RecordedCheckpoint:
    ref: CheckpointRef
    saved_at: datetime
    allocation_id: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RecordedCheckpoint:
        return cls(
            CheckpointRef(
                uri=row["uri"],
                manifest_uri=row["manifest_uri"],
                step=row["step"],
                size_bytes=row["size_bytes"],
                sha256=row["sha256"],
            ),
            row["saved_at"],
            row["allocation_id"],
        )


def next_version(latest: int) -> int:
    """The version after ``latest`` (0 for a model without versions yet)."""
    if latest < 0:
        raise ValueError(f"a model's latest version cannot be {latest}")
    return latest + 1


def latest_checkpoint(recorded: Sequence[RecordedCheckpoint]) -> RecordedCheckpoint | None:
    """The job's newest committed checkpoint: highest step, then the latest saved."""
    return max(recorded, key=lambda c: (c.ref.step, c.saved_at), default=None)


def choose_artifact(
    reported: CheckpointRef | None, recorded: Sequence[RecordedCheckpoint]
) -> CheckpointRef:
    """The checkpoint to register (see the module docstring)."""
    if reported is not None:
        return reported
    newest = latest_checkpoint(recorded)
    if newest is None:
        raise NoArtifact("the job succeeded without reporting any checkpoint")
    return newest.ref


def build_lineage(final: Run, runs: Sequence[Run]) -> Lineage:
    """The lineage of the model made by ``final`` (one of ``runs``, the job's runs)."""
    ordered = sorted(runs, key=lambda r: (r.started_at, r.attempt))
    parents: list[str] = []
    for run in ordered:
        if run.resumed_from is not None and run.resumed_from not in parents:
            parents.append(run.resumed_from)
    return Lineage(
        job_id=final.job_id,
        spec=final.spec,
        code_version=final.code_version,
        dataset=final.spec.dataset,
        seed=final.spec.seed,
        environment=final.environment,
        attempts=max(len({r.allocation_id for r in runs}), 1),
        parent_checkpoints=parents,
    )


@dataclass(frozen=True)
class ModelVersion:
    """One registered version of a model."""

    id: str
    team: str
    model_name: str
    version: int
    job_id: str
    allocation_id: str
    artifact: CheckpointRef
    metrics: dict[str, float]
    lineage: Lineage
    registered_at: datetime
    origin: Origin = "job_success"
    source_uri: str | None = None
    """The committed checkpoint the artifact was copied from (None: registered before the
    registry kept copies; ``artifact`` is then the job's checkpoint itself)."""
    artifact_key: str | None = None
    """The key of the registry's own copy in its store (None for those older versions)."""
    tags: tuple[str, ...] = ()
    description: str = ""
    created_by: str = "registry"
    deleted_at: datetime | None = None
    model_deleted: bool = False
    """Whether its model was deleted: its name may name another model now, whose versions
    are not this one's (lineage tells them apart)."""

    @property
    def owned(self) -> bool:
        """Whether the registry holds its own immutable copy of the artifact."""
        return self.artifact_key is not None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ModelVersion:
        return cls(
            id=str(row["id"]),
            team=row["team"],
            model_name=row["name"],
            version=row["version"],
            job_id=row["job_id"],
            allocation_id=row["allocation_id"],
            artifact=CheckpointRef(
                uri=row["artifact_uri"],
                manifest_uri=row["artifact_manifest_uri"],
                step=row["artifact_step"],
                size_bytes=row["artifact_size_bytes"],
                sha256=row["artifact_sha256"],
            ),
            metrics={k: float(v) for k, v in row["metrics"].items()},
            lineage=Lineage.model_validate(row["lineage"]),
            registered_at=row["registered_at"],
            origin=row["origin"],
            source_uri=row["source_uri"],
            artifact_key=row["artifact_key"],
            tags=tuple(row["tags"]),
            description=row["description"],
            created_by=row["created_by"],
            model_deleted=row.get("model_deleted_at") is not None,
            deleted_at=row["deleted_at"],
        )

    def to_event(self) -> ModelRegistered:
        return ModelRegistered(
            model_version_id=self.id,
            model_name=self.model_name,
            version=self.version,
            team=self.team,
            job_id=self.job_id,
            artifact_uri=self.artifact.uri,
            artifact_sha256=self.artifact.sha256,
            metrics=self.metrics,
            lineage=self.lineage,
        )
