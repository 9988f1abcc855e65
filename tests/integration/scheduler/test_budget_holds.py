"""A spent budget holds its team's queued jobs, through NATS and PostgreSQL: billing's
``budget.updated`` reaches the scheduler, which keeps the jobs queued before the budget ran
out from starting, tells them why (their ``job.pending`` and the queue's pending reasons),
lets other teams' jobs start, and releases them when the budget is raised."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.integration.scheduler.conftest import Scheduler, preempted
from tests.integration.scheduler.test_policy_service import started
from trainyard_platform.services.billing.domain import Price, Usage
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    BudgetOnExhausted,
    BudgetPolicy,
    BudgetUpdated,
    JobFailed,
    JobPending,
    ReservationRates,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS, attempt_seconds, reservation

pytestmark = pytest.mark.integration


def state(
    revision: int,
    exhausted: bool,
    policy: BudgetPolicy = "refuse",
    on_exhausted: BudgetOnExhausted = "finish",
) -> BudgetUpdated:
    now = datetime.now(UTC)
    return BudgetUpdated(
        team="vision",
        month=f"{now.year:04d}-{now.month:02d}",
        amount="100.000000" if exhausted else "500.000000",
        spent="100.250000",
        currency="USD",
        policy=policy,
        exhausted=exhausted,
        revision=revision,
        on_exhausted=on_exhausted,
    )


async def test_a_spent_budget_holds_queued_jobs_until_it_is_raised(scheduler: Scheduler) -> None:
    # Queued before the budget ran out: no GPU yet.
    await scheduler.submit("queued-1", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "queued-1")
    await scheduler.send(state(1, exhausted=True), "vision")

    (held,) = await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "queued-1" and p.reason.startswith("held:")
    )
    assert "the budget of team vision is spent (100.250000 of 100.000000 USD" in held.reason
    assert held.blocking == "budget of team vision"
    assert held.estimated_start is not None and held.estimated_start.day == 1

    # GPUs come: another team's job starts, the held one does not.
    await scheduler.submit("other-1", gpus=1, team="nlp")
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "other-1")
    # An older state said again (redelivery, reordering) changes nothing.
    await scheduler.send(state(1, exhausted=False), "vision")
    reason = await scheduler.pool.fetchval(
        "SELECT pending_reason FROM jobs WHERE job_id = 'queued-1' AND status = 'QUEUED'"
    )
    assert reason == held.reason  # the queue's pending reasons say it too
    assert scheduler.events(AllocationGranted, lambda g: g.job_id == "queued-1") == []

    # Raised: released at once.
    await scheduler.send(state(2, exhausted=False), "vision")
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "queued-1")


async def test_a_budget_that_only_warns_holds_nothing(scheduler: Scheduler) -> None:
    await scheduler.send(state(1, exhausted=True, policy="warn"), "vision")
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("warned-1", gpus=1)
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "warned-1")


async def test_a_budget_that_stops_checkpoints_its_running_jobs_and_holds_them(
    scheduler: Scheduler,
) -> None:
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.submit("running-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "running-1")
    await scheduler.submit("other-1", gpus=1, team="nlp")
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "other-1")

    await scheduler.send(state(1, exhausted=True, policy="warn", on_exhausted="stop"), "vision")
    (revoke,) = await scheduler.wait_for(AllocationRevoked, lambda r: r.job_id == "running-1")
    # A preemption: the runner checkpoints within the grace and reports it preempted.
    assert (revoke.allocation_id, revoke.reason) == (grant.allocation_id, "preempted")
    assert revoke.detail.startswith("budget_exhausted: the budget of team vision is spent")
    assert scheduler.events(AllocationRevoked, lambda r: r.job_id == "other-1") == []

    await scheduler.send(preempted(grant, reason=revoke.detail), "running-1")
    row = await scheduler.pool.fetchrow(
        "SELECT status, restarts FROM jobs WHERE job_id = 'running-1'"
    )
    assert (row["status"], row["restarts"]) == ("QUEUED", 0)  # not a failure
    await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "running-1" and p.reason.startswith("held:")
    )
    assert len(scheduler.events(AllocationGranted, lambda g: g.job_id == "running-1")) == 1

    await scheduler.send(state(2, exhausted=False, on_exhausted="stop"), "vision")
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "running-1", count=2)


async def test_a_budget_that_lets_running_jobs_finish_stops_none(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("running-1", gpus=1)
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "running-1")
    await scheduler.submit("queued-1", gpus=1)
    await scheduler.send(state(1, exhausted=True, on_exhausted="finish"), "vision")
    # The pass that holds the queued job would have stopped the running one.
    await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "queued-1" and p.reason.startswith("held:")
    )
    assert scheduler.events(AllocationRevoked) == []


async def test_a_budget_that_deprioritizes_is_named_in_its_low_jobs_reasons_until_raised(
    scheduler: Scheduler,
) -> None:
    # Seen: submission admits a job at priority low once its team's budget is spent under
    # ``deprioritize``, and said so only in the answer to the submission; the job's reason
    # (what describe, ls, the job view and the dashboard show) never did.
    await scheduler.submit("low-1", gpus=1, priority="low", lowered_from="normal")
    await scheduler.submit("normal-1", gpus=1)
    # Its user asked for low: job.submitted says no class was lowered, so it is told nothing.
    await scheduler.submit("asked-low", gpus=1, priority="low")
    for job_id in ("low-1", "normal-1", "asked-low"):
        await scheduler.wait_for(JobPending, lambda p, job_id=job_id: p.job_id == job_id)
    await scheduler.send(state(1, exhausted=True, policy="deprioritize"), "vision")
    (told,) = await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "low-1" and p.reason.startswith("deprioritized:")
    )
    assert told.reason.startswith(
        "deprioritized: the budget of team vision is spent (100.250000 of 100.000000 USD spent in "
    )
    assert "until it is raised or the month ends" in told.reason
    # A job arriving while the budget is spent (submission lowered it) is told at once.
    await scheduler.submit("low-2", gpus=1, priority="low", lowered_from="high")
    await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "low-2" and p.reason.startswith("deprioritized:")
    )
    reason = await scheduler.pool.fetchval(
        "SELECT pending_reason FROM jobs WHERE job_id = 'low-1' AND status = 'QUEUED'"
    )
    assert reason == told.reason  # the queue's pending reasons say it too
    # At its own class, or at low because its user asked: nothing lowered it.
    for job_id in ("normal-1", "asked-low"):
        told_plain = scheduler.events(JobPending, lambda p, job_id=job_id: p.job_id == job_id)
        assert told_plain and not any(p.reason.startswith("deprioritized:") for p in told_plain)
    kept = await scheduler.pool.fetch(
        "SELECT job_id, lowered_from FROM jobs WHERE job_id LIKE '%low%' ORDER BY job_id"
    )
    assert [tuple(r) for r in kept] == [("asked-low", None), ("low-1", "normal"), ("low-2", "high")]

    # Raised: the reason goes.
    await scheduler.send(state(2, exhausted=False, policy="deprioritize"), "vision")
    for job_id, count in (("low-1", 2), ("low-2", 1)):  # low-1: as before the budget ran out
        await scheduler.wait_for(
            JobPending,
            lambda p, job_id=job_id: p.job_id == job_id and not p.reason.startswith("deprio"),
            count=count,
        )


HOUR = 3600 - KILL_GRACE_SECONDS
"""A ``max_runtime_seconds`` whose attempt (it and the runner's kill grace) is an hour."""


async def test_jobs_queued_together_start_only_as_far_as_the_budget_covers(
    scheduler: Scheduler,
) -> None:
    # Billing's state: 3.00 of which nothing is spent, with its rates (2.50 per cpu-flavor
    # GPU-hour): room for one of three 1-GPU jobs of an hour. Before reservations all three
    # started together (7.50 at worst), and under finish all ran to their end.
    now = datetime.now(UTC)
    room = BudgetUpdated(
        team="vision",
        month=f"{now.year:04d}-{now.month:02d}",
        amount="3.000000",
        spent="0.000000",
        currency="USD",
        policy="refuse",
        exhausted=False,
        revision=1,
        rates={"cpu": ReservationRates(gpu_hour="2.5")},
    )
    await scheduler.send(room, "vision")
    for job_id in ("r1", "r2", "r3"):
        await scheduler.submit(job_id, gpus=1, max_runtime_seconds=HOUR)
    await scheduler.heartbeat("n1", gpus=4)
    (granted,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id.startswith("r"))
    waiting = {"r1", "r2", "r3"} - {granted.job_id}
    told = await scheduler.wait_for(
        JobPending,
        lambda p: p.job_id in waiting and "cannot cover this job's worst case" in p.reason,
        count=2,
    )
    assert {p.job_id for p in told} == waiting
    assert all(p.blocking == "budget of team vision" for p in told)
    assert len(scheduler.events(AllocationGranted, lambda g: g.job_id in waiting)) == 0

    # Raised to cover them all: they start.
    await scheduler.send(room.model_copy(update={"amount": "10.000000", "revision": 2}), "vision")
    for job_id in waiting:
        await scheduler.wait_for(AllocationGranted, lambda g, j=job_id: g.job_id == j)


async def test_a_spent_state_with_unreadable_rates_still_holds(scheduler: Scheduler) -> None:
    """A ``budget.updated`` whose rates do not validate (a billing of another version, a
    malformed rate) was dead-lettered whole, and the scheduler kept the state before it: a
    budget that became spent held nothing. The state is applied without its rates: the
    budget holds its queued jobs."""
    await scheduler.submit("queued-1", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "queued-1")
    spent = state(1, exhausted=True).model_copy(
        update={"rates": {"cpu": ReservationRates(gpu_hour="2.5")}}
    )
    envelope = Envelope.wrap(spent, source=owner(spent), subject="vision")
    wire = json.loads(envelope.to_json())
    wire["data"]["rates"]["cpu"]["gpu_hour"] = "2.5e3"  # no rate a billing of now says
    await scheduler.bus.publish_raw(
        envelope.nats_subject, json.dumps(wire).encode(), envelope.id, {}
    )
    await scheduler.processed(envelope)

    (held,) = await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "queued-1" and p.reason.startswith("held:")
    )
    assert held.blocking == "budget of team vision"
    row = await scheduler.pool.fetchrow("SELECT exhausted, rates FROM budget_states")
    assert row is not None and (row["exhausted"], row["rates"]) == (True, None)


