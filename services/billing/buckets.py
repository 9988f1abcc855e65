"""Splitting an amount of GPU-seconds and money over the UTC hours, days and months of its
interval, exactly.

Contract:
- ``split_hours(start, end, gpu_seconds, cost)`` gives one ``Part`` per UTC hour the
  interval ``[start, end)`` overlaps, in order. The parts sum to ``gpu_seconds`` and
  ``cost`` exactly: part k is the cumulative share up to the end of hour k, rounded
  half-up to 6 places, minus the cumulative share before it (so rounding never loses or
  invents a micro-unit). Shares are by time, in whole microseconds. An entry of
  ``g`` GPUs over the interval (``gpu_seconds = g x duration``) therefore gets exactly
  ``g x`` the seconds in each hour. Negated amounts give exactly negated parts (half-up
  rounds away from zero), so a reversal cancels its charge in every bucket.
- A zero-length interval has no parts (it spans no time, and its amounts must be zero).
- ``roll_up(parts, unit)`` sums hour parts into their UTC day or month: a day or month is
  always exactly the sum of its hours.
- ``split_amounts`` and ``roll_up_amounts`` are the same for any number of amounts at once
  (an entry's GPU, CPU and memory lines), each split exactly as ``split_hours`` splits one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Literal

Unit = Literal["hour", "day", "month"]
UNITS: tuple[Unit, ...] = ("hour", "day", "month")
PLACES = Decimal("0.000001")
ZERO_SHARE = Decimal("0.000000")
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Part:
    bucket: datetime
    """The first instant of the bucket (UTC)."""
    gpu_seconds: Decimal
    cost: Decimal


def floor(when: datetime, unit: Unit) -> datetime:
    """The start of the UTC hour, day or month holding ``when``."""
    utc = when.astimezone(UTC)
    if unit == "hour":
        return utc.replace(minute=0, second=0, microsecond=0)
    if unit == "day":
        return utc.replace(hour=0, minute=0, second=0, microsecond=0)
    return utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_bucket(start: datetime, unit: Unit) -> datetime:
    """The start of the bucket after the one starting at ``start``."""
    if unit == "hour":
        return start + HOUR
    if unit == "day":
        return start + timedelta(days=1)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _share(total: Decimal, done: int, whole: int) -> Decimal:
    with localcontext(prec=60):
        return (total * done / whole).quantize(PLACES, rounding=ROUND_HALF_UP)


Amounts = tuple[Decimal, ...]


def split_amounts(
    start: datetime, end: datetime, amounts: Sequence[Decimal]
) -> list[tuple[datetime, Amounts]]:
    """Each of ``amounts`` over ``[start, end)`` split per UTC hour (module contract):
    ``(hour, parts)`` in order, ``parts[i]`` the share of ``amounts[i]``."""
    if end < start:
        raise ValueError(f"ended_at {end.isoformat()} is before started_at {start.isoformat()}")
    whole = micros(end - start)
    if whole == 0:
        return []
    out: list[tuple[datetime, Amounts]] = []
    bucket = floor(start, "hour")
    # Only the amounts that are not 0 are shared out (a GPU-only entry's CPU and memory
    # lines are 0 in every hour): the share of 0 is 0, to 6 places like every share.
    nonzero = [i for i, a in enumerate(amounts) if a]
    before = [Decimal(0)] * len(amounts)
    while bucket < end:
        upto = min(next_bucket(bucket, "hour"), end)
        done = micros(upto - start)
        parts = [ZERO_SHARE] * len(amounts)
        for i in nonzero:
            cum = _share(amounts[i], done, whole)
            parts[i], before[i] = cum - before[i], cum
        out.append((bucket, tuple(parts)))
        bucket = next_bucket(bucket, "hour")
    return out


def roll_up_amounts(
    hours: Iterable[tuple[datetime, Amounts]], unit: Unit
) -> list[tuple[datetime, Amounts]]:
    """Hour parts of several amounts summed into their ``unit`` buckets, in order."""
    sums: dict[datetime, Amounts] = {}
    for bucket, parts in hours:
        key = floor(bucket, unit)
        held = sums.get(key)
        sums[key] = (
            parts if held is None else tuple(h + p for h, p in zip(held, parts, strict=True))
        )
    return sorted(sums.items())


def split_hours(start: datetime, end: datetime, gpu_seconds: Decimal, cost: Decimal) -> list[Part]:
    """The parts of ``[start, end)`` per UTC hour (module contract)."""
    return [Part(b, s, c) for b, (s, c) in split_amounts(start, end, (gpu_seconds, cost))]


def roll_up(parts: Iterable[Part], unit: Unit) -> list[Part]:
    """Hour parts summed into their ``unit`` buckets, in order."""
    hours = ((p.bucket, (p.gpu_seconds, p.cost)) for p in parts)
    return [Part(b, s, c) for b, (s, c) in roll_up_amounts(hours, unit)]
