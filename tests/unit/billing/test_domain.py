"""Billing arithmetic (exact decimals) and price lookup."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from trainyard_platform.services.billing.config import DEFAULT_PRICES, Settings
from trainyard_platform.services.billing.domain import (
    Price,
    PriceBook,
    UnknownFlavor,
    Usage,
    cost,
    duration_seconds,
    gpu_seconds,
)
from trainyard_platform.shared.events.payloads import AllocationReleased

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator token is a required setting (``shared.access``)."""
    monkeypatch.setenv("TRAINYARD_BILLING_ADMIN_TOKEN", "op-token")


def test_duration_is_exact_to_the_microsecond() -> None:
    end = T0 + timedelta(days=2, seconds=7, microseconds=1)
    assert duration_seconds(T0, end) == Decimal("172807.000001")
    # The float route would not be exact here.
    assert Decimal((end - T0).total_seconds()) != Decimal("172807.000001")


def test_gpu_seconds_is_gpus_times_duration() -> None:
    assert gpu_seconds(4, T0, T0 + timedelta(minutes=90)) == Decimal(4 * 5400)
    assert gpu_seconds(0, T0, T0 + timedelta(hours=1)) == 0


def test_gpu_seconds_refuses_time_running_backwards() -> None:
    with pytest.raises(ValueError, match="before granted_at"):
        gpu_seconds(1, T0, T0 - timedelta(seconds=1))


def test_cost_is_gpu_seconds_times_price_per_hour() -> None:
    # 8 GPUs for one hour at 2.50 per GPU-hour.
    assert cost(Decimal(8 * 3600), Decimal("2.50")) == Decimal("20.000000")
    # 1 GPU-second of cpu: 0.10 / 3600 = 0.0000277... -> 0.000028
    assert cost(Decimal(1), Decimal("0.10")) == Decimal("0.000028")


def test_cost_rounds_half_up_to_six_places() -> None:
    # 0.0000005 exactly: 18 GPU-seconds at 0.0001 per hour.
    assert cost(Decimal(18), Decimal("0.0001")) == Decimal("0.000001")
    assert cost(Decimal(17), Decimal("0.0001")) == Decimal("0.000000")


def test_cost_of_many_small_prices_is_exact() -> None:
    secs = gpu_seconds(3, T0, T0 + timedelta(seconds=1234, microseconds=567891))
    assert secs == Decimal("3703.703673")
    assert cost(secs, Decimal("5.5")) == (secs * Decimal("5.5") / 3600).quantize(
        Decimal("0.000001")
    )


def test_price_book_from_settings_keeps_the_written_decimal() -> None:
    book = PriceBook.from_settings(DEFAULT_PRICES, "USD")
    assert book.price("cpu") == Price("cpu", Decimal("0.1"), "USD")
    assert book.price("h200").per_gpu_hour == Decimal("5.5")
    assert sorted(book.prices) == ["a100", "cpu", "h100", "h200", "t4"]


def test_unknown_flavor_is_named_with_the_priced_ones() -> None:
    book = PriceBook.from_settings({"cpu": 0.1, "a100": 2.5}, "USD")
    with pytest.raises(
        UnknownFlavor, match=r"no price for 'tpu' in the price book \(priced: a100, cpu\)"
    ):
        book.price("tpu")


@pytest.mark.parametrize("bad", [-0.01, float("nan")])
def test_negative_or_nan_prices_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        PriceBook.from_settings({"cpu": bad}, "USD")


def test_default_settings_prices() -> None:
    settings = Settings()
    assert settings.prices == DEFAULT_PRICES
    assert settings.currency == "USD"
    assert settings.port == 8084


def test_usage_from_release_and_its_event() -> None:
    released = AllocationReleased(
        allocation_id="a-1",
        job_id="j-1",
        node_id="n-1",
        team="vision",
        user="ada",
        gpu_flavor="a100",
        gpus=2,
        granted_at=T0,
        released_at=T0 + timedelta(minutes=30, microseconds=500),
        outcome="succeeded",
    )
    usage = Usage.from_release(released, Price("a100", Decimal("2.5"), "USD"))
    assert usage.gpu_seconds == Decimal("3600.001")
    assert usage.cost == Decimal("2.500001")  # 3600.001 * 2.5 / 3600 = 2.50000069...
    event = usage.to_event()
    assert (event.job_id, event.team, event.user, event.currency) == ("j-1", "vision", "ada", "USD")
    assert event.cost == pytest.approx(2.500001)
    assert event.started_at == T0


def test_a_bill_charged_to_the_platform_says_its_team_pays_nothing() -> None:
    """``cost.recorded`` of an attempt that failed through the platform said the team's full
    cost (1.25); it says 0 GPU-seconds and 0 cost, the allocation and price kept."""
    released = AllocationReleased(
        allocation_id="a-1",
        job_id="j-1",
        node_id="n-1",
        team="vision",
        user="ada",
        gpu_flavor="a100",
        gpus=1,
        granted_at=T0,
        released_at=T0 + timedelta(minutes=30),
        outcome="failed",
    )
    usage = Usage.from_release(released, Price("a100", Decimal("2.5"), "USD"))
    event = replace(usage, charged_to="platform").to_event()
    assert (event.allocation_id, event.gpu_seconds, event.cost) == ("a-1", 0.0, 0.0)
    assert event.price_per_gpu_hour == 2.5
    assert usage.to_event().cost == 1.25
