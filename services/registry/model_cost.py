"""Cost per model (docs/models.md, "Cost"): what a model version cost to make — its own
job plus every job upstream of it in its lineage — from billing's ``cost.recorded`` events.

Contract:
- ``record`` keeps one row per allocation in ``allocation_costs`` (migrations/0009), written
  by the registry's consumer inside the inbox's transaction, so a redelivered event is never
  applied twice; a later event of one allocation (billing's correction of its bill: the
  amendment of a lost node's bill, ``cost:<allocation>:amended``, or the bill made the
  platform's, ``cost:<allocation>:platform``, which says 0) replaces the row when its
  ``revision`` is higher, or equal with an end no earlier (billing from before revisions
  said 0 for every event, and an amendment only ever lengthens a bill), and is otherwise a
  no-op, in any order of arrival. Nothing is summed on arrival: the row is the
  allocation's current bill.
- Amounts are exact decimals with 6 places, billing's own rounding: the event carries a
  float, and the shortest decimal that round-trips it (``repr``) is billing's amount for any
  amount under 10^9 (15 significant digits); that decimal is what is stored. A negative or
  non-finite cost is refused (dead-lettered with the reason).
- ``cost_of(conn, version, reader)``: the jobs of the version's upstream lineage graph
  (``lineage.upstream``: its job, the jobs that produced its dataset versions, its parent
  model version's job and that one's upstream, transitively), each with every allocation
  billed for it — every attempt, failed, preempted, restarted or lost, on every node — summed
  per currency. ``own_job`` is the version's job, ``upstream`` the rest, ``total`` both.
  Jobs of teams ``reader`` may not see (another team's: upstream of a granted model or a
  granted dataset, or the own job of a model granted to ``reader``) count in the amounts but
  are not listed (``hidden_jobs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

import asyncpg
from pydantic import BaseModel, ConfigDict

from trainyard_platform.services.registry import lineage
from trainyard_platform.services.registry.domain import ModelVersion
from trainyard_platform.services.registry.schemas import OwnedVersion
from trainyard_platform.shared.bus import Reject
from trainyard_platform.shared.events.payloads import CostRecorded

PLACES = Decimal("0.000001")
ENDED = frozenset({"succeeded", "failed", "cancelled"})


def exact(value: float) -> Decimal:
    """Billing's decimal amount (6 places) behind the float of its event."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{value!r} is not an amount of money")
    return Decimal(repr(value)).quantize(PLACES, rounding=ROUND_HALF_UP)


def money(amount: Decimal) -> str:
    return str(amount.quantize(PLACES, rounding=ROUND_HALF_UP))


async def record(
    conn: asyncpg.Connection, event_id: str, cost: CostRecorded, now: datetime
) -> None:
    """Keep ``cost`` as its allocation's current bill (module docstring)."""
    try:
        amount, seconds = exact(cost.cost), exact(cost.gpu_seconds)
    except ValueError as exc:
        raise Reject(f"cost.recorded of allocation {cost.allocation_id}: {exc}") from None
    await conn.execute(
        """INSERT INTO allocation_costs (allocation_id, job_id, team, gpu_flavor, gpus,
                                         started_at, ended_at, gpu_seconds, cost, currency,
                                         event_id, recorded_at, revision)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
           ON CONFLICT (allocation_id) DO UPDATE
           SET ended_at = EXCLUDED.ended_at, gpu_seconds = EXCLUDED.gpu_seconds,
               cost = EXCLUDED.cost, currency = EXCLUDED.currency,
               event_id = EXCLUDED.event_id, recorded_at = EXCLUDED.recorded_at,
               revision = EXCLUDED.revision
           WHERE (allocation_costs.revision, allocation_costs.ended_at)
                 <= (EXCLUDED.revision, EXCLUDED.ended_at)""",
        cost.allocation_id,
        cost.job_id,
        cost.team,
        cost.gpu_flavor,
        cost.gpus,
        cost.started_at,
        cost.ended_at,
        seconds,
        amount,
        cost.currency,
        event_id,
        now,
        cost.revision,
    )


# --- what a version cost ------------------------------------------------------------------


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class JobCost(_Schema):
    job_id: str
    team: str
    name: str
    status: str
    """Tracking's: ``running``, ``succeeded``, ``failed``, ``cancelled``; ``unknown``."""
    relation: Literal["own", "upstream"]
    allocations: int
    """Allocations billed for it: one per node of each attempt (failed and preempted too)."""
    costs: dict[str, str]
    """Per currency, the sum of those allocations' bills (decimal strings)."""


