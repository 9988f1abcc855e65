"""The price book with effective dates, and pricing an interval by it.

Contract:
- A ``PriceSchedule`` holds, per flavor, prices each with the instant it takes effect; a
  price applies from its ``effective_from`` until the next price of the flavor takes effect.
- ``PriceSchedule.segments(flavor, gpus, start, end)`` prices ``[start, end)``: one
  ``Segment`` per price in force during it, split exactly at each change, in time order;
  each segment's cost is its GPU-seconds x its price, rounded half-up to 6 places on its
  own (``domain.cost``), so an interval's cost is the sum of its segments' costs. An
  interval of no time is one segment at the price in force at ``start``.
- It raises ``UnknownFlavor`` when the flavor has no price in force at ``start`` (no price
  at all, or only prices that take effect later): billing dead-letters such a release
  rather than bill it at a made-up price.
- One currency per book (billing's ``currency`` setting): a schedule of several currencies
  is refused when built, and billing refuses to start when its book or its budgets hold
  another currency than the setting (``currency_refusal``), rather than refuse every
  release and fail every budget check after.
- CPU and memory (``RESOURCES``) have dated prices of their own per flavor
  (``DatedResourcePrice``: per CPU-hour, per GiB-hour), by the same rule.
  ``segments(..., cpus, memory_gib)`` also splits at each change of the price of a resource
  the allocation holds (``cpus`` or ``memory_gib`` > 0), so every segment has one price per
  line; each line's cost is rounded on its own and the segment's ``cost`` is their sum. A
  flavor with no CPU (memory) price in force at a segment's start charges its CPU (memory)
  time 0, with the price None: never an error, the GPU price alone is required.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from itertools import pairwise
from typing import Literal

from trainyard_platform.services.billing.domain import (
    Price,
    PriceBook,
    Segment,
    UnknownFlavor,
    cost,
    duration_seconds,
    gpu_seconds,
)

Resource = Literal["cpu", "memory"]
RESOURCES: tuple[Resource, ...] = ("cpu", "memory")
"""What is priced besides GPUs: CPU-hours and GiB-hours of memory."""

BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
"""The effective date of a price that applies to all usage (the settings' bootstrap)."""


@dataclass(frozen=True)
class DatedPrice:
    effective_from: datetime
    price: Price


@dataclass(frozen=True)
class DatedResourcePrice:
    """A flavor's price per CPU-hour (``cpu``) or per GiB-hour (``memory``) from a date."""

    flavor: str
    resource: Resource
    effective_from: datetime
    per_unit_hour: Decimal
    currency: str

    def __post_init__(self) -> None:
        if not self.per_unit_hour.is_finite() or self.per_unit_hour < 0:
            raise ValueError(
                f"{self.resource} price of {self.flavor}: must be >= 0, got {self.per_unit_hour}"
            )


@dataclass(frozen=True)
class PriceSchedule:
    by_flavor: Mapping[str, Sequence[DatedPrice]]
    """Per flavor, its prices by ascending ``effective_from``."""
    by_resource: Mapping[tuple[str, Resource], Sequence[DatedResourcePrice]] = field(
        default_factory=dict
    )
    """Per flavor and resource, its prices by ascending ``effective_from``."""

    @classmethod
    def of(
        cls, prices: Iterable[DatedPrice], resources: Iterable[DatedResourcePrice] = ()
    ) -> PriceSchedule:
        by_flavor: dict[str, list[DatedPrice]] = {}
        for dated in prices:
            by_flavor.setdefault(dated.price.flavor, []).append(dated)
        by_resource: dict[tuple[str, Resource], list[DatedResourcePrice]] = {}
        for rp in resources:
            by_resource.setdefault((rp.flavor, rp.resource), []).append(rp)
        currencies = {d.price.currency for ds in by_flavor.values() for d in ds}
        currencies |= {r.currency for rs in by_resource.values() for r in rs}
        if len(currencies) > 1:
            raise ValueError(f"the price book mixes currencies: {', '.join(sorted(currencies))}")
        return cls(
            {f: sorted(ds, key=lambda d: d.effective_from) for f, ds in by_flavor.items()},
            {k: sorted(rs, key=lambda r: r.effective_from) for k, rs in by_resource.items()},
        )

    def resource_in_force(self, flavor: str, resource: Resource, at: datetime) -> Decimal | None:
        """The flavor's price per unit-hour of ``resource`` at ``at``; None when it has none
        (that resource is charged 0)."""
        dated = self.by_resource.get((flavor, resource), ())
        i = bisect_right([d.effective_from for d in dated], at)
        return dated[i - 1].per_unit_hour if i else None

    def highest_from(self, at: datetime) -> dict[str, tuple[Decimal, Decimal, Decimal]]:
        """Per flavor with a GPU price in force at ``at`` or set for later: the highest GPU,
        CPU and memory prices per hour from ``at`` on (the one in force then and every later
        one; 0 for a resource never priced from then on). No job of the flavor started at
        ``at`` or after is billed an hour of any of them at more."""
        out: dict[str, tuple[Decimal, Decimal, Decimal]] = {}
        for flavor, dated in self.by_flavor.items():
            gpu = _highest([(d.effective_from, d.price.per_gpu_hour) for d in dated], at)
            if gpu is None:
                continue
            cpu, memory = (
                _highest(
                    [
                        (r.effective_from, r.per_unit_hour)
                        for r in self.by_resource.get((flavor, k), ())
                    ],
                    at,
                )
                or Decimal(0)
                for k in RESOURCES
            )
            out[flavor] = (gpu, cpu, memory)
        return out

    def in_force(self, flavor: str, at: datetime) -> Price:
        """The flavor's price at ``at`` (``UnknownFlavor`` when none)."""
        dated = self.by_flavor.get(flavor, ())
        i = bisect_right([d.effective_from for d in dated], at)
        if i == 0:
            priced = ", ".join(sorted(self.by_flavor)) or "none"
            when = f" at {at.isoformat()}" if dated else ""
            raise UnknownFlavor(
                f"gpu_flavor: no price for {flavor!r}{when} in the price book (priced: {priced})"
            )
        return dated[i - 1].price

    def current(self, at: datetime) -> PriceBook:
        """The prices in force at ``at``, of every flavor that has one."""
        book = {}
        for flavor in self.by_flavor:
            try:
                book[flavor] = self.in_force(flavor, at)
            except UnknownFlavor:
                continue
        return PriceBook(book)

    def segments(
        self,
        flavor: str,
        gpus: int,
        start: datetime,
        end: datetime,
        cpus: int = 0,
        memory_gib: int = 0,
    ) -> list[Segment]:
        """``[start, end)`` of ``gpus`` GPUs (and ``cpus`` CPUs, ``memory_gib`` GiB),
        priced (module contract)."""
        gpu_seconds(gpus, start, end)  # the same checks (GPUs, order) as an unsplit bill
        if cpus < 0 or memory_gib < 0:
            raise ValueError(f"cpus and memory_gib: must be >= 0, got {cpus}, {memory_gib}")
        self.in_force(flavor, start)  # a GPU price at the start is required
        held = {"cpu": cpus, "memory": memory_gib}
        changes = {d.effective_from for d in self.by_flavor.get(flavor, ())}
        for resource in RESOURCES:
            if held[resource]:
                changes |= {d.effective_from for d in self.by_resource.get((flavor, resource), ())}
        bounds = [start, *sorted(c for c in changes if start < c < end), end]
        out = []
        for a, b in pairwise(bounds):
            p = self.in_force(flavor, a)
            secs = gpu_seconds(gpus, a, b)
            gpu_cost = cost(secs, p.per_gpu_hour)
            cpu = self._line(flavor, "cpu", cpus, a, b)
            mem = self._line(flavor, "memory", memory_gib, a, b)
            out.append(
                Segment(
                    a,
                    b,
                    secs,
                    p.per_gpu_hour,
                    p.currency,
                    gpu_cost + cpu[2] + mem[2],
                    cpu_seconds=cpu[0],
                    price_per_cpu_hour=cpu[1],
                    cpu_cost=cpu[2],
                    memory_gib_seconds=mem[0],
                    price_per_memory_gib_hour=mem[1],
                    memory_cost=mem[2],
                )
            )
        return out

    def _line(
        self, flavor: str, resource: Resource, units: int, a: datetime, b: datetime
    ) -> tuple[Decimal, Decimal | None, Decimal]:
        """(unit-seconds, price or None, cost) of ``units`` of ``resource`` over ``[a, b)``;
        no units: nothing, and no price."""
        if not units:
            return Decimal(0), None, Decimal(0)
        secs = Decimal(units) * duration_seconds(a, b)
        price = self.resource_in_force(flavor, resource, a)
        return secs, price, cost(secs, price) if price is not None else Decimal(0)


def _highest(dated: Sequence[tuple[datetime, Decimal]], at: datetime) -> Decimal | None:
    """The highest of the prices of ``dated`` (ascending dates) in force at ``at`` or later."""
    i = bisect_right([d for d, _ in dated], at)
    from_then = [p for _, p in dated[max(i - 1, 0) :]]
    return max(from_then) if from_then else None


def currency_refusal(
    setting: str, book: Mapping[str, int], budgets: Mapping[str, int]
) -> str | None:
    """Why billing must not start with the currency ``setting`` when its price book holds
    ``book`` (prices per currency, GPU, CPU and memory alike) and its budgets ``budgets``
    (per currency); None when every one is in ``setting`` (or there is none). One line,
    naming the setting, what is held and what to do."""
    others = sorted((set(book) | set(budgets)) - {setting})
    if not others:
        return None

    def held(counts: Mapping[str, int], what: str) -> list[str]:
        return [f"{n} {what}{'s' if n != 1 else ''} in {c}" for c, n in sorted(counts.items())]

    holds = ", ".join([*held(book, "price"), *held(budgets, "budget")])
    if len(others) == 1 and set(book) <= {others[0]}:
        todo = (
            f"set TRAINYARD_BILLING_CURRENCY={others[0]} again (an installation's currency "
            "cannot be changed once it has prices or budgets: they are not converted)"
        )
    else:
        todo = (
            "put the price book and the budgets in one currency in billing's database "
            "(tables prices, resource_prices, budgets) and set TRAINYARD_BILLING_CURRENCY to it"
        )
    return (
        f"TRAINYARD_BILLING_CURRENCY is {setting}, but billing holds {holds}: a price book "
        "has one currency, and every release would be refused and every budget check "
        f"fail; {todo}"
    )
