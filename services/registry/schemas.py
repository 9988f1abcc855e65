"""HTTP schemas of the registry's read API (never published as events), and converters."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.services.registry.domain import ModelVersion
from trainyard_platform.shared.events.payloads import CheckpointRef, Lineage


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


GRANTEE_NULL = "null to a team the model is granted to: the owner's work, not the model"
"""The OpenAPI description of every field in an ``OWNER_ONLY``."""


class Artifact(_Schema):
    """The model's weights: a checkpoint any ``torch.load`` opens, and its manifest.

    ``manifest_uri`` is the manifest of the job's checkpoint it was copied from: the owner's,
    null to a team the model is granted to (``grantee_view``), as is ``uri`` when it is not
    the registry's own copy."""

    OWNER_ONLY: ClassVar[frozenset[str]] = frozenset({"manifest_uri"})

    uri: str | None = Field(
        description="the registry's own copy; a version without one (owned false) names the "
        "owner's checkpoint here, null to a team the model is granted to"
    )
    manifest_uri: str | None = Field(description=GRANTEE_NULL)
    step: int
    size_bytes: int
    sha256: str

    @classmethod
    def from_ref(cls, ref: CheckpointRef) -> Artifact:
        return cls.model_validate(ref.model_dump())


class VersionSummary(_Schema):
    """A version as its list shows it; ``job_id`` is null to a grantee (``grantee_view``)."""

    OWNER_ONLY: ClassVar[frozenset[str]] = frozenset({"job_id"})

    id: str
    team: str
    model: str
    version: int
    job_id: str | None = Field(description=GRANTEE_NULL)
    artifact: Artifact
    metrics: dict[str, float]
    registered_at: datetime
    owned: bool
    """Whether the registry holds its own immutable copy (only such versions download)."""

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
            owned=version.owned,
        )


class VersionList(_Schema):
    team: str
    model: str
    versions: list[VersionSummary]
    next: str | None = None
    """Pass as ``after`` for the next page; None when this page is the last."""


class VersionDetail(VersionSummary):
    """A version with everything needed to reproduce it (its owner's: null to a grantee)."""

    OWNER_ONLY: ClassVar[frozenset[str]] = VersionSummary.OWNER_ONLY | {"allocation_id", "lineage"}

    allocation_id: str | None = Field(description=GRANTEE_NULL)
    lineage: Lineage | None = Field(description=GRANTEE_NULL)

    @classmethod
    def from_domain(cls, version: ModelVersion) -> VersionDetail:
        summary = VersionSummary.from_domain(version)
        return cls(
            **summary.model_dump(),
            allocation_id=version.allocation_id,
            lineage=version.lineage,
        )


# --- the model lifecycle (``model_api``) ---------------------------------------------------

MAX_TAGS = 20
MAX_DESCRIPTION = 10_000


class RegisterRequest(BaseModel):
    """``POST /v1/models/{team}/{name}/versions``: register a committed checkpoint."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(min_length=1, max_length=200)
    """A job of the model's team (the caller's, unless an operator calls)."""
    checkpoint_uri: str | None = Field(default=None, min_length=1, max_length=2000)
    """One of the job's committed checkpoints (``checkpoint.saved``); default: its latest."""
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS)
    metrics: dict[Annotated[str, Field(min_length=1, max_length=200)], float] = Field(
        default_factory=dict, max_length=200
    )
    """Overrides of the job's final metric values (tracking's), key by key."""


class AliasRequest(BaseModel):
    """``PUT /v1/models/{team}/{name}/aliases/{alias}``: where the alias points now."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=2**31 - 1)


class OwnedVersion(VersionDetail):
    """A version with its registration details (who and from which checkpoint: null to a
    grantee)."""

    OWNER_ONLY: ClassVar[frozenset[str]] = VersionDetail.OWNER_ONLY | {"source_uri", "created_by"}

    origin: str
    source_uri: str | None = Field(description=GRANTEE_NULL)
    tags: list[str]
    description: str
    created_by: str | None = Field(description=GRANTEE_NULL)
    aliases: list[str]

    @classmethod
    def of(cls, version: ModelVersion, aliases: list[str]) -> OwnedVersion:
        detail = VersionDetail.from_domain(version)
        return cls(
            **detail.model_dump(),
            origin=version.origin,
            source_uri=version.source_uri,
            tags=list(version.tags),
            description=version.description,
            created_by=version.created_by,
            aliases=aliases,
        )


class ModelSummary(_Schema):
    """A model as its listing shows it; ``project`` (that of the job that made its first
    version: the owner's work) is null to a grantee (``grantee_view``)."""

    OWNER_ONLY: ClassVar[frozenset[str]] = frozenset({"project"})

    team: str
    name: str
    project: str | None = Field(description=GRANTEE_NULL)
    latest_version: int
    """The highest version number ever given (deleted versions keep theirs)."""
    versions: int
    """How many versions are not deleted."""
    aliases: dict[str, int]
    created_at: datetime


class ModelPage(_Schema):
    models: list[ModelSummary]
    next: str | None
    """Pass as ``after`` for the next page; None on the last."""


class AliasList(_Schema):
    team: str
    model: str
    aliases: dict[str, int]
    """A page of them, by name."""
    next: str | None = None
    """Pass as ``after`` for the next page; None when this page is the last."""


class AliasMoveRead(_Schema):
    """One move of an alias; who moved it (``actor``) is null to a grantee."""

    OWNER_ONLY: ClassVar[frozenset[str]] = frozenset({"actor"})

    alias: str
    from_version: int | None
    to_version: int | None
    actor: str | None = Field(description=GRANTEE_NULL)
    at: datetime


class AliasRead(_Schema):
    """``GET /v1/models/{team}/{name}/aliases/{alias}``: where the alias points (its
    ``ETag`` in the header)."""

    team: str
    model: str
    alias: str
    version: int


class AliasChange(_Schema):
    """The answer to a move or a deletion of an alias."""

    team: str
    model: str
    alias: str
    version: int | None
    previous: int | None


class AliasHistory(_Schema):
    team: str
    model: str
    alias: str
    moves: list[AliasMoveRead]
    next: str | None = None
    """Pass as ``after`` for the next page; None when this page is the last."""


class Download(_Schema):
    """Where to GET a version's bytes: a presigned URL of its one object (S3), or the
    registry's own ``.../content`` route (a local store), which needs the caller's token."""

    url: str
    needs_token: bool
    expires_in_s: int | None
    sha256: str
    size_bytes: int


class Freed(_Schema):
    """What deleting a version freed."""

    team: str
    model: str
    version: int
    objects: int
    bytes: int


class ModelDeleted(_Schema):
    """What deleting a model did: its name is free, its versions stay tombstones."""

    team: str
    model: str
    tombstones: int
    """Its deleted versions, kept for the lineage that names them (their objects were
    freed as each was deleted; what a failed free left, the storage collector frees)."""
