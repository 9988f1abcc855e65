"""Splitting ledger amounts over hours, days and months: exact, boundary by boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.billing.buckets import (
    Part,
    apportion,
    floor,
    next_bucket,
    roll_up,
    split_hours,
)
from trainyard_platform.services.billing.domain import cost, gpu_seconds
from trainyard_platform.services.billing.ledger import AMOUNTS, LedgerEntry, rollup_rows

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


def _entry(
    start: datetime, end: datetime, gpu_cost: Decimal, cpu_cost: Decimal, memory_cost: Decimal
) -> LedgerEntry:
    """A charge whose lines cost these amounts (its ``cost`` their sum, as billed)."""
    return LedgerEntry(
        allocation_id="a1", revision=0, kind="charge", job_id="j1", team="ml", project=None,
        user="ada", queue=None, gpu_flavor="a100", node_id="n1", attempt=None, epoch=None,
        gpus=1, started_at=start, ended_at=end, outcome="succeeded",
        gpu_seconds=gpu_seconds(1, start, end), price_per_gpu_hour=Decimal(0), currency="USD",
        cost=gpu_cost + cpu_cost + memory_cost, cpus=1, memory_gib=1,
        cpu_seconds=gpu_seconds(1, start, end), price_per_cpu_hour=Decimal("0.01"),
        cpu_cost=cpu_cost, memory_gib_seconds=gpu_seconds(1, start, end),
        price_per_memory_gib_hour=Decimal("0.01"), memory_cost=memory_cost,
    )  # fmt: skip


def _hour_lines(rows: list[tuple[object, ...]]) -> list[dict[str, Decimal]]:
    """The hour rows of ``rollup_rows`` as a report's lines (``gpu_cost`` the whole less
    the CPU and memory costs, as a report derives it)."""
    keyed = [dict(zip(AMOUNTS, row[8:], strict=True)) for row in rows if row[0] == "hour"]
    return [{**r, "gpu_cost": r["cost"] - r["cpu_cost"] - r["memory_cost"]} for r in keyed]


def test_an_hour_of_a_charge_never_has_a_negative_gpu_cost() -> None:
    # The whole (0.000084) split on its own gave the hour from 01:00 0.000015 while its
    # CPU and memory lines, split on their own, gave 0.000007 and 0.000009: the GPU cost
    # read as the rest was -0.000001.
    start = datetime(2026, 1, 1, 0, 30, tzinfo=UTC)
    entry = _entry(
        start, start + timedelta(minutes=36, seconds=42), Decimal(0), Decimal("0.000036"),
        Decimal("0.000048"),
    )  # fmt: skip
    lines = _hour_lines(rollup_rows([entry]))
    assert [r["gpu_cost"] for r in lines] == [Decimal(0), Decimal(0)]
    assert [r["cost"] for r in lines] == [r["cpu_cost"] + r["memory_cost"] for r in lines]
    assert sum(r["cost"] for r in lines) == entry.cost


micro_amounts = st.integers(0, 10**9).map(lambda n: Decimal(n).scaleb(-6))


@settings(max_examples=400, deadline=None)
@given(
    whole=st.decimals(min_value=0, max_value=10**9, places=9, allow_nan=False),
    weights=st.lists(st.integers(0, 3600 * 10**6), min_size=1, max_size=50).filter(any),
)
def test_apportion_never_gives_a_negative_part_and_the_parts_sum_to_the_whole(
    whole: Decimal, weights: list[int]
) -> None:
    parts = apportion(whole, weights)
    assert len(parts) == len(weights)
    assert all(p >= 0 for p in parts)
    assert sum(parts, Decimal(0)) == whole
    # No time, no share (the last part alone holds what a whole has past 6 places).
    assert all(p == 0 for p, w in zip(parts[:-1], weights[:-1], strict=True) if w == 0)
    assert apportion(-whole, weights) == [-p for p in parts]
    assert apportion(whole, weights) == parts  # deterministic


def test_apportion_refuses_weights_that_share_nothing_out() -> None:
    with pytest.raises(ValueError, match="weights"):
        apportion(Decimal(1), [0, 0])
    with pytest.raises(ValueError, match="weights"):
        apportion(Decimal(1), [2, -1])


@settings(max_examples=400, deadline=None)
@given(
    start=moments,
    length_us=st.integers(1, 5 * 24 * 3600 * 10**6),
    gpu_cost=micro_amounts,
    cpu_cost=micro_amounts,
    memory_cost=micro_amounts,
)
def test_no_hour_day_or_month_of_a_charge_has_a_negative_line_and_each_sums_exactly(
    start: datetime, length_us: int, gpu_cost: Decimal, cpu_cost: Decimal, memory_cost: Decimal
) -> None:
    entry = _entry(
        start, start + timedelta(microseconds=length_us), gpu_cost, cpu_cost, memory_cost
    )
    rows = rollup_rows([entry])
    for unit in ("hour", "day", "month"):
        keyed = [dict(zip(AMOUNTS, row[8:], strict=True)) for row in rows if row[0] == unit]
        for r in keyed:
            assert all(v >= 0 for v in r.values())
            assert r["cost"] - r["cpu_cost"] - r["memory_cost"] >= 0
        for name, whole in zip(AMOUNTS, entry.amounts, strict=True):
            assert sum((r[name] for r in keyed), Decimal(0)) == whole
    reversed_rows = rollup_rows([entry, entry.reversal()])
    assert reversed_rows == []  # a reversal cancels its charge in every bucket