class CurrencyCost(_Schema):
    currency: str
    total: str
    own_job: str
    upstream: str


class ModelCost(_Schema):
    currency: str | None
    """The currency of every bill in the lineage; null when nothing is billed yet, or when
    bills of several currencies are mixed (then see ``by_currency``)."""
    total: str | None
    own_job: str | None
    upstream: str | None
    by_currency: list[CurrencyCost]
    jobs: list[JobCost]
    """The version's job first, then the upstream jobs, each only if the caller may see it."""
    hidden_jobs: int
    """Jobs of teams the caller may not see: in the amounts, not listed."""
    complete: bool
    """False while a job of the lineage is still running (an allocation is billed when it
    ends) or when the lineage graph was truncated."""


class CostedVersion(OwnedVersion):
    """A version with what it cost to make."""

    cost: ModelCost


@dataclass
class _Sums:
    own: dict[str, Decimal] = field(default_factory=dict)
    upstream: dict[str, Decimal] = field(default_factory=dict)

    def add(self, relation: str, currency: str, amount: Decimal) -> None:
        into = self.own if relation == "own" else self.upstream
        into[currency] = into.get(currency, Decimal(0)) + amount


async def cost_of(conn: asyncpg.Connection, version: ModelVersion, reader: str | None) -> ModelCost:
    """What ``version`` cost to make, as ``reader`` (a team; None: an operator) sees it."""
    graph = await lineage.upstream(conn, version)
    facts = list(graph.jobs.values())
    rows = await conn.fetch(
        """SELECT job_id, currency, count(*) AS allocations, sum(cost) AS cost
           FROM allocation_costs WHERE job_id = ANY($1::text[])
           GROUP BY job_id, currency ORDER BY job_id, currency""",
        [f.job_id for f in facts],
    )
    billed: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        billed.setdefault(row["job_id"], []).append(row)
    sums = _Sums()
    jobs: list[JobCost] = []
    hidden = 0
    for f in sorted(facts, key=lambda f: f.job_id != version.job_id):  # own job first
        relation: Literal["own", "upstream"] = "own" if f.job_id == version.job_id else "upstream"
        mine = billed.get(f.job_id, [])
        for row in mine:
            sums.add(relation, row["currency"], Decimal(row["cost"]))
        # Another team's job is counted, never listed, the version's own job included: a
        # grant opens the model to the grantee, not the work behind it (as in the lineage).
        if reader is not None and f.team != reader:
            hidden += 1
            continue
        jobs.append(
            JobCost(
                job_id=f.job_id,
                team=f.team,
                name=f.name,
                status=f.status,
                relation=relation,
                allocations=sum(int(r["allocations"]) for r in mine),
                costs={r["currency"]: money(Decimal(r["cost"])) for r in mine},
            )
        )
    currencies = sorted({*sums.own, *sums.upstream})
    by_currency = [
        CurrencyCost(
            currency=c,
            total=money(sums.own.get(c, Decimal(0)) + sums.upstream.get(c, Decimal(0))),
            own_job=money(sums.own.get(c, Decimal(0))),
            upstream=money(sums.upstream.get(c, Decimal(0))),
        )
        for c in currencies
    ]
    one = by_currency[0] if len(by_currency) == 1 else None
    nothing = money(Decimal(0)) if not by_currency else None
    return ModelCost(
        currency=one.currency if one else None,
        total=one.total if one else nothing,
        own_job=one.own_job if one else nothing,
        upstream=one.upstream if one else nothing,
        by_currency=by_currency,
        jobs=jobs,
        hidden_jobs=hidden,
        complete=not graph.truncated and all(f.status in ENDED for f in facts),
    )


async def costed(
    conn: asyncpg.Connection, version: ModelVersion, aliases: list[str], reader: str | None
) -> CostedVersion:
    """``OwnedVersion.of(version, aliases)`` with its cost."""
    owned = OwnedVersion.of(version, aliases)
    return CostedVersion(**owned.model_dump(), cost=await cost_of(conn, version, reader))


__all__: Sequence[str] = ["CostedVersion", "ModelCost", "cost_of", "costed", "exact", "record"]
