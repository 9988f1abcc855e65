"""A ``budget.updated`` whose ``rates`` do not validate (a billing of another version, a
malformed rate) is read without them from the wire, saying why, rather than refused whole:
the rest of the state (whether the budget is spent above all) is good, and a consumer that
refused it kept the older state, so a budget that became spent held nothing. Billing, the
producer, still cannot build one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from trainyard_platform.shared.events import Envelope, EventParseError, parse_envelope
from trainyard_platform.shared.events.payloads import (
    MAX_PRICED_FLAVORS,
    BudgetUpdated,
    ReservationRates,
)

STATE = BudgetUpdated(
    team="ml",
    month="2026-12",
    amount="100",
    spent="100.5",
    currency="USD",
    policy="refuse",
    exhausted=True,
    revision=7,
    rates={"a100": ReservationRates(gpu_hour="2.5")},
)


def wire(**data: Any) -> bytes:
    """``STATE`` as billing sends it, with ``data`` changed in its payload."""
    raw = json.loads(Envelope.wrap(STATE, source="trainyard/billing", subject="ml").to_json())
    raw["data"].update(data)
    return json.dumps(raw).encode()


def test_readable_rates_are_read() -> None:
    state = parse_envelope(wire()).data
    assert state == STATE
    assert isinstance(state, BudgetUpdated) and state.rates_unread is None


@pytest.mark.parametrize(
    ("rates", "said"),
    [
        (
            {"a100": {"gpu_hour": "2.5e3"}, "h100": {"gpu_hour": "4"}},
            "rates.a100.gpu_hour: must match the pattern",
        ),
        (
            {f"f{i}": {"gpu_hour": "1"} for i in range(MAX_PRICED_FLAVORS + 1)},
            f"rates: must have at most {MAX_PRICED_FLAVORS} entries",
        ),
        ({"a100": {"cpu_hour": "1"}}, "rates.a100.gpu_hour: field required"),
        ([1, 2], "rates: must be"),
    ],
    ids=["malformed-rate", "too-many", "missing-rate", "not-an-object"],
)
def test_unreadable_rates_leave_the_rest_of_the_state_read(rates: object, said: str) -> None:
    state = parse_envelope(wire(rates=rates)).data
    assert isinstance(state, BudgetUpdated)
    assert state.model_dump(exclude={"rates"}) == STATE.model_dump(exclude={"rates"})
    assert state.exhausted and state.rates is None
    assert state.rates_unread is not None and state.rates_unread.startswith(said)


def test_a_state_bad_beyond_its_rates_is_refused_whole() -> None:
    with pytest.raises(EventParseError) as refused:
        parse_envelope(wire(exhausted="maybe", rates={"a100": {"gpu_hour": "x"}}))
    assert "data.exhausted" in str(refused.value) and "data.rates.a100.gpu_hour" in str(
        refused.value
    )


def test_the_producer_cannot_build_unreadable_rates() -> None:
    fields = {**STATE.model_dump(), "rates": {"a100": {"gpu_hour": "2.5e3"}}}
    with pytest.raises(ValidationError):
        BudgetUpdated(**fields)
    with pytest.raises(ValidationError):
        BudgetUpdated.model_validate(fields)
