"""A job whose worst case alone is more than the whole of a budget that reserves (policy
``refuse`` or ``on_exhausted: stop``, with billing's rates) is refused at submission (422
naming ``max_runtime_seconds``), not admitted to wait for ever: the budget, the worst case
and the longest ``max_runtime_seconds`` it covers are said as the scheduler's note says them
(``shared.worst_case``, one computation for both)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from trainyard_platform.services.scheduler.budget_holds import Unfit, reservation_note_parts
from trainyard_platform.services.submission.errors import Conflict
from trainyard_platform.services.submission.governance import Screening
from trainyard_platform.services.submission.schemas import JobRequest
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

TEN_HOURS = 36000 - KILL_GRACE_SECONDS
"""A ``max_runtime_seconds`` whose attempt (it and the runner's kill grace) is 10 hours."""
RATES = {"a100": {"gpu_hour": "2.5", "cpu_hour": "0.1", "memory_gib_hour": "0.01"}}


def reserving(project: str = "", **more: Any) -> dict[str, Any]:
    """A budget of 3.00 that reserves, nothing spent (as the screening query reads it)."""
    row = {
        "project": project,
        "month": "2026-12",
        "amount": "3.000000",
        "spent": "0.000000",
        "currency": "USD",
        "policy": "refuse",
        "on_exhausted": "finish",
        "rates": RATES,
        "spent_now": False,
    }
    return {**row, **more}


def job(max_runtime_seconds: int = TEN_HOURS, gpus: int = 1, **more: Any) -> JobRequest:
    body = {"name": "j", "entrypoint": "train", "gpus": gpus, "gpu_flavor": "a100"}
    return JobRequest.model_validate(
        {**body, "max_runtime_seconds": max_runtime_seconds, "project": "nlp", **more}
    )


def refusal(screening: Screening, request: JobRequest) -> RequestInvalid:
    with pytest.raises(RequestInvalid) as refused:
        screening.admit(request)
    return refused.value


def test_a_job_over_the_whole_budget_is_refused_naming_max_runtime_seconds() -> None:
    # 10 hours of one GPU at 2.50: 25.00 at worst, against a budget of 3.00 a month.
    refused = refusal(Screening("ml", ["a100"], [reserving()]), job())
    (error,) = refused.errors
    assert error.field == "max_runtime_seconds"
    assert refused.detail == "this job's worst case is more than the whole budget of team ml"
    assert error.message == (
        "this job's worst case (25.000000 USD: its GPUs, CPUs and memory for its "
        "max_runtime_seconds and the 30 s kill grace at the highest prices) is more than the "
        "whole budget of team ml (3.000000 USD a month): the scheduler could never start it; "
        "lower max_runtime_seconds to at most 4290 (what the budget covers at these prices), or ask "
        "a team admin or an operator to raise the budget to at least 25.000000 USD "
        "(trainyard budget set ml --amount 25.000000, or PATCH /v1/budgets/ml)"
    )
    # The scheduler's note of such a job says the same of it, from the same function.
    note = reservation_note_parts(
        Unfit({"team": "ml", **reserving()}, Decimal("25.000000"), Decimal(0), Decimal("2.5")),
        datetime(2026, 12, 7, tzinfo=UTC),
    )
    assert note[1] == "budget of team ml" and note[2] in error.message
    assert note[0].removeprefix("held: ").split(": it cannot")[0] in error.message


def test_what_the_budget_covers_is_admitted_and_a_raise_admits_the_job() -> None:
    # 3.00 covers 4320 s at 2.50 an hour: the limit and the 30 s grace after it.
    assert Screening("ml", ["a100"], [reserving()]).admit(job(4290))[1] == []
    refusal(Screening("ml", ["a100"], [reserving()]), job(4291))
    raised = Screening("ml", ["a100"], [reserving(amount="30")])
    assert raised.admit(job())[1] == []  # what billing says after a raise lets it in


def test_the_project_s_budget_refuses_too_and_cpus_and_memory_count() -> None:
    refused = refusal(Screening("ml", ["a100"], [reserving(project="nlp")]), job(3600, gpus=2))
    assert "whole budget of project nlp of ml" in refused.errors[0].message
    # 2.5 + 8 * 0.1 + 64 * 0.01 = 3.94 an hour: one hour is over 3.00.
    refused = refusal(
        Screening("ml", ["a100"], [reserving()]),
        job(3600 - KILL_GRACE_SECONDS, cpus_per_gpu=8, memory_gib_per_gpu=64),
    )
    assert "(3.940000 USD:" in refused.errors[0].message
    assert "at most 2711" in refused.errors[0].message  # 2741 s less the grace


def test_not_a_second_fits_names_gpus() -> None:
    refused = refusal(Screening("ml", ["a100"], [reserving(amount="0.000001")]), job(3600, 8))
    assert refused.errors[0].field == "gpus"
    assert "ask for fewer GPUs, or ask a team admin" in refused.errors[0].message


def test_a_budget_that_does_not_reserve_refuses_nothing_at_admission() -> None:
    for budget in (
        reserving(rates=None),  # a state said before rates
        reserving(policy="warn"),  # warns once spent: holds nothing
        reserving(policy="deprioritize", on_exhausted="finish"),
    ):
        assert Screening("ml", ["a100"], [budget]).admit(job())[1] == []
    stopping = reserving(policy="warn", on_exhausted="stop")
    refusal(Screening("ml", ["a100"], [stopping]), job())
    other_flavor = job(gpu_flavor="h100")  # no rate: reserved 0
    assert Screening("ml", ["a100", "h100"], [reserving()]).admit(other_flavor)[1] == []


def test_a_reserving_budget_not_spent_this_month_neither_refuses_nor_warns() -> None:
    # Read for its reservation only: the spent policies act on ``spent_now`` rows alone.
    admitted, warnings, lowered = Screening("ml", ["a100"], [reserving()]).admit(job(60))
    assert (warnings, lowered) == ([], None) and admitted.priority == job(60).priority


def test_a_spent_refusing_budget_says_it_is_spent_before_the_job_is_too_large_for_it() -> None:
    """Spent, a ``refuse`` budget refuses every job (409), the one answer that holds however
    the job is changed: telling its owner to lower ``max_runtime_seconds`` (422) would send
    them to change a job that could not start either way (e2e ``test_governance``)."""
    spent = reserving(amount="0.000001", spent="0.000002", spent_now=True)
    with pytest.raises(Conflict) as refused:
        Screening("ml", ["a100"], [spent]).admit(job())
    assert refused.value.detail == (
        "the budget of team ml is spent (0.000002 of 0.000001 USD spent in 2026-12); "
        "new jobs are refused"
    )
