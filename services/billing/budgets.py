"""Budgets' pure rules: UTC months, thresholds reached, and the burn-rate forecast.

Contract:
- A budget is an amount of money per UTC month for a team (project None) or a team's
  project, with thresholds in percent of the amount (default 50, 80, 100) and an admission
  policy (``refuse``, ``deprioritize`` or ``warn``) that submission applies once it is spent,
  and what the scheduler does with its running jobs then (``on_exhausted``: ``finish`` or
  ``stop``).
- ``reached(amount, spent, thresholds)``: the thresholds that ``spent`` has reached
  (``spent >= amount x t / 100``), ascending.
- ``forecast(amount, spent, now)``: when the budget runs out if spending goes on at the
  month's average rate so far (``spent`` / time elapsed since the month began); None when
  nothing is spent yet, when it is spent already, or when at that rate it lasts the month.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from trainyard_platform.services.billing.domain import decimal_text, money
from trainyard_platform.shared.events.payloads import BudgetOnExhausted, BudgetPolicy

DEFAULT_THRESHOLDS = (50, 80, 100)
MAX_AMOUNT = Decimal("1e15")


def month_start(at: datetime) -> datetime:
    """The first instant of ``at``'s UTC month."""
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def next_month(start: datetime) -> datetime:
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def month_label(start: datetime) -> str:
    return f"{start.year:04d}-{start.month:02d}"


def reached(amount: Decimal, spent: Decimal, thresholds: tuple[int, ...]) -> list[int]:
    """The thresholds (percent of ``amount``) that ``spent`` has reached, ascending."""
    return sorted(t for t in thresholds if spent * 100 >= amount * t)


def forecast(amount: Decimal, spent: Decimal, now: datetime) -> datetime | None:
    """When the budget runs out at this month's rate so far (module contract)."""
    start = month_start(now)
    elapsed = Decimal((now - start).total_seconds())
    if spent <= 0 or spent >= amount or elapsed <= 0:
        return None
    seconds_left = (amount - spent) * elapsed / spent
    end = next_month(start)
    if seconds_left >= Decimal((end - now).total_seconds()):
        return None
    return now + timedelta(seconds=float(seconds_left))


class BudgetRequest(BaseModel):
    """``PUT /v1/budgets/{team}[/{project}]``: a monthly budget, in billing's currency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    amount: Annotated[
        Decimal,
        BeforeValidator(decimal_text),
        Field(gt=0, le=MAX_AMOUNT, decimal_places=6),
        AfterValidator(money),
    ]
    """Money per UTC month (a decimal string or number), in billing's currency."""
    thresholds: Annotated[list[Annotated[int, Field(ge=1, le=1000)]], Field(max_length=20)] = Field(
        default_factory=lambda: list(DEFAULT_THRESHOLDS)
    )
    """Percent of ``amount`` at which ``budget.threshold_crossed`` is said (once each per
    month)."""
    policy: BudgetPolicy = "warn"
    """What submission does with a new job once the budget is spent: ``refuse`` it (409),
    ``deprioritize`` it (its priority class becomes ``low``), or ``warn`` (accepted, with a
    warning)."""
    on_exhausted: BudgetOnExhausted = "finish"
    """What the scheduler does with the budget's running jobs once it is spent: let them
    ``finish``, or ``stop`` them (checkpoint and stop, as a preemption that is not a
    failure; they wait queued, held, until the budget is raised or the month ends)."""

    @field_validator("thresholds")
    @classmethod
    def _distinct(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("each threshold at most once")
        return sorted(value)


@dataclass(frozen=True)
class Budget:
    team: str
    project: str | None
    amount: Decimal
    currency: str
    thresholds: tuple[int, ...]
    policy: BudgetPolicy
    revision: int
    updated_by: str
    updated_at: datetime
    on_exhausted: BudgetOnExhausted = "finish"


def reserves(budget: Budget) -> bool:
    """Whether the scheduler reserves the worst case of each job of ``budget``'s team (or
    project) against it: when its spent state holds queued jobs (policy ``refuse``, or
    ``on_exhausted`` ``stop``; the scheduler's ``budget_holds.holds_queued``), so that jobs
    started together cannot spend past it. Under ``warn`` or ``deprioritize`` with
    ``finish`` a spent budget lets jobs run: it bounds nothing, and nothing is reserved."""
    return budget.policy == "refuse" or budget.on_exhausted == "stop"


def request_of(budget: Budget) -> dict[str, Any]:
    """The ``PUT`` body, as JSON values, that defines ``budget`` (what a patch applies to)."""
    return {
        "amount": str(budget.amount),
        "thresholds": list(budget.thresholds),
        "policy": budget.policy,
        "on_exhausted": budget.on_exhausted,
    }


Scope = Literal["team", "project"]
