"""HTTP schemas of billing's operator API (never published as events), and converters.

Amounts are decimals, serialised as strings so no float rounding creeps in. The usage view
holds job ids, user and team names and spend across teams: an operator endpoint that must
not be exposed publicly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class Totals(_Schema):
    currency: str
    gpu_seconds: Decimal
    cost: Decimal
    allocations: int


class TeamUsage(Totals):
    team: str


class UserUsage(Totals):
    team: str
    user: str


class JobUsage(Totals):
    team: str
    user: str
    job_id: str
    gpu_flavor: str
    first_started_at: datetime
    last_ended_at: datetime


class UsageSummary(_Schema):
    team: str | None
    """The team asked for, or None for every team."""
    teams: list[TeamUsage]
    users: list[UserUsage]
    jobs: list[JobUsage]
    next: str | None = None
    """Pass as ``after`` for the next page of ``jobs``; None when this page is the last."""


def _totals(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "currency": row["currency"],
        "gpu_seconds": row["gpu_seconds"],
        "cost": row["cost"],
        "allocations": row["allocations"],
    }


def usage_summary(
    team: str | None,
    teams: Sequence[Mapping[str, Any]],
    users: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    next_page: str | None = None,
) -> UsageSummary:
    return UsageSummary(
        team=team,
        teams=[TeamUsage(team=r["team"], **_totals(r)) for r in teams],
        users=[UserUsage(team=r["team"], user=r["user_name"], **_totals(r)) for r in users],
        jobs=[
            JobUsage(
                team=r["team"],
                user=r["user_name"],
                job_id=r["job_id"],
                gpu_flavor=r["gpu_flavor"],
                first_started_at=r["first_started_at"],
                last_ended_at=r["last_ended_at"],
                **_totals(r),
            )
            for r in jobs
        ],
        next=next_page,
    )
