"""HTTP schemas of the registry's read API (never published as events), and converters."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from services.registry.domain import ModelVersion
from shared.events.payloads import CheckpointRef, Lineage


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class Artifact(_Schema):
    """The model's weights: a checkpoint any ``torch.load`` opens, and its manifest."""

    uri: str
    manifest_uri: str
    step: int
    size_bytes: int
    sha256: str

    @classmethod
    def from_ref(cls, ref: CheckpointRef) -> Artifact:
        return cls.model_validate(ref.model_dump())


class VersionSummary(_Schema):
    id: str
    team: str
    model: str
    version: int
    job_id: str
    artifact: Artifact
    metrics: dict[str, float]
    registered_at: datetime

    @classmethod
    def from_domain(cls, version: ModelVersion) -> VersionSummary:
        return cls(
            id=version.id,
            team=version.team,
            model=version.model_name,
            version=version.version,
            job_id=version.job_id,
            artifact=Artifact.from_ref(version.artifact),
            metrics=version.metrics,
            registered_at=version.registered_at,
        )


class VersionList(_Schema):
    team: str
    model: str
    versions: list[VersionSummary]


class VersionDetail(VersionSummary):
    """A version with everything needed to reproduce it."""

    allocation_id: str
    lineage: Lineage

    @classmethod
    def from_domain(cls, version: ModelVersion) -> VersionDetail:
        summary = VersionSummary.from_domain(version)
        return cls(
            **summary.model_dump(),
            allocation_id=version.allocation_id,
            lineage=version.lineage,
        )
