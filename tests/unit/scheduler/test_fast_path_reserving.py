"""The arrival fast path decides an arrival of a team whose budget reserves only when a pass
would weigh the budget's jobs exactly as the kept pass did, with the arrival among them and
holding none: the same jobs held for their budget, for the same reasons, and not it."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from tests.unit.scheduler.test_budget_holds import implicit_queue_z
from tests.unit.scheduler.test_budget_reservations import hour_job, reserving_budget
from tests.unit.scheduler.test_convert import HALF_LIFE, NOW, queue, rows
from trainyard_platform.services.scheduler.convert import Built, build_snapshot
from trainyard_platform.services.scheduler.fast_path import Kept, _fits_as_before
from trainyard_platform.services.scheduler.policy.engine import PolicyState
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from trainyard_platform.services.scheduler.scheduling import PassResult

TEAM = {"team": "team-a", "project": "vision"}
QUEUES = [queue("qa", "team-a", "c1"), queue(implicit_queue_z(), "team-z", True)]


def built(pending: list[dict[str, Any]], amount: str = "10.000000") -> Built:
    snapshot_rows = rows(
        budgets=[reserving_budget("team-a", amount=amount)], queues=QUEUES, pending=pending
    )
    return build_snapshot(snapshot_rows, NOW, HALF_LIFE)


def kept(pending: list[dict[str, Any]], amount: str = "10.000000") -> Kept:
    made = built(pending, amount)
    state = PolicyState(made.snapshot, PolicyConfig())
    result = PassResult(made, state, state.run(), {})
    return Kept.of(result, PolicyConfig(), interval_s=60.0)


def job(job_id: str, seq: int, gpus: int = 1, **more: Any) -> dict[str, Any]:
    return hour_job(job_id, "qa", gpus=gpus, seq=seq, **{**TEAM, **more})


def test_an_arrival_that_fits_after_the_others_leaves_them_as_they_were() -> None:
    before = kept([job("a1", 1), job("a2", 2)])  # 5.00 of 10.00 reserved
    assert _fits_as_before(before, job("a3", 3))  # 7.50: it fits, after them


def test_an_arrival_that_waits_for_its_budget_needs_a_pass() -> None:
    before = kept([job("a1", 1), job("a2", 2)])
    assert not _fits_as_before(before, job("a3", 3, gpus=4))  # 10.00 more: it waits


def test_an_arrival_before_others_in_the_order_that_makes_one_wait_needs_a_pass() -> None:
    # A high job goes before a2 in the budget's order and takes the room a2 had.
    before = kept([job("a1", 1, gpus=2), job("a2", 2, gpus=2)])  # 10.00: both fit
    high = job("h", 3, priority_class="high")
    assert not _fits_as_before(before, high)
    assert set(built([*before.result.built.pending.values(), high]).unfit) == {"a2"}


def test_it_agrees_with_a_pass_over_the_kept_jobs_and_the_arrival() -> None:
    # Whenever it says an arrival leaves the reservations as they were, a pass over the kept
    # jobs with it holds the same jobs for the same reasons, and not it.
    rnd = random.Random(7)
    classes = ["low", "normal", "high"]
    agreed = 0
    for trial in range(200):
        pending = [
            job(
                f"j{i}",
                i,
                gpus=rnd.choice([1, 1, 2, 4]),
                priority_class=rnd.choice(classes),
                submitted_at=NOW - timedelta(minutes=rnd.choice([1, 30, 90, 200])),
            )
            for i in range(rnd.randint(0, 6))
        ]
        arrival = job(
            "new",
            100 + trial,
            gpus=rnd.choice([1, 2]),
            priority_class=rnd.choice(classes),
            submitted_at=NOW - timedelta(seconds=rnd.choice([0, 10])),
        )
        amount = rnd.choice(["5", "10", "12.5", "20"])
        before = kept(pending, amount)
        if _fits_as_before(before, arrival):
            agreed += 1
            after = built([*pending, arrival], amount)
            assert "new" not in after.unfit
            assert after.unfit == before.result.built.unfit
        else:
            after = built([*pending, arrival], amount)
            assert "new" in after.unfit or after.unfit != before.result.built.unfit
    assert 20 < agreed < 200  # both kinds were tried


def test_arrivals_decided_since_the_pass_are_weighed_with_the_next() -> None:
    before = kept([job("a1", 1), job("a2", 2)])  # 5.00 of 10.00
    before.weighed.append(job("a3", 3))  # decided by the fast path: 7.50
    assert _fits_as_before(before, job("a4", 4))  # 10.00
    before.weighed.append(job("a4", 4))
    assert not _fits_as_before(before, job("a5", 5))  # 12.50: a pass tells it to wait
