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
- An entry has a GPU line and, for a job that declared them, a CPU and a memory line
  (unit-seconds, the price charged or None for none, cost); its ``cost`` is the sum of
  the three lines' costs.
- ``rollup_rows(entries)`` is what ``entries`` add to the rollups: per granularity (hour,
  day, month), bucket and dimensions, the summed ``hour_parts`` of each entry, one row per
  key, in key order (the order every writer locks rollup rows in). Buckets whose amounts
  are all zero are left out.
- ``entry.hour_parts()`` is the entry's ``AMOUNTS`` per UTC hour: each line (GPU, CPU,
  memory: time and cost) split by ``buckets.split_amounts``, and ``cost``, the whole, in
  each hour the sum of its lines' costs there. So every line's hours sum to the line, the
  whole's to the whole, and no hour of a charge has a negative line (``gpu_cost``, the
  whole less the CPU and memory costs, included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from trainyard_platform.services.billing.buckets import UNITS, Unit, roll_up_amounts, split_amounts
from trainyard_platform.services.billing.domain import CpuMemoryLines, Usage

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
class LedgerEntry(CpuMemoryLines):
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
    """The entry's whole amount: its GPU, CPU and memory costs."""
    segment: int = 0
    cpus: int = 0
    memory_gib: int = 0

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
                **part.cpu_memory_lines(),
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
            cpus=usage.cpus,
            memory_gib=usage.memory_gib,
        )

    def reversal(self) -> LedgerEntry:
        """The entry that cancels this charge exactly."""
        if self.kind != "charge":
            raise ValueError(f"only a charge is reversed, not a {self.kind}")
        return replace(
            self,
            kind="reversal",
            gpu_seconds=-self.gpu_seconds,
            cost=-self.cost,
            cpu_seconds=-self.cpu_seconds,
            cpu_cost=-self.cpu_cost,
            memory_gib_seconds=-self.memory_gib_seconds,
            memory_cost=-self.memory_cost,
        )

    @property
    def gpu_cost(self) -> Decimal:
        return self.cost - self.cpu_cost - self.memory_cost

    @property
    def amounts(self) -> tuple[Decimal, ...]:
        """What the entry adds to the rollups, in the order of ``AMOUNTS``."""
        return (
            self.gpu_seconds,
            self.cost,
            self.cpu_seconds,
            self.cpu_cost,
            self.cpu_seconds if self.price_per_cpu_hour is None else Decimal(0),
            self.memory_gib_seconds,
            self.memory_cost,
            self.memory_gib_seconds if self.price_per_memory_gib_hour is None else Decimal(0),
        )

    def hour_parts(self) -> list[tuple[datetime, tuple[Decimal, ...]]]:
        """``AMOUNTS`` per UTC hour (module contract), in order."""
        lines = list(self.amounts)
        lines[_COST] = self.gpu_cost  # the whole is never split beside its own lines
        return [
            (
                hour,
                (
                    *parts[:_COST],
                    sum((parts[i] for i in _LINE_COSTS), Decimal(0)),
                    *parts[_COST + 1 :],
                ),
            )
            for hour, parts in split_amounts(self.started_at, self.ended_at, lines)
        ]

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
            cpus=row["cpus"],
            memory_gib=row["memory_gib"],
            cpu_seconds=Decimal(row["cpu_seconds"]),
            price_per_cpu_hour=_decimal(row["price_per_cpu_hour"]),
            cpu_cost=Decimal(row["cpu_cost"]),
            memory_gib_seconds=Decimal(row["memory_gib_seconds"]),
            price_per_memory_gib_hour=_decimal(row["price_per_memory_gib_hour"]),
            memory_cost=Decimal(row["memory_cost"]),
        )


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(value)


AMOUNTS = (
    "gpu_seconds",
    "cost",
    "cpu_seconds",
    "cpu_cost",
    "unpriced_cpu_seconds",
    "memory_gib_seconds",
    "memory_cost",
    "unpriced_memory_gib_seconds",
)
"""The rollups' amounts (their columns), in the order of ``LedgerEntry.amounts``: ``cost``
is the whole; the ``unpriced_`` ones are the CPU and memory time charged 0 for want of a
price."""


_COST = AMOUNTS.index("cost")
_LINE_COSTS = (_COST, AMOUNTS.index("cpu_cost"), AMOUNTS.index("memory_cost"))
"""Where ``hour_parts`` splits the GPU cost (in the whole's place), and the three line costs
whose sum is the whole's hour part."""


RollupKey = tuple[str, datetime, str, str | None, str, str | None, str, str]
"""(granularity, bucket, team, project, user, queue, flavor, currency)."""


def rollup_sums(entries: Iterable[LedgerEntry]) -> dict[RollupKey, tuple[Decimal, ...]]:
    """Summed ``AMOUNTS`` per rollup key that ``entries`` add."""
    sums: dict[RollupKey, tuple[Decimal, ...]] = {}
    for entry in entries:
        hours = entry.hour_parts()
        unit: Unit
        for unit in UNITS:
            for bucket, parts in hours if unit == "hour" else roll_up_amounts(hours, unit):
                key: RollupKey = (unit, bucket, *entry.dimensions)
                held = sums.get(key)
                sums[key] = (
                    parts
                    if held is None
                    else tuple(h + p for h, p in zip(held, parts, strict=True))
                )
    return sums


def _order(key: RollupKey) -> tuple[Any, ...]:
    return tuple("" if v is None else v for v in key)


def rollup_rows(entries: Iterable[LedgerEntry]) -> list[tuple[Any, ...]]:
    """What ``entries`` add to the rollups (module contract): key, then ``AMOUNTS``."""
    sums = rollup_sums(entries)
    return [
        (*key, *amounts)
        for key, amounts in sorted(sums.items(), key=lambda kv: _order(kv[0]))
        if any(amounts)
    ]
