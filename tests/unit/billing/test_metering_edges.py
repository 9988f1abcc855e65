"""Billing's metering at its edges (found by mutation testing, ``bench/mutation.py``): a free
flavor, a zero-length lease, precision far beyond Decimal's default, every field of a
ledger row, and the errors' words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal, getcontext

import pytest

from trainyard_platform.services.billing.domain import (
    Price,
    PriceBook,
    UnknownFlavor,
    Usage,
    cost,
    gpu_seconds,
)
from trainyard_platform.shared.events.payloads import AllocationReleased

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)


def test_a_flavor_may_be_free_but_not_negative() -> None:
    assert Price("cpu", Decimal(0), "EUR").per_gpu_hour == 0
    with pytest.raises(ValueError, match=r"price of cpu: must be >= 0, got -0.01"):
        Price("cpu", Decimal("-0.01"), "EUR")
    with pytest.raises(ValueError, match="must be >= 0"):
        Price("cpu", Decimal("NaN"), "EUR")


def test_a_zero_length_lease_costs_nothing() -> None:
    assert gpu_seconds(8, T0, T0) == 0
    assert cost(gpu_seconds(8, T0, T0), Decimal("2.5")) == Decimal("0.000000")


def test_impossible_gpus_are_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"^gpus: must be >= 0, got -1$"):
        gpu_seconds(-1, T0, T0 + timedelta(seconds=1))


def test_an_empty_price_book_says_it_prices_nothing() -> None:
    with pytest.raises(
        UnknownFlavor, match=r"no price for 'h200' in the price book \(priced: none\)"
    ):
        PriceBook({}).price("h200")
    book = PriceBook.from_settings({"h200": 4.0, "a100": 2.5}, "EUR")
    with pytest.raises(UnknownFlavor, match=r"\(priced: a100, h200\)"):
        book.price("cpu")


def test_cost_is_not_rounded_before_the_money_rounding_even_beyond_28_digits() -> None:
    """Decimal's default context keeps 28 digits: 3600 x 10^21.0000004999999 GPU-seconds
    would round to ...0.002 before the division, and the cost to 0.000001 too many."""
    assert getcontext().prec == 28
    huge = Decimal("1000000000000000000000.0000004999999")
    assert cost(huge, Decimal(3600)) == Decimal("1000000000000000000000.000000")
    assert cost(Decimal("1000000000000000000000.0000005"), Decimal(3600)) == Decimal(
        "1000000000000000000000.000001"
    )


def test_a_ledger_row_carries_every_field_of_the_release() -> None:
    released = AllocationReleased(
        allocation_id="a-1",
        job_id="j-1",
        node_id="node-7",
        team="vision",
        user="ada",
        gpu_flavor="h200",
        gpus=2,
        granted_at=T0,
        released_at=T0 + timedelta(minutes=30),
        outcome="preempted",
    )
    usage = Usage.from_release(released, Price("h200", Decimal("4.00"), "EUR"))
    assert usage == Usage(
        allocation_id="a-1",
        job_id="j-1",
        team="vision",
        user="ada",
        node_id="node-7",
        gpu_flavor="h200",
        gpus=2,
        started_at=T0,
        ended_at=T0 + timedelta(minutes=30),
        outcome="preempted",
        gpu_seconds=Decimal(3600),
        price_per_gpu_hour=Decimal("4.00"),
        currency="EUR",
        cost=Decimal("4.000000"),
    )
