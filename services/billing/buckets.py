"""Splitting an amount of GPU-seconds and money over the UTC hours, days and months of its
interval, exactly.

Contract:
- ``split_hours(start, end, gpu_seconds, cost)`` gives one ``Part`` per UTC hour the
  interval ``[start, end)`` overlaps, in order. The parts sum to ``gpu_seconds`` and
  ``cost`` exactly, each shared out over the hours by ``apportion`` (so rounding never
  loses or invents a micro-unit, and no hour of a non-negative amount is negative). Shares are by time, in whole microseconds. An entry of
  ``g`` GPUs over the interval (``gpu_seconds = g x duration``) therefore gets exactly
  ``g x`` the seconds in each hour. Negated amounts give exactly negated parts (half-up
  rounds away from zero), so a reversal cancels its charge in every bucket.
- A zero-length interval has no parts (it spans no time, and its amounts must be zero).
- ``roll_up(parts, unit)`` sums hour parts into their UTC day or month: a day or month is
  always exactly the sum of its hours.
- ``apportion(whole, weights)`` is the one way billing shares an amount out into parts:
  part k is the cumulative share up to weight k, rounded half-up to 6 places and never past
  ``whole``, minus the cumulative share before it; the last cumulative share is ``whole``
  itself. So the parts sum to ``whole`` exactly, each has the sign of ``whole`` or is 0 (no
  part of a non-negative amount is ever negative), negating ``whole`` negates every part,
  and the same input always gives the same parts.
- ``split_amounts`` and ``roll_up_amounts`` are the same for any number of amounts at once,
  each split on its own exactly as ``split_hours`` splits one. An amount that is the sum of
  others (an entry's ``cost``: its GPU, CPU and memory lines) must not be split on its own
  beside them: rounded apart from its lines, its hour part could differ from theirs by a
  micro-unit, and a line read as the whole minus the others would be negative. Split the
  lines and sum their parts (``ledger.LedgerEntry.hour_parts``).
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


def apportion(whole: Decimal, weights: Sequence[int]) -> list[Decimal]:
    """``whole`` shared out in proportion to ``weights`` (integers >= 0, their sum > 0), one
    part per weight (module contract). A ``whole`` with more than 6 places leaves its excess
    in the last part (every other part has 6)."""
    total = sum(weights)
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"weights: must be >= 0 with a sum > 0, got {list(weights)}")
    # On the magnitude, then signed: half-up rounds away from zero, so -whole gets exactly
    # the negated parts, and capping at |whole| keeps every cumulative share monotonic.
    size = abs(whole)
    parts: list[Decimal] = []
    before = Decimal(0)
    done = 0
    with localcontext(prec=60):
        for k, weight in enumerate(weights):
            done += weight
            if k == len(weights) - 1:
                cum = size
            else:
                cum = min((size * done / total).quantize(PLACES, rounding=ROUND_HALF_UP), size)
            parts.append(cum - before if whole >= 0 else before - cum)
            before = cum
    return parts


Amounts = tuple[Decimal, ...]


def split_amounts(
    start: datetime, end: datetime, amounts: Sequence[Decimal]
) -> list[tuple[datetime, Amounts]]:
    """Each of ``amounts`` over ``[start, end)`` split per UTC hour (module contract):
    ``(hour, parts)`` in order, ``parts[i]`` the share of ``amounts[i]``."""
    if end < start:
        raise ValueError(f"ended_at {end.isoformat()} is before started_at {start.isoformat()}")
    if end == start:
        return []
    hours: list[datetime] = []
    weights: list[int] = []
    bucket = floor(start, "hour")
    while bucket < end:
        hours.append(bucket)
        weights.append(micros(min(next_bucket(bucket, "hour"), end) - max(bucket, start)))
        bucket = next_bucket(bucket, "hour")
    # Only the amounts that are not 0 are shared out (a GPU-only entry's CPU and memory
    # lines are 0 in every hour): the share of 0 is 0, to 6 places like every share.
    columns = [apportion(a, weights) if a else [ZERO_SHARE] * len(hours) for a in amounts]
    return [(hour, tuple(c[k] for c in columns)) for k, hour in enumerate(hours)]


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
