"""Splitting ledger amounts over hours, days and months: exact, boundary by boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard_platform.services.billing.buckets import (
    Part,
    floor,
    next_bucket,
    roll_up,
    split_hours,
)
from trainyard_platform.services.billing.domain import cost, gpu_seconds

T = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)


def test_an_entry_straddling_midnight_at_month_end_splits_exactly_at_each_boundary() -> None:
    end = T + timedelta(hours=1, minutes=15)  # 23:30 Nov 30 .. 00:45 Dec 1
    secs = gpu_seconds(2, T, end)  # 2 GPUs x 4500 s
    parts = split_hours(T, end, secs, cost(secs, Decimal("2.5")))
    assert parts == [
        Part(datetime(2026, 11, 30, 23, tzinfo=UTC), Decimal(3600), Decimal("2.5")),
        Part(datetime(2026, 12, 1, 0, tzinfo=UTC), Decimal(5400), Decimal("3.75")),
    ]
    assert [p.bucket.month for p in roll_up(parts, "month")] == [11, 12]
    assert [p.cost for p in roll_up(parts, "day")] == [Decimal("2.5"), Decimal("3.75")]


def test_rounding_never_loses_a_micro_unit() -> None:
    # One micro-unit over three equal hours: the cumulative shares put it in one hour only.
    start = datetime(2026, 1, 1, tzinfo=UTC)
    parts = split_hours(start, start + timedelta(hours=3), Decimal(3), Decimal("0.000001"))
    assert sum(p.cost for p in parts) == Decimal("0.000001")
    assert sorted(p.cost for p in parts) == [Decimal(0), Decimal(0), Decimal("0.000001")]


def test_a_zero_length_entry_has_no_parts_and_backwards_time_is_refused() -> None:
    assert split_hours(T, T, Decimal(0), Decimal(0)) == []
    with pytest.raises(ValueError, match="before started_at"):
        split_hours(T, T - timedelta(microseconds=1), Decimal(0), Decimal(0))


def test_floor_and_next_bucket_in_utc() -> None:
    when = datetime(2024, 2, 29, 13, 45, 7, 9, tzinfo=UTC)
    assert floor(when, "hour") == datetime(2024, 2, 29, 13, tzinfo=UTC)
    assert floor(when, "day") == datetime(2024, 2, 29, tzinfo=UTC)
    assert floor(when, "month") == datetime(2024, 2, 1, tzinfo=UTC)
    assert next_bucket(floor(when, "month"), "month") == datetime(2024, 3, 1, tzinfo=UTC)
    assert next_bucket(datetime(2026, 12, 1, tzinfo=UTC), "month") == datetime(
        2027, 1, 1, tzinfo=UTC
    )


moments = st.datetimes(
    min_value=datetime(2025, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
)


@given(
    start=moments,
    length_us=st.integers(0, 40 * 24 * 3600 * 10**6),
    gpus=st.integers(0, 64),
    price=st.decimals(min_value=0, max_value=100, places=4),
)
def test_parts_sum_exactly_and_a_reversal_cancels_every_bucket(
    start: datetime, length_us: int, gpus: int, price: Decimal
) -> None:
    end = start + timedelta(microseconds=length_us)
    secs = gpu_seconds(gpus, start, end)
    money = cost(secs, price)
    parts = split_hours(start, end, secs, money)
    assert sum((p.gpu_seconds for p in parts), Decimal(0)) == secs
    assert sum((p.cost for p in parts), Decimal(0)) == money
    for part in parts:  # whole GPU-seconds of the time inside each hour, exactly
        inside = min(next_bucket(part.bucket, "hour"), end) - max(part.bucket, start)
        assert part.gpu_seconds == gpu_seconds(gpus, start, start + inside)
    reversed_parts = split_hours(start, end, -secs, -money)
    assert [(p.gpu_seconds, p.cost) for p in reversed_parts] == [
        (-p.gpu_seconds, -p.cost) for p in parts
    ]
    for unit in ("day", "month"):
        rolled = roll_up(parts, unit)
        assert sum((p.cost for p in rolled), Decimal(0)) == money
        assert all(p.bucket == floor(p.bucket, unit) for p in rolled)
