"""Entries of billing's append-only ledger, and the rollup rows each one adds.

Contract:
- A ``LedgerEntry`` is one change to what an allocation is billed, with every attribution
  dimension: team, project, user, queue, flavor, job (and node, attempt, epoch).
- ``LedgerEntry.charges(usage, attribution, revision)`` is the bill ``usage`` as entries:
  one per segment of it (``Usage.parts``: one per price in force during the allocation,
  numbered ``segment`` 0, 1, ... in time order), each recording the price it used.
  ``entry.reversal()`` cancels an entry exactly (same interval and dimensions, negated
  amounts). An amended bill is a reversal of each charge of the previous revision plus the
  charges of the next revision, so the sum of an allocation's entries is always its current
  bill. ``LedgerEntry.charge`` is the one-segment case.
- ``rollup_rows(entries)`` is what ``entries`` add to the rollups: per granularity (hour,
  day, month), bucket and dimensions, the summed parts of ``buckets.split_hours``, one row
  per key, in key order (the order every writer locks rollup rows in). Buckets whose
  amounts are both zero are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from services.billing.buckets import UNITS, Unit, roll_up, split_hours
from services.billing.domain import Usage

Kind = Literal["charge", "reversal"]


@dataclass(frozen=True)
class Attribution:
    """What the allocation's grant said beyond its release: None where it did not say."""

    project: str | None = None
    queue: str | None = None
    attempt: int | None = None
    epoch: int | None = None

    @classmethod
    def from_announced(cls, row: Mapping[str, Any]) -> Attribution:
        return cls(
            project=row["project"], queue=row["queue"], attempt=row["attempt"], epoch=row["epoch"]
        )


@dataclass(frozen=True)
class LedgerEntry:
    allocation_id: str
    revision: int
    kind: Kind
    job_id: str
    team: str
    project: str | None
    user: str
    queue: str | None
    gpu_flavor: str
    node_id: str
    attempt: int | None
    epoch: int | None
    gpus: int
    started_at: datetime
    ended_at: datetime
    outcome: str
    gpu_seconds: Decimal
    price_per_gpu_hour: Decimal
    currency: str
    cost: Decimal
    segment: int = 0

    @classmethod
    def charges(cls, usage: Usage, attribution: Attribution, revision: int) -> list[LedgerEntry]:
        """The bill as one charge per segment (module contract)."""
        whole = cls.charge(usage, attribution, revision)
        return [
            replace(
                whole,
                segment=i,
                started_at=part.started_at,
                ended_at=part.ended_at,
                gpu_seconds=part.gpu_seconds,
                price_per_gpu_hour=part.price_per_gpu_hour,
                currency=part.currency,
                cost=part.cost,
            )
            for i, part in enumerate(usage.parts)
        ]

    @classmethod
    def charge(cls, usage: Usage, attribution: Attribution, revision: int) -> LedgerEntry:
        """The whole bill as one charge (segment 0)."""
        return cls(
            allocation_id=usage.allocation_id,
            revision=revision,
            kind="charge",
            job_id=usage.job_id,
            team=usage.team,
            project=attribution.project,
            user=usage.user,
            queue=attribution.queue,
            gpu_flavor=usage.gpu_flavor,
            node_id=usage.node_id,
            attempt=attribution.attempt,
            epoch=attribution.epoch,
            gpus=usage.gpus,
            started_at=usage.started_at,
            ended_at=usage.ended_at,
            outcome=usage.outcome,
            gpu_seconds=usage.gpu_seconds,
            price_per_gpu_hour=usage.price_per_gpu_hour,
            currency=usage.currency,
            cost=usage.cost,
        )

    def reversal(self) -> LedgerEntry:
        """The entry that cancels this charge exactly."""
        if self.kind != "charge":
            raise ValueError(f"only a charge is reversed, not a {self.kind}")
        return replace(self, kind="reversal", gpu_seconds=-self.gpu_seconds, cost=-self.cost)

    @property
    def dimensions(self) -> tuple[str, str | None, str, str | None, str, str]:
        """The rollups' key beyond granularity and bucket."""
        return (
            self.team,
            self.project,
            self.user,
            self.queue,
            self.gpu_flavor,
            self.currency,
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LedgerEntry:
        return cls(
            allocation_id=row["allocation_id"],
            revision=row["revision"],
            kind=row["kind"],
            job_id=row["job_id"],
            team=row["team"],
            project=row["project"],
            user=row["user_name"],
            queue=row["queue"],
            gpu_flavor=row["gpu_flavor"],
            node_id=row["node_id"],
            attempt=row["attempt"],
            epoch=row["epoch"],
            gpus=row["gpus"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            outcome=row["outcome"],
            gpu_seconds=Decimal(row["gpu_seconds"]),
            price_per_gpu_hour=Decimal(row["price_per_gpu_hour"]),
            currency=row["currency"],
            cost=Decimal(row["cost"]),
            segment=row["segment"],
        )


RollupKey = tuple[str, datetime, str, str | None, str, str | None, str, str]
"""(granularity, bucket, team, project, user, queue, flavor, currency)."""


def rollup_sums(entries: Iterable[LedgerEntry]) -> dict[RollupKey, tuple[Decimal, Decimal]]:
    """Summed (GPU-seconds, cost) per rollup key that ``entries`` add."""
    sums: dict[RollupKey, tuple[Decimal, Decimal]] = {}
    for entry in entries:
        hours = split_hours(entry.started_at, entry.ended_at, entry.gpu_seconds, entry.cost)
        unit: Unit
        for unit in UNITS:
            for part in hours if unit == "hour" else roll_up(hours, unit):
                key: RollupKey = (unit, part.bucket, *entry.dimensions)
                secs, cost = sums.get(key, (Decimal(0), Decimal(0)))
                sums[key] = (secs + part.gpu_seconds, cost + part.cost)
    return sums


def _order(key: RollupKey) -> tuple[Any, ...]:
    return tuple("" if v is None else v for v in key)


def rollup_rows(entries: Iterable[LedgerEntry]) -> list[tuple[Any, ...]]:
    """What ``entries`` add to the rollups (module contract)."""
    sums = rollup_sums(entries)
    return [
        (*key, secs, cost)
        for key, (secs, cost) in sorted(sums.items(), key=lambda kv: _order(kv[0]))
        if secs or cost
    ]
