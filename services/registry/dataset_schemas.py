"""HTTP schemas of the dataset API (``dataset_api``): what callers send and read."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.services.registry.dataset_repository import DatasetVersion

URI_PATTERN = r"^[A-Za-z][A-Za-z0-9+.-]{0,31}:[^\s\x00-\x1f\x7f]+$"
"""A URI on one line (``s3://bucket/key``, ``https://...``, ``file:///...``): the registry
records it and never opens it."""


class DatasetVersionRequest(BaseModel):
    """``POST /v1/datasets/{team}/{name}/versions``: a new, immutable version."""

    model_config = ConfigDict(extra="forbid")

    uri: str = Field(min_length=3, max_length=2000, pattern=URI_PATTERN)
    """Where the data is."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The content hash of the data (lower-case hex)."""
    size_bytes: int = Field(ge=0, le=2**63 - 1)
    data_schema: dict[str, Any] = Field(default_factory=dict)
    """The data's schema, any JSON object (columns and types, a JSON Schema, ...)."""
    feature_version: str = Field(default="", max_length=200, pattern=r"^[\x20-\x7e]*$")
    """The version of the code that turned raw data into these features (a commit, a tag)."""
    producing_job_id: str | None = Field(default=None, min_length=1, max_length=200)
    """The job of the dataset's team that produced the data, if one did."""


DATASET_GRANTEE_NULL = "null to a team the dataset is granted to: the owner's work, not the data"


class DatasetVersionRead(BaseModel):
    """One version; the job that produced it and who added it are null to a grantee
    (``grantee_view``): a grant opens the data, not the owner's work."""

    OWNER_ONLY: ClassVar[frozenset[str]] = frozenset({"producing_job_id", "created_by"})

    team: str
    name: str
    version: int
    reference: str
    """``team/name:version``: how a job spec names this version."""
    uri: str
    sha256: str
    size_bytes: int
    data_schema: dict[str, Any]
    feature_version: str
    producing_job_id: str | None = Field(description=DATASET_GRANTEE_NULL)
    created_at: datetime
    created_by: str | None = Field(description=DATASET_GRANTEE_NULL)

    @classmethod
    def of(cls, v: DatasetVersion) -> DatasetVersionRead:
        return cls(
            team=v.team,
            name=v.name,
            version=v.version,
            reference=v.reference,
            uri=v.uri,
            sha256=v.sha256,
            size_bytes=v.size_bytes,
            data_schema=v.schema if isinstance(v.schema, dict) else {},
            feature_version=v.feature_version,
            producing_job_id=v.producing_job_id,
            created_at=v.created_at,
            created_by=v.created_by,
        )


class DatasetSummary(BaseModel):
    team: str
    name: str
    latest_version: int
    created_at: datetime


class DatasetPage(BaseModel):
    datasets: list[DatasetSummary]
    next: str | None = None
    """The cursor (``shared.paging``) to pass as ``after`` for the next page; null on the
    last one."""


class DatasetDetail(DatasetSummary):
    OWNER_ONLY: ClassVar[frozenset[str]] = frozenset({"grants"})

    versions: list[DatasetVersionRead]
    grants: list[str] | None = Field(description=DATASET_GRANTEE_NULL)
    """The teams granted read access (shown to the owning team and operators only)."""
    next: str | None = None
    """Pass as ``after`` for the next page of ``versions``; None when this page is the last."""


class GrantChange(BaseModel):
    team: str
    name: str
    grantee_team: str
    granted: bool
    """Whether the grantee may read the dataset now."""
    changed: bool
    """False when it already could (PUT) or already could not (DELETE)."""
