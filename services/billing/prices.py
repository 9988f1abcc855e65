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
  is refused when built.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

from services.billing.domain import (
    Price,
    PriceBook,
    Segment,
    UnknownFlavor,
    cost,
    gpu_seconds,
)

BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
"""The effective date of a price that applies to all usage (the settings' bootstrap)."""


@dataclass(frozen=True)
class DatedPrice:
    effective_from: datetime
    price: Price


@dataclass(frozen=True)
class PriceSchedule:
    by_flavor: Mapping[str, Sequence[DatedPrice]]
    """Per flavor, its prices by ascending ``effective_from``."""

    @classmethod
    def of(cls, prices: Iterable[DatedPrice]) -> PriceSchedule:
        by_flavor: dict[str, list[DatedPrice]] = {}
        for dated in prices:
            by_flavor.setdefault(dated.price.flavor, []).append(dated)
        currencies = {d.price.currency for ds in by_flavor.values() for d in ds}
        if len(currencies) > 1:
            raise ValueError(f"the price book mixes currencies: {', '.join(sorted(currencies))}")
        return cls({f: sorted(ds, key=lambda d: d.effective_from) for f, ds in by_flavor.items()})

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

    def segments(self, flavor: str, gpus: int, start: datetime, end: datetime) -> list[Segment]:
        """``[start, end)`` of ``gpus`` GPUs, priced (module contract)."""
        gpu_seconds(gpus, start, end)  # the same checks (GPUs, order) as an unsplit bill
        price = self.in_force(flavor, start)
        changes = [d for d in self.by_flavor.get(flavor, ()) if start < d.effective_from < end]
        bounds = [start, *(d.effective_from for d in changes), end]
        prices = [price, *(d.price for d in changes)]
        out = []
        for (a, b), p in zip(pairwise(bounds), prices, strict=True):
            secs = gpu_seconds(gpus, a, b)
            out.append(Segment(a, b, secs, p.per_gpu_hour, p.currency, cost(secs, p.per_gpu_hour)))
        return out
