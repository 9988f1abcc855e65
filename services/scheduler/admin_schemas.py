"""HTTP schemas of the scheduler's admin API (never published as events) and the converters
from rows to views.

Every request body is validated whole (``shared.http_errors.parse_body``); each bad field is
reported with its path (``quotas.a100.nominal``), all at once, answered with 422.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainyard.patterns import pattern_message
from trainyard_platform.services.scheduler.inventory import (
    Capped,
    Claim,
    Declared,
    InventoryMode,
    cap,
)
from trainyard_platform.shared.events.payloads import MAX_NODE_GPUS
from trainyard_platform.shared.http_errors import RequestInvalid

NAME_PATTERN = r"^[a-z][a-z0-9-]{0,39}$"
"""Names of queues, cohorts and priority classes (the same rule as a job's ``priority``)."""
FLAVOR_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
TEAM_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
NODE_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""A node's id, as a runner's (a DNS label: it is a NATS subject token)."""
MAX_GPUS = 1_000_000

Description = Annotated[str, Field(max_length=1000)]
Flavor = Annotated[str, Field(pattern=FLAVOR_PATTERN)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FlavorRequest(_Request):
    """``PUT /v1/admin/flavors/{name}``: declare a flavor before any node of it exists."""

    description: Description = ""


class CordonRequest(_Request):
    """``POST /v1/admin/nodes/{node_id}/cordon``: why the node takes no new work."""

    reason: Annotated[str, Field(min_length=1, max_length=500)]

    @model_validator(mode="after")
    def _reason_says_something(self) -> CordonRequest:
        if not self.reason.strip():
            raise ValueError("reason: must not be blank")
        return self


class NodeDeclarationRequest(_Request):
    """``PUT /v1/admin/node-inventory/{node_id}``: what the node has, which its heartbeats
    cannot exceed (``inventory``)."""

    gpu_flavor: Flavor
    """Its GPUs' flavor (a flavor that exists: ``PUT /v1/admin/flavors/{name}``)."""
    gpu_count: Annotated[int, Field(ge=0, le=MAX_NODE_GPUS)]
    """The most GPUs it is placed on, whatever it claims."""
    topology: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    """Its topology domain (NVLink domain, rack) for gang placement; none: as it says."""
    description: Description = ""


class CohortRequest(_Request):
    """``PUT /v1/admin/cohorts/{name}``."""

    description: Description = ""


class QuotaRequest(_Request):
    nominal: Annotated[int, Field(ge=0, le=MAX_GPUS)]
    """GPUs of the flavor the queue is guaranteed (lent to its cohort while unused)."""
    borrowing_limit: Annotated[int, Field(ge=0, le=MAX_GPUS)] | None = None
    """Most GPUs it may borrow beyond ``nominal`` from its cohort (none: no limit)."""
    lending_limit: Annotated[int, Field(ge=0, le=MAX_GPUS)] | None = None
    """Most of its unused nominal it lends (none: all of it); at most ``nominal``."""

    @model_validator(mode="after")
    def _lending_within_nominal(self) -> QuotaRequest:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise ValueError("lending_limit: must not exceed nominal")
        return self


class QueueRequest(_Request):
    """``PUT /v1/admin/queues/{name}``: a team's queue and its quota per flavor."""

    team: Annotated[str, Field(pattern=TEAM_PATTERN)]
    cohort: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0
    quotas: dict[Flavor, QuotaRequest] = Field(default_factory=dict, max_length=100)

    @model_validator(mode="after")
    def _limits_need_a_cohort(self) -> QueueRequest:
        if self.cohort is None:
            for flavor, quota in self.quotas.items():
                if quota.borrowing_limit is not None or quota.lending_limit is not None:
                    raise ValueError(f"quotas.{flavor}: borrowing and lending limits need a cohort")
        return self


class PriorityClassRequest(_Request):
    """``PUT /v1/admin/priority-classes/{name}``."""

    value: Annotated[int, Field(ge=-1_000_000_000, le=1_000_000_000)]
    """Higher runs first and may preempt lower values in the same queue."""
    preemptible: bool
    min_runtime_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = 0.0
    """A job of the class runs at least this long before it may be preempted."""
    description: Description = ""


class FlavorView(BaseModel):
    name: str
    description: str
    nodes: int
    ready_nodes: int
    gpus: int
    ready_gpus: int


class CohortView(BaseModel):
    name: str
    description: str
    queues: list[str]
    created_at: datetime
    updated_at: datetime


class QuotaView(BaseModel):
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


class QueueConfigView(BaseModel):
    name: str
    team: str
    cohort: str | None
    weight: float
    implicit: bool
    """Made on the team's first submission; may use every ready GPU; replaced by a PUT."""
    quotas: dict[str, QuotaView]


class PriorityClassView(BaseModel):
    name: str
    value: int
    preemptible: bool
    min_runtime_seconds: float
    description: str


class NodeReportView(BaseModel):
    """What the node's latest heartbeat claimed, and when it was heard."""

    gpu_flavor: str
    gpu_count: int
    topology: str
    status: str
    last_heartbeat: datetime


class CappedView(BaseModel):
    field: str
    """``gpu_flavor``, ``gpu_count`` or ``topology``: what its heartbeat claims beyond the
    declaration."""
    message: str


class NodeDeclarationView(BaseModel):
    node_id: str
    gpu_flavor: str
    gpu_count: int
    topology: str | None
    description: str
    reported: NodeReportView | None
    """Its latest heartbeat's claim; None: never heard (or retired)."""
    capped: list[CappedView]
    """Each field of that claim the declaration caps, and what the node gets (empty: none)."""


def queue_request_of(view: QueueConfigView) -> dict[str, Any]:
    """The ``PUT`` body that defines the queue ``view`` shows (what a patch applies to)."""
    return view.model_dump(include={"team", "cohort", "weight", "quotas"})


def check_name(value: str, pattern: str = NAME_PATTERN, field: str = "name") -> str:
    """A path name must match ``pattern``; else 422 naming ``field``, saying what it must be
    in words (``trainyard.patterns``)."""
    if not re.fullmatch(pattern, value):
        raise RequestInvalid.one(field, pattern_message(pattern) or f"must match {pattern}")
    return value


# --- rows to views -----------------------------------------------------------------------


def flavor_view(row: Mapping[str, Any]) -> FlavorView:
    return FlavorView(
        name=row["name"],
        description=row["description"],
        nodes=row["nodes"],
        ready_nodes=row["ready_nodes"],
        gpus=row["gpus"],
        ready_gpus=row["ready_gpus"],
    )


def node_declaration_view(row: Mapping[str, Any]) -> NodeDeclarationView:
    """A declaration with its node's latest claim (``reported_*``, None when never heard)
    and what the declaration caps of it (``inventory.cap``)."""
    reported: NodeReportView | None = None
    capped: tuple[Capped, ...] = ()
    if row["reported_flavor"] is not None:
        claim = Claim(row["reported_flavor"], row["reported_gpu_count"], row["reported_topology"])
        reported = NodeReportView(
            gpu_flavor=claim.gpu_flavor,
            gpu_count=claim.gpu_count,
            topology=claim.topology,
            status=row["status"],
            last_heartbeat=row["last_heartbeat"],
        )
        declared = Declared(row["gpu_flavor"], row["gpu_count"], row["topology"])
        # The mode decides only for an undeclared node.
        capped = cap(claim, declared, InventoryMode.REQUIRED).capped
    return NodeDeclarationView(
        node_id=row["node_id"],
        gpu_flavor=row["gpu_flavor"],
        gpu_count=row["gpu_count"],
        topology=row["topology"],
        description=row["description"],
        reported=reported,
        capped=[_capped_view(c) for c in capped],
    )


def _capped_view(capped: Capped) -> CappedView:
    return CappedView(field=capped.field, message=capped.message)


def cohort_view(row: Mapping[str, Any]) -> CohortView:
    return CohortView(
        name=row["name"],
        description=row["description"],
        queues=list(row["queues"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def queue_config_view(
    row: Mapping[str, Any], quotas: Sequence[Mapping[str, Any]]
) -> QueueConfigView:
    return QueueConfigView(
        name=row["name"],
        team=row["team"],
        cohort=row["cohort"],
        weight=row["weight"],
        implicit=row["implicit"],
        quotas={
            q["flavor"]: QuotaView(
                nominal=q["nominal"],
                borrowing_limit=q["borrowing_limit"],
                lending_limit=q["lending_limit"],
            )
            for q in quotas
            if q["queue"] == row["name"]
        },
    )


def priority_class_view(row: Mapping[str, Any]) -> PriorityClassView:
    return PriorityClassView(
        name=row["name"],
        value=row["value"],
        preemptible=row["preemptible"],
        min_runtime_seconds=row["min_runtime_seconds"],
        description=row["description"],
    )
