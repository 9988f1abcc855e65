"""One way to show money in the CLI: ``describe`` showed a job's cost to 4 places, ``ls``
too, budgets to the cent, ``waste`` to 4, while ``cost`` showed billing's 6: one cost read
differently from one command to the next, and rows of 4 places did not add up to
billing's total. Now every command shows an amount with ``cli_render.money``, to billing's
6 places."""

from __future__ import annotations

from trainyard.cli_budgets import budget_row
from trainyard.cli_models import cost_lines
from trainyard.cli_prices import price_rows
from trainyard.cli_render import cost_text, list_row, money

T0 = "2026-12-01T10:00:00+00:00"


def test_money_is_billing_s_six_places_with_its_currency() -> None:
    assert money("1.23456789", "EUR") == "1.234568 EUR"
    assert money(0.5) == "0.500000"
    assert money(None) == "-"
    assert money("n/a", "EUR") == "n/a EUR"  # what is no number as it came


def test_describe_and_ls_show_a_job_s_cost_as_cost_does() -> None:
    cost = {
        "final": True,
        "currency": "EUR",
        "cost": 1.2345678,
        "gpu_seconds": 3600,
        "price_per_gpu_hour": 2.75,
    }
    assert cost_text(cost) == ("1.234568 EUR for 1.000 GPU-hours at 2.750000 EUR/GPU-hour (final)")
    job = {
        "id": "0b7e6c4e-1a2b-4c3d-8e9f-0123456789ab",
        "name": "train",
        "user": "ana",
        "status": "SUCCEEDED",
        "gpus": 1,
        "gpu_flavor": "h100",
        "submitted_at": T0,
        "cost": 1.2345678,
        "currency": "EUR",
    }
    assert list_row(job)[-1] == "1.234568 EUR"


def test_budgets_prices_and_model_costs_show_six_places() -> None:
    budget = {
        "team": "ml",
        "project": None,
        "month": "2026-12",
        "amount": "1000.000000",
        "spent": "812.123456",
        "percent_spent": "81.21",
        "currency": "EUR",
        "exhausted": False,
        "runs_out_at": None,
        "policy": "warn",
        "on_exhausted": "finish",
    }
    assert budget_row(budget)[3:5] == ("1000.000000 EUR", "812.123456")
    price = {
        "flavor": "h100",
        "effective_from": T0,
        "price_per_gpu_hour": "2.75",
        "currency": "EUR",
        "in_force": True,
        "set_by": "op",
    }
    assert price_rows(price)[0][3] == "2.750000"
    cost = {
        "by_currency": [{"currency": "EUR", "total": "3.5", "own_job": "1.25", "upstream": "2.25"}],
        "jobs": [],
    }
    assert cost_lines(cost)[0] == (
        "  cost:        3.500000 EUR (own job 1.250000, upstream 2.250000)"
    )
