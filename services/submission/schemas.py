"""HTTP schemas of the submission API: what users send and what they read.

These are not wire events: ``JobRequest`` is turned into the wire ``JobSpec`` by
``to_spec`` after the caller's identity is known, and nothing here is ever published.

Validation errors are reported in the shared shape (``shared.http_errors``): every bad field
by its path (``hyperparameters.lr``, ``args[2]``), all at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from services.submission.domain import JobStatus
from shared.events.payloads import HyperValue, JobSpec
from shared.http_errors import FieldError, RequestInvalid, field_errors

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
PRIORITY_PATTERN = r"^[a-z][a-z0-9-]{0,39}$"
"""A priority class name; the scheduler's operators define the classes (``low``, ``normal``
and ``high`` exist from the start). A name no class has keeps the job pending, with that
reason, until an operator defines it."""
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,200}")
MAX_SEED = 2**32 - 1  # the widest seed every RNG a job may use (numpy's included) accepts


def _hyper_value(value: object) -> HyperValue:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if isinstance(value, bool | int | float | str):
        return value
    raise ValueError("must be a number, a string or a boolean")


Name = Annotated[str, Field(min_length=1, max_length=100, pattern=NAME_PATTERN)]
Hyper = Annotated[HyperValue, PlainValidator(_hyper_value)]


class JobRequest(BaseModel):
    """The body of ``POST /v1/jobs``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Name
    team: Name | None = None
    """Defaults to the caller's team; any other team is refused (403)."""
    entrypoint: Annotated[str, Field(max_length=300, pattern=ENTRYPOINT_PATTERN)]
    """Python module the runner starts, e.g. ``examples.digits_cnn``."""
    args: list[Annotated[str, Field(max_length=10_000)]] = Field(
        default_factory=list, max_length=1000
    )
    gpus: Annotated[int, Field(ge=1, le=64)]
    gpu_flavor: str
    hyperparameters: dict[Annotated[str, Field(min_length=1, max_length=200)], Hyper] = Field(
        default_factory=dict, max_length=1000
    )
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    max_runtime_seconds: Annotated[int, Field(ge=1, le=604_800)] = 3600
    dataset: Annotated[str, Field(min_length=1, max_length=1000)] | None = None
    max_restarts: Annotated[int, Field(ge=0, le=20)] = 3
    priority: Annotated[str, Field(pattern=PRIORITY_PATTERN)] = "normal"
    """Name of the job's priority class (see ``PRIORITY_PATTERN``)."""

    @field_validator("gpu_flavor")
    @classmethod
    def _known_flavor(cls, value: str, info: ValidationInfo) -> str:
        flavors: Sequence[str] | None = (info.context or {}).get("flavors")
        if flavors is not None and value not in flavors:
            raise ValueError(f"unknown flavor {value!r}; allowed: {', '.join(flavors)}")
        return value

    def to_spec(self, user: str, team: str) -> JobSpec:
        """The wire spec, as submitted by ``user`` of ``team``."""
        fields = self.model_dump(exclude={"team"})
        return JobSpec(**fields, user=user, team=team)


class CreateUserRequest(BaseModel):
    """The body of ``POST /v1/admin/users``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Name
    team: Name | None = None
    """Defaults to the admin's team; admins create users in their own team only."""
    role: Literal["admin", "member"] = "member"


class UserCreated(BaseModel):
    user: str
    team: str
    role: str
    token: str
    """Shown once; only its hash is stored."""


class HistoryEntry(BaseModel):
    status: JobStatus
    at: datetime
    reason: str | None = None


class PendingView(BaseModel):
    reason: str | None
    position: int | None
    estimated_start: datetime | None
    blocking: str | None = None
    """Who or what holds what the job needs (jobs, a queue, a quota)."""
    suggestion: str | None = None
    """What would let the job start now, e.g. "ask for 4 GPUs"."""


class FailureView(BaseModel):
    reason: str
    exit_code: int | None = None
    log_tail: str = ""


class CheckpointView(BaseModel):
    step: int
    uri: str
    sha256: str
    size_bytes: int
    saved_at: datetime


class ModelView(BaseModel):
    name: str
    version: int
    artifact_uri: str
    artifact_sha256: str
    metrics: dict[str, float | None]
    lineage: dict[str, Any]


class CostView(BaseModel):
    gpu_seconds: float
    cost: float
    currency: str | None
    price_per_gpu_hour: float | None
    """Effective price: total cost over total GPU-hours."""
    final: bool
    """The job has ended and every allocation it held has been billed."""


class JobView(BaseModel):
    """One job as its team sees it."""

    id: str
    name: str
    team: str
    user: str
    spec: dict[str, Any]
    status: JobStatus
    terminal: bool
    history: list[HistoryEntry]
    pending: PendingView | None
    node: str | None
    gpu_indices: list[int]
    attempt: int | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    cancel_requested: bool
    failure: FailureView | None
    step: int | None
    metrics: dict[str, float | None]
    checkpoints: list[CheckpointView]
    model: ModelView | None
    cost: CostView


def parse_job_request(body: bytes, flavors: Sequence[str]) -> JobRequest:
    """Validate a ``POST /v1/jobs`` body; raise ``RequestInvalid`` naming every bad field."""
    try:
        return JobRequest.model_validate_json(body, context={"flavors": list(flavors)})
    except ValidationError as exc:
        raise RequestInvalid(field_errors(exc), "invalid job spec") from None


def parse_idempotency_key(value: str | None) -> str | None:
    """The ``Idempotency-Key`` header: absent, or 1-200 printable ASCII characters."""
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(value):
        error = FieldError(
            field="Idempotency-Key", message="must be 1-200 printable ASCII characters"
        )
        raise RequestInvalid([error], "invalid Idempotency-Key header")
    return value


class JobSummary(BaseModel):
    """One line of ``GET /v1/jobs``."""

    id: str
    name: str
    team: str
    user: str
    status: JobStatus
    terminal: bool
    gpu_flavor: str
    gpus: int
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    node: str | None
    attempt: int | None
    step: int | None
    cost: float
    currency: str | None