async def test_a_running_job_s_cost_billing_counts_is_not_reserved_again(
    scheduler: Scheduler,
) -> None:
    # 5.00 with nothing spent: r1 (2.50 at worst) starts. Then billing says 1.25 is spent,
    # what r1 accrued in its first half hour (measured then, counting r1's allocation): r1
    # can cost at most 1.25 more, so r2 (2.50) fits exactly. Before, r1 was reserved its
    # whole 2.50 besides the 1.25 it had accrued, and r2 waited until r1 ended.
    now = datetime.now(UTC)
    room = BudgetUpdated(
        team="vision",
        month=f"{now.year:04d}-{now.month:02d}",
        amount="5.000000",
        spent="0.000000",
        currency="USD",
        policy="refuse",
        exhausted=False,
        revision=1,
        rates={"cpu": ReservationRates(gpu_hour="2.5")},
    )
    await scheduler.send(room, "vision")
    await scheduler.submit("r1", gpus=1, max_runtime_seconds=HOUR)
    await scheduler.heartbeat("n1", gpus=4)
    (first,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "r1")
    # Its runner says it started at once (a job not started yet may still run all its hour).
    await scheduler.send(started(first).model_copy(update={"started_at": first.granted_at}), "r1")
    measured = room.model_copy(
        update={
            "spent": "1.250000",
            "revision": 2,
            "spent_at": first.granted_at + timedelta(minutes=30),
            "accruing": [first.allocation_id],
        }
    )
    await scheduler.send(measured, "vision")
    for job_id in ("r2", "r3"):
        await scheduler.submit(job_id, gpus=1, max_runtime_seconds=HOUR)
    (second,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id in {"r2", "r3"})
    waiting = ({"r2", "r3"} - {second.job_id}).pop()
    await scheduler.wait_for(
        JobPending,
        lambda p: p.job_id == waiting and "cannot cover this job's worst case" in p.reason,
    )
    assert len(scheduler.events(AllocationGranted, lambda g: g.job_id == waiting)) == 0

    # A state that does not say which allocations it counts reserves r1 whole again:
    # 1.25 + 2.50 + 2.50 + 2.50 is more than 7.50, so the last job still waits.
    await scheduler.send(
        measured.model_copy(update={"amount": "7.500000", "revision": 3, "accruing": None}),
        "vision",
    )
    await scheduler.wait_for(
        JobPending,
        lambda p: p.job_id == waiting and "1.250000 of 7.500000 USD is spent" in p.reason,
    )
    assert len(scheduler.events(AllocationGranted, lambda g: g.job_id == waiting)) == 0


