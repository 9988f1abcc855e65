"""``budget_holds.fit`` parses each reserving budget's amount, spent and rates once a pass,
not once per queued job, and answers exactly what the per-job reading answered."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from trainyard_platform.services.scheduler import budget_holds
from trainyard_platform.services.scheduler.budget_holds import Unfit, fit, reservation
from trainyard_platform.shared import worst_case

FLAVORS = ("a100", "h100", "l4")


def _reference_fit(
    queued: Iterable[Mapping[str, Any]],
    running: Mapping[str, Sequence[Mapping[str, Any]]],
    reserves: Mapping[tuple[str, str], Mapping[str, Any]],
) -> dict[str, Unfit]:
    """``fit`` as it was before it parsed each budget once: every Decimal read per job."""
    d = worst_case.decimal
    reserved = {key: Decimal(0) for key in reserves}
    for members in running.values():
        first = members[0]
        for b in budget_holds.reserves_for(first.get("team", ""), first.get("project"), reserves):
            reserved[(b["team"], b["project"])] += reservation(first, b["rates"])
    unfit: dict[str, Unfit] = {}
    for job in queued:
        budgets = budget_holds.reserves_for(job.get("team", ""), job.get("project"), reserves)
        needs = [(b, reservation(job, b["rates"])) for b in budgets]
        short = next(
            (
                (b, need)
                for b, need in needs
                if d(b["spent"]) + reserved[(b["team"], b["project"])] + need > d(b["amount"])
            ),
            None,
        )
        if short is not None:
            b, need = short
            key = (b["team"], b["project"])
            unfit[job["job_id"]] = Unfit(
                b, need, reserved[key], budget_holds.hourly(job, b["rates"])
            )
            continue
        for b, need in needs:
            reserved[(b["team"], b["project"])] += need
    return unfit


def _seeded(seed: int) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], dict]:
    rnd = random.Random(seed)

    def price() -> str:
        return rnd.choice(["0", "0.1", "2.5", "1.234567", "3.3333333", "bad", "-1", "NaN"])

    reserves: dict[tuple[str, str], dict[str, Any]] = {}
    for t in range(30):
        for project in ["", *(f"p{p}" for p in range(rnd.randint(0, 2)))]:
            if rnd.random() < 0.3:
                continue
            rates = {
                f: {"gpu_hour": price(), "cpu_hour": price(), "memory_gib_hour": price()}
                for f in FLAVORS
                if rnd.random() < 0.8
            }
            reserves[(f"t{t}", project)] = {
                "team": f"t{t}",
                "project": project,
                "month": "2025-03",
                "amount": rnd.choice(["10", "50.5", "100.000000", "3", "0"]),
                "spent": rnd.choice(["0.000000", "1.5", "9.999999", "40"]),
                "currency": "USD",
                "rates": rates,
            }

    def job(i: int) -> dict[str, Any]:
        return {
            "job_id": f"j{i}",
            "team": f"t{rnd.randrange(30)}",
            "project": rnd.choice([None, "p0", "p1"]),
            "gpu_flavor": rnd.choice(FLAVORS),
            "gpus": rnd.randint(1, 8),
            "cpus_per_gpu": rnd.choice([0, 4, 8]),
            "memory_gib_per_gpu": rnd.choice([0, 16, 64]),
            "max_runtime_seconds": rnd.choice([60, 3600, 7201, 86400]),
        }

    queued = [job(i) for i in range(800)]
    running = {f"r{i}": [job(10_000 + i)] for i in range(100)}
    return queued, running, reserves


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fit_answers_what_the_per_job_reading_answered(seed: int) -> None:
    queued, running, reserves = _seeded(seed)
    found = fit(queued, running, reserves)
    assert found == _reference_fit(queued, running, reserves)
    assert found  # the set is tight enough that some jobs wait


def test_fit_parses_each_budget_once_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    queued, running, reserves = _seeded(4)
    calls = 0
    real = worst_case.decimal

    def counting(value: object) -> Decimal:
        nonlocal calls
        calls += 1
        return real(value)

    monkeypatch.setattr(worst_case, "decimal", counting)
    fit(queued, running, reserves)
    # amount, spent and three prices of each flavor, once per budget: not per job.
    assert calls <= len(reserves) * (2 + 3 * len(FLAVORS))
