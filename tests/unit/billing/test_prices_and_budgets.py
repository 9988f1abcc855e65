"""The dated price book's segments and the budgets' thresholds and forecast (pure rules)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from trainyard_platform.services.billing import budget_watch
from trainyard_platform.services.billing.budgets import (
    Budget,
    forecast,
    month_label,
    month_start,
    next_month,
    reached,
)
from trainyard_platform.services.billing.domain import Price, UnknownFlavor
from trainyard_platform.services.billing.governance_api import budget_view
from trainyard_platform.services.billing.prices import (
    BEGINNING,
    DatedPrice,
    DatedResourcePrice,
    PriceSchedule,
    currency_refusal,
)

T = datetime(2026, 12, 10, 12, tzinfo=UTC)


def book(*prices: tuple[datetime, str]) -> PriceSchedule:
    return PriceSchedule.of(DatedPrice(at, Price("a100", Decimal(p), "USD")) for at, p in prices)


def test_an_interval_within_one_price_is_one_segment() -> None:
    (only,) = book((BEGINNING, "2.5")).segments("a100", 2, T, T + timedelta(hours=1))
    assert (only.gpu_seconds, only.cost, only.price_per_gpu_hour) == (
        Decimal(7200),
        Decimal("5.000000"),
        Decimal("2.5"),
    )


def test_an_interval_is_split_exactly_at_each_price_change() -> None:
    schedule = book((BEGINNING, "2.5"), (T, "4"), (T + timedelta(minutes=30), "1"))
    parts = schedule.segments("a100", 1, T - timedelta(hours=1), T + timedelta(hours=1))
    assert [(p.started_at, p.ended_at, p.price_per_gpu_hour, p.cost) for p in parts] == [
        (T - timedelta(hours=1), T, Decimal("2.5"), Decimal("2.500000")),
        (T, T + timedelta(minutes=30), Decimal(4), Decimal("2.000000")),
        (T + timedelta(minutes=30), T + timedelta(hours=1), Decimal(1), Decimal("0.500000")),
    ]


def test_a_change_at_the_very_start_or_end_makes_no_empty_segment() -> None:
    schedule = book((BEGINNING, "2.5"), (T, "4"))
    (after,) = schedule.segments("a100", 1, T, T + timedelta(hours=1))
    assert after.price_per_gpu_hour == Decimal(4)
    (before,) = schedule.segments("a100", 1, T - timedelta(hours=1), T)
    assert before.price_per_gpu_hour == Decimal("2.5")


def test_a_cpu_price_change_splits_only_a_bill_that_holds_cpus() -> None:
    gpu = [DatedPrice(BEGINNING, Price("a100", Decimal("2.5"), "USD"))]
    cpu = [
        DatedResourcePrice("a100", "cpu", BEGINNING, Decimal("0.03"), "USD"),
        DatedResourcePrice("a100", "cpu", T, Decimal("0.06"), "USD"),
    ]
    schedule = PriceSchedule.of(gpu, cpu)
    start, end = T - timedelta(minutes=30), T + timedelta(minutes=30)
    (whole,) = schedule.segments("a100", 1, start, end, memory_gib=10)
    assert (whole.cost, whole.cpu_seconds, whole.price_per_cpu_hour) == (Decimal("2.5"), 0, None)
    # No memory price: 10 GiB for an hour charged 0, with no price, never an error.
    assert (whole.memory_gib_seconds, whole.memory_cost, whole.price_per_memory_gib_hour) == (
        36000,
        0,
        None,
    )
    parts = schedule.segments("a100", 1, start, end, cpus=4)
    assert [(p.price_per_cpu_hour, p.cpu_cost, p.gpu_cost, p.cost) for p in parts] == [
        (Decimal("0.03"), Decimal("0.06"), Decimal("1.25"), Decimal("1.31")),
        (Decimal("0.06"), Decimal("0.12"), Decimal("1.25"), Decimal("1.37")),
    ]


def test_no_price_in_force_at_the_start_is_an_unknown_flavor() -> None:
    with pytest.raises(UnknownFlavor, match="no price for 'a100' at"):
        book((T, "4")).segments("a100", 1, T - timedelta(seconds=1), T + timedelta(hours=1))
    with pytest.raises(
        UnknownFlavor, match=r"no price for 'h100' in the price book \(priced: a100\)"
    ):
        book((BEGINNING, "4")).segments("h100", 1, T, T)


def test_a_book_of_two_currencies_is_refused() -> None:
    with pytest.raises(ValueError, match="mixes currencies"):
        PriceSchedule.of(
            [
                DatedPrice(BEGINNING, Price("a100", Decimal(1), "USD")),
                DatedPrice(BEGINNING, Price("cpu", Decimal(1), "EUR")),
            ]
        )


def test_a_currency_other_than_the_books_is_refused_in_one_line_saying_what_to_do() -> None:
    """TRAINYARD_BILLING_CURRENCY changed on a running installation: the book then mixed
    currencies, and billing refused every release and failed every budget check after,
    with nothing said at start."""
    assert currency_refusal("USD", {"USD": 7}, {"USD": 2}) is None
    assert currency_refusal("EUR", {}, {}) is None  # a fresh install: anything goes
    said = currency_refusal("EUR", {"USD": 7}, {"USD": 1})
    assert said is not None and "\n" not in said
    assert said.startswith("TRAINYARD_BILLING_CURRENCY is EUR, but billing holds 7 prices in USD")
    assert "1 budget in USD" in said
    assert "set TRAINYARD_BILLING_CURRENCY=USD again" in said
    mixed = currency_refusal("EUR", {"USD": 7, "EUR": 1}, {})
    assert mixed is not None and "1 price in EUR, 7 prices in USD" in mixed
    assert "put the price book and the budgets in one currency" in mixed
    budgets_only = currency_refusal("EUR", {"EUR": 3}, {"USD": 2})
    assert budgets_only is not None and "2 budgets in USD" in budgets_only


def test_the_current_book_holds_the_prices_in_force() -> None:
    schedule = book((BEGINNING, "2.5"), (T, "4"))
    assert schedule.current(T - timedelta(seconds=1)).price("a100").per_gpu_hour == Decimal("2.5")
    assert schedule.current(T).price("a100").per_gpu_hour == Decimal(4)


def test_months_are_utc() -> None:
    start = month_start(datetime(2026, 12, 31, 23, 59, tzinfo=UTC))
    assert (month_label(start), next_month(start)) == ("2026-12", datetime(2027, 1, 1, tzinfo=UTC))


def test_thresholds_reached_are_those_the_spending_has_met() -> None:
    assert reached(Decimal(10), Decimal("4.99"), (50, 80, 100)) == []
    assert reached(Decimal(10), Decimal(5), (100, 50, 80)) == [50]
    assert reached(Decimal(10), Decimal(12), (50, 80, 100, 150)) == [50, 80, 100]


def test_the_forecast_is_the_month_s_rate_so_far() -> None:
    now = datetime(2026, 12, 5, tzinfo=UTC)  # 4 days in: 40 spent, 10 a day
    assert forecast(Decimal(100), Decimal(40), now) == datetime(2026, 12, 11, tzinfo=UTC)
    assert forecast(Decimal(1000), Decimal(40), now) is None  # lasts the month
    assert forecast(Decimal(100), Decimal(0), now) is None  # nothing spent yet
    assert forecast(Decimal(100), Decimal(100), now) is None  # spent already


def test_the_percent_spent_shows_a_threshold_only_once_it_is_reached() -> None:
    """A budget's ``percent_spent`` is cut, never rounded up: 99.995 of 100 spent shows
    99.99 % (not 100.00 % beside "not exhausted"), 49.995 shows 49.99 % (the 50 % threshold
    is not crossed yet), and 100 % shows only once the budget is spent."""
    budget = Budget("ml", None, Decimal(100), "USD", (50, 80, 100), "refuse", 1, "ann", T)

    def shown(spent: str) -> tuple[str, bool]:
        view = budget_view(budget, Decimal(spent), T)
        return str(view.percent_spent), view.exhausted

    assert shown("99.995") == ("99.99", False)
    assert shown("49.995") == ("49.99", False)
    assert shown("100") == ("100.00", True)
    assert shown("0.000001") == ("0.00", False)
    assert reached(budget.amount, Decimal("49.995"), budget.thresholds) == []


def test_the_rates_a_job_is_reserved_at_are_the_highest_prices_from_now_on() -> None:
    gpu = [
        DatedPrice(BEGINNING, Price("a100", Decimal("2.5"), "USD")),
        DatedPrice(T - timedelta(hours=1), Price("a100", Decimal(3), "USD")),
        DatedPrice(T + timedelta(days=1), Price("a100", Decimal(4), "USD")),
        DatedPrice(T + timedelta(days=2), Price("a100", Decimal(1), "USD")),
        DatedPrice(T + timedelta(days=1), Price("l40s", Decimal(2), "USD")),  # later only
        DatedPrice(BEGINNING, Price("old", Decimal(9), "USD")),
        DatedPrice(T - timedelta(days=1), Price("old", Decimal(1), "USD")),
    ]
    cpu = [
        DatedResourcePrice("a100", "cpu", BEGINNING, Decimal("0.5"), "USD"),
        DatedResourcePrice("a100", "cpu", T, Decimal("0.1"), "USD"),
    ]
    rates = PriceSchedule.of(gpu, cpu).highest_from(T)
    # Past prices (2.5, old's 9) no longer count; a later dearer one (4) does; the CPU
    # price in force since T (0.1), not the one before; no memory price: 0.
    assert rates == {
        "a100": (Decimal(4), Decimal("0.1"), Decimal(0)),
        "l40s": (Decimal(2), Decimal(0), Decimal(0)),
        "old": (Decimal(1), Decimal(0), Decimal(0)),
    }


async def test_rates_of_prices_finer_than_a_micro_unit_are_said_rounded_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A price finer than a micro-unit (``TRAINYARD_BILLING_PRICES='{"t4": 0.1234567}'`` or
    ``1e-07``: the settings bound no decimal places, nor did the book before the price routes
    did) is said at the next micro-unit up, so the reservation still covers it. Before, the
    rates failed their own validation: every bill of a budget that reserves, and every
    change of it, failed."""
    gpu = [
        DatedPrice(BEGINNING, Price("t4", Decimal("0.1234567"), "USD")),
        DatedPrice(BEGINNING, Price("tiny", Decimal("1E-7"), "USD")),
        DatedPrice(BEGINNING, Price("round", Decimal("2.500000"), "USD")),
    ]
    memory = [DatedResourcePrice("t4", "memory", BEGINNING, Decimal("0.00000001"), "USD")]
    book = PriceSchedule.of(gpu, memory)

    async def schedule(conn: object, flavor: str | None = None) -> PriceSchedule:
        return book

    monkeypatch.setattr(budget_watch.catalogue, "schedule", schedule)
    said = await budget_watch.rates(None, T)  # type: ignore[arg-type]
    assert {f: (r.gpu_hour, r.cpu_hour, r.memory_gib_hour) for f, r in said.items()} == {
        "round": ("2.5", "0", "0"),
        "t4": ("0.123457", "0", "0.000001"),
        "tiny": ("0.000001", "0", "0"),
    }