async def test_a_job_held_past_its_limits_is_billed_no_more_than_its_reservation(
    scheduler: Scheduler,
) -> None:
    """The reservation a budget makes for a job bounds what its attempt is billed, though
    its allocation is held longer than its process runs: before it (the code, environment
    and checkpoint prepared; the runner's limit starts only at the spawn) and after it (the
    runner's wait for its last checkpoint's upload). Here a job of a 1 s limit is held
    about 35 s, and its release is billed its limit and the kill grace from its grant (31
    s), what the scheduler reserved, not the whole time held."""
    now = datetime.now(UTC)
    rates = {"cpu": ReservationRates(gpu_hour="3600")}  # a GPU-second costs 1 USD
    room = BudgetUpdated(
        team="vision",
        month=f"{now.year:04d}-{now.month:02d}",
        amount="1000.000000",
        spent="0.000000",
        currency="USD",
        policy="refuse",
        exhausted=False,
        revision=1,
        rates=rates,
    )
    await scheduler.send(room, "vision")
    await scheduler.submit("limited", gpus=1, max_runtime_seconds=1)
    await scheduler.heartbeat("n1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "limited")
    await scheduler.send(started(grant), "limited")
    held = grant.granted_at + timedelta(seconds=attempt_seconds(1) + 4)
    await asyncio.sleep(max(0.0, (held - datetime.now(UTC)).total_seconds()))
    ended = JobFailed(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),  # after its limit, its grace and an upload wait
        exit_code=None,
        reason="max runtime exceeded (1 s)",
        failure_kind="max_runtime",
    )
    await scheduler.send(ended, "limited")
    (released,) = await scheduler.wait_for(
        AllocationReleased, lambda r: r.allocation_id == grant.allocation_id
    )
    assert released.released_at == grant.granted_at + timedelta(seconds=attempt_seconds(1))
    bill = Usage.from_release(released, Price("cpu", Decimal("3600"), "USD")).cost
    reserved = reservation(grant.spec.model_dump(), {"cpu": {"gpu_hour": "3600"}})
    assert bill == reserved == Decimal("31.000000")
