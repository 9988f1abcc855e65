"""HTTP schemas of billing's price book, cost estimate and budget routes, and their views."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from trainyard_platform.services.billing.domain import decimal_text, plain
from trainyard_platform.shared.events.payloads import (
    MAX_CPUS_PER_GPU,
    MAX_JOB_GPUS,
    MAX_JOB_RESTARTS,
    MAX_JOB_RUNTIME_SECONDS,
    MAX_MEMORY_GIB_PER_GPU,
)

MAX_PRICE = Decimal("1e9")


Amount = Annotated[
    Decimal,
    BeforeValidator(decimal_text),
    Field(ge=0, le=MAX_PRICE, decimal_places=6),
    AfterValidator(plain),
]


def _in_utc(value: datetime) -> datetime:
    """``value`` in UTC; a date whose offset carries it before year 1 or past 9999 in UTC
    (``0001-01-01T00:00:00+14:00``) is refused, never left to overflow later."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range: in UTC it falls before year 1 or after 9999") from None


UtcInstant = Annotated[AwareDatetime, AfterValidator(_in_utc)]


class PriceRequest(BaseModel):
    """``PUT /v1/prices/{flavor}``: a price per GPU-hour, per CPU-hour and/or per GiB-hour
    of memory (at least one), all from ``effective_from`` (default: now as the change is
    made, or the latest end of the flavor's usage billed already when that is later, or the
    beginning for a flavor's first price; never in the past nor before usage billed), in
    billing's currency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    price_per_gpu_hour: Amount | None = None
    price_per_cpu_hour: Amount | None = None
    price_per_memory_gib_hour: Amount | None = None
    effective_from: UtcInstant | None = None


class PriceView(BaseModel):
    """A price of the book (``GET``: one row per price, the one of its resource set) or the
    prices one ``PUT`` set."""

    flavor: str
    effective_from: datetime
    price_per_gpu_hour: Decimal | None
    price_per_cpu_hour: Decimal | None = None
    price_per_memory_gib_hour: Decimal | None = None
    currency: str
    set_by: str
    in_force: bool
    """Whether this is the flavor's price now (a later ``effective_from`` is scheduled)."""


class EstimateRequest(BaseModel):
    """``POST /v1/costs/estimate``: a job spec (as ``POST /v1/jobs`` takes it); only its
    resources (GPUs, flavor, CPUs and memory per GPU) and limits are read, the rest is
    ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    gpus: Annotated[int, Field(ge=1, le=MAX_JOB_GPUS)]
    gpu_flavor: Annotated[str, Field(min_length=1, max_length=100)]
    max_runtime_seconds: Annotated[int, Field(ge=1, le=MAX_JOB_RUNTIME_SECONDS)] = 3600
    max_restarts: Annotated[int, Field(ge=0, le=MAX_JOB_RESTARTS)] = 3
    cpus_per_gpu: Annotated[int, Field(ge=0, le=MAX_CPUS_PER_GPU)] = 0
    memory_gib_per_gpu: Annotated[int, Field(ge=0, le=MAX_MEMORY_GIB_PER_GPU)] = 0


class Estimate(BaseModel):
    gpu_flavor: str
    gpus: int
    max_runtime_seconds: int
    currency: str
    price_per_gpu_hour: Decimal
    """The price in force now (a scheduled change within the runtime is priced too)."""
    gpu_seconds: Decimal
    """GPUs x the longest attempt: one that runs until it is stopped at its
    ``max_runtime_seconds`` and killed after the kill grace (``shared.worst_case``)."""
    estimated_cost: Decimal
    """The most one attempt costs: its limit and the kill grace."""
    worst_case_cost: Decimal
    """Every restart used, each running to the limit: ``(1 + max_restarts)`` attempts. The
    scheduler's retries after the platform's failures are not counted: such attempts are
    charged to the platform, not the team. Preempted attempts are charged and not counted:
    how often a job is preempted is not known ahead."""
    priced_at: datetime


class BudgetView(BaseModel):
    team: str
    project: str | None
    amount: Decimal
    currency: str
    thresholds: list[int]
    policy: str
    on_exhausted: str
    """What a spent budget does with its running jobs: ``finish`` or ``stop``."""
    month: str
    """The current UTC month, ``YYYY-MM``."""
    spent: Decimal
    """Billed this month so far (allocations are billed when they end)."""
    remaining: Decimal
    percent_spent: Decimal
    """``spent`` in percent of ``amount``, to 2 places, cut (never rounded up): 100.00 only
    once ``exhausted``, and a threshold's percent only once it is reached."""
    exhausted: bool
    runs_out_at: datetime | None
    """At this month's rate so far, when the budget runs out (None: not this month, or
    spent already)."""
    forecast: str
    updated_by: str
    updated_at: datetime
