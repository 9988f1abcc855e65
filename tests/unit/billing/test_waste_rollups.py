"""``waste_rollups.split``: a piece per UTC hour and price, exact, counted once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from trainyard_platform.services.billing.domain import Price
from trainyard_platform.services.billing.prices import BEGINNING, DatedPrice, PriceSchedule
from trainyard_platform.services.billing.waste import Owner, Piece, Pricer
from trainyard_platform.services.billing.waste_rollups import split

T = datetime(2026, 11, 2, tzinfo=UTC)
OWNER = Owner("ml", "p", "ada", "q", "a100", "j")
BOOK = PriceSchedule.of(
    [
        DatedPrice(BEGINNING, Price("a100", Decimal("2.5"), "USD")),
        DatedPrice(T + timedelta(hours=11, minutes=20), Price("a100", Decimal("3.5"), "USD")),
    ]
)
MINUTE = 60_000_000


def hour(h: int) -> datetime:
    return T + timedelta(hours=h)


def test_a_piece_is_split_at_hours_and_price_changes_and_starts_once() -> None:
    piece = Piece(
        "input_bound", OWNER, "a100", 2, hour(10) + timedelta(minutes=30),
        hour(12) + timedelta(minutes=15), share=Decimal("0.25"),
    )  # fmt: skip
    parts = split(piece, Pricer(BOOK))
    p1, p2 = Decimal("2.5"), Decimal("3.5")
    assert parts == {
        (hour(10), "input_bound", p1): (Decimal(30 * MINUTE * 2) / 4, 30 * MINUTE, 1, 0),
        (hour(11), "input_bound", p1): (Decimal(20 * MINUTE * 2) / 4, 20 * MINUTE, 0, 1),
        (hour(11), "input_bound", p2): (Decimal(40 * MINUTE * 2) / 4, 40 * MINUTE, 0, 0),
        (hour(12), "input_bound", p2): (Decimal(15 * MINUTE * 2) / 4, 15 * MINUTE, 0, 1),
    }


def test_a_flavor_without_a_price_at_the_piece_start_is_unpriced_in_every_hour() -> None:
    piece = Piece("idle_gpus", OWNER, "h100", 1, hour(1), hour(3))
    parts = split(piece, Pricer(BOOK))
    assert parts == {
        (hour(1), "idle_gpus", None): (Decimal(60 * MINUTE), 60 * MINUTE, 1, 0),
        (hour(2), "idle_gpus", None): (Decimal(60 * MINUTE), 60 * MINUTE, 0, 1),
    }
