"""``model_cost.exact``: the float of billing's ``cost.recorded`` read back as billing's own
decimal amount (6 places), for every amount billing can bill below 10^9; what is not an
amount of money is refused."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trainyard_platform.services.registry.model_cost import exact, money

MICROS_BELOW_A_BILLION = 10**15 - 1


@given(st.integers(min_value=0, max_value=MICROS_BELOW_A_BILLION))
@example(0)
@example(1)
@example(123_456_789_123_456)
@example(MICROS_BELOW_A_BILLION)
def test_billings_amount_survives_the_float_of_its_event(micros: int) -> None:
    amount = Decimal(micros).scaleb(-6)  # what billing rounds to: 6 places
    assert exact(float(amount)) == amount
    assert money(exact(float(amount))) == f"{amount:.6f}"


def test_sums_are_decimal_not_float() -> None:
    assert 0.1 + 0.2 != 0.3  # what summing the events' floats would get wrong
    assert exact(0.1) + exact(0.2) == Decimal("0.300000")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.000001])
def test_what_is_not_an_amount_of_money_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="not an amount of money"):
        exact(bad)
