"""The arrival fast path in the running scheduler, on NATS and PostgreSQL: a job that can only
wait behind its queue's quota is told why by the fast path, against the last settled pass
kept in memory, without a pass; and a full pass afterwards has nothing new to tell it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.integration.scheduler.conftest import Scheduler, Tuned, until
from tests.integration.scheduler.test_budget_holds import state as budget_state
from tests.integration.scheduler.test_policy_service import checkpoint, running
from trainyard_platform.services.scheduler import admin
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admin_repository import CONFIG_CHANNEL
from trainyard_platform.services.scheduler.admin_schemas import QueueRequest, QuotaRequest
from trainyard_platform.services.scheduler.leader import NotLeader
from trainyard_platform.services.scheduler.loops import LeaderWork, PassLoop
from trainyard_platform.services.scheduler.node_watch import NodeWatch
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.services.scheduler.service import NAME, SUBJECTS
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    BudgetUpdated,
    JobCancelRequested,
    JobFailed,
    JobPending,
    ReservationRates,
    RunnerHeartbeat,
)
from trainyard_platform.shared.identity import operator_token_principal
from trainyard_platform.shared.settings import NatsSettings
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

OPERATOR = operator_token_principal()

pytestmark = pytest.mark.integration


async def _quota_filled_by_a(scheduler_with: Tuned) -> tuple[Scheduler, LeaderWork]:
    """A scheduler with one 4-GPU node and queue q (team vision, nominal 2 GPUs), which the
    running job "a" fills. A long pass interval: every pass here is one an event asked for."""
    scheduler = await scheduler_with(pass_interval_s=60.0)
    work = scheduler.work
    assert work is not None
    await scheduler.heartbeat("n1", gpus=4)
    body = QueueRequest(team="vision", quotas={"cpu": QuotaRequest(nominal=2)})
    await admin.put_queue(scheduler.pool, "q", body, OPERATOR)
    await scheduler.submit("a", gpus=2)
    await running(scheduler, "a")
    return scheduler, work


async def test_an_arrival_behind_a_full_quota_is_decided_by_the_fast_path(
    scheduler_with: Tuned,
) -> None:
    scheduler, work = await _quota_filled_by_a(scheduler_with)
    # "a" fills q's quota; "b" waits for it (the first of its queue: a pass decides it).
    await scheduler.submit("b", gpus=2)
    (b,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "b")
    assert (b.position, b.blocking) == (1, "a")
    # (A pass asked for before "b" was decided may still be due: wait until none is.)
    await until(lambda: work.passes.idle_with_kept_pass)
    passes, fast = work.passes.passes, work.passes.fast_arrivals

    # "c" (low priority: behind "b") can only wait too: the fast path tells it so.
    await scheduler.submit("c", gpus=2, priority="low")
    (c,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "c")
    assert (c.position, c.blocking) == (2, "a")
    assert c.reason.startswith("queue q uses 2 of its 2 cpu quota")
    assert (work.passes.passes, work.passes.fast_arrivals) == (passes, fast + 1)

    # A full pass over the same state agrees: nothing about "c" is news to it.
    await work.passes.run_once()
    row = await scheduler.pool.fetchrow(
        "SELECT pending_reason, pending_position, pending_blocking, pending_suggestion, "
        "pending_estimated_start FROM jobs WHERE job_id = 'c'"
    )
    assert tuple(row) == (c.reason, c.position, c.blocking, c.suggestion, c.estimated_start)
    assert work.passes.passes == passes + 1


async def test_a_kept_pass_does_not_outlive_the_leadership_term(
    pool: asyncpg.Pool, nats_settings: NatsSettings
) -> None:
    # The same LeaderWork leads again after a lost term (service.serve builds it once); in
    # between another leader may have placed jobs and the admin NOTIFYs went unheard, so a
    # pass kept from the old term must not decide the arrivals of the new one.
    async with Bus.connect(nats_settings, "scheduler-test") as bus:
        work = LeaderWork(NAME, pool, bus, SUBJECTS, Tuning(), pass_interval_s=60.0)
        stop = asyncio.Event()
        term = asyncio.create_task(work.run(stop))
        await until(lambda: work.passes.idle_with_kept_pass)
        stop.set()
        await term
    assert not work.passes.idle_with_kept_pass
    assert not await work.passes.decide_arrivals(["j"])


class _ChangedAtCommit:
    """A pool whose first connection, once given back, lets ``change`` run: a change that
    got the scheduling lock when a pass committed, before the pass loop resumed."""

    def __init__(self, pool: asyncpg.Pool, change: Callable[[], None]) -> None:
        self._pool = pool
        self._change: Callable[[], None] | None = change

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._pool.acquire() as conn:
            yield conn
        change, self._change = self._change, None
        if change is not None:
            change()


async def test_a_change_while_a_pass_commits_is_not_lost_to_the_kept_pass(
    pool: asyncpg.Pool,
) -> None:
    # A batch (or the admin NOTIFY) that forgets the kept pass between the pass's commit and
    # the pass loop keeping it: the pass it would keep no longer is the state.
    loop = PassLoop(pool, Tuning(), interval_s=60.0)
    loop._pool = _ChangedAtCommit(pool, loop.forget)  # type: ignore[assignment]
    await loop.run_once()
    assert not loop.idle_with_kept_pass
    await loop.run_once()  # nothing changed during this one: it is kept
    assert loop.idle_with_kept_pass


async def test_cancelling_a_running_job_drops_the_kept_pass(scheduler_with: Tuned) -> None:
    # A cancelled running job asks for no pass (it still holds its GPUs), but a pass reads it
    # as leaving (never a victim again, its GPUs free within the grace): the kept pass is
    # no longer what a pass over the state would decide.
    scheduler, work = await _quota_filled_by_a(scheduler_with)
    await until(lambda: work.passes.idle_with_kept_pass)

    await scheduler.send(JobCancelRequested(job_id="a", team="vision", user="ada"), "a")
    status = await scheduler.pool.fetchval("SELECT status FROM jobs WHERE job_id = 'a'")
    assert status == "CANCELLING"
    assert not work.passes.idle_with_kept_pass


async def test_a_checkpoint_drops_the_kept_pass(scheduler_with: Tuned) -> None:
    # A checkpoint asks for no pass, but victims are chosen by the work they would lose
    # since it: a pass over the state may now choose otherwise than the kept one.
    scheduler, work = await _quota_filled_by_a(scheduler_with)
    await until(lambda: work.passes.idle_with_kept_pass)
    passes = work.passes.passes

    (grant,) = scheduler.events(AllocationGranted, lambda g: g.job_id == "a")
    await scheduler.send(checkpoint(grant, datetime.now(UTC)), "a")
    saved = await scheduler.pool.fetchval(
        "SELECT last_checkpoint_at FROM allocations WHERE job_id = 'a'"
    )
    assert saved is not None
    assert not work.passes.idle_with_kept_pass
    assert work.passes.passes == passes  # (and no pass was asked for)


async def test_an_admin_change_drops_the_kept_pass_before_the_pass_it_asks_for(
    pool: asyncpg.Pool,
) -> None:
    # The NOTIFY of an admin change asks for a pass; until that pass has run, arrivals must
    # not be decided against the configuration the kept pass was made with.
    loop = PassLoop(pool, Tuning(), interval_s=60.0)
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "host", "cpu", 4, datetime.now(UTC))
    await loop.run_once()
    assert loop.idle_with_kept_pass
    async with pool.acquire() as listener:
        await listener.add_listener(CONFIG_CHANNEL, loop._on_notify)  # as PassLoop.run does
        try:
            body = QueueRequest(team="vision", quotas={"cpu": QuotaRequest(nominal=2)})
            await admin.put_queue(pool, "q", body, OPERATOR)
            await until(lambda: not loop.idle_with_kept_pass)  # the notify was heard
        finally:
            await listener.remove_listener(CONFIG_CHANNEL, loop._on_notify)
    assert not await loop.decide_arrivals(["j"])  # no pass ran yet: a pass must decide


async def test_a_lost_node_drops_the_kept_pass(pool: asyncpg.Pool) -> None:
    # The sweep that declares a node lost (its jobs requeued, its GPUs gone) forgets the kept
    # pass in its own transaction, before the pass it leads to.
    at = [datetime.now(UTC)]
    loop = PassLoop(pool, Tuning(), interval_s=3600.0, clock=lambda: at[0])
    watch = NodeWatch(pool, 1.0, 10.0, lambda: at[0], on_lost=loop.forget)
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "host", "cpu", 4, at[0])
    await loop.run_once()
    assert loop.idle_with_kept_pass
    at[0] += timedelta(seconds=60)  # silent for longer than the timeout
    assert await watch.sweep() == ["n1"]
    assert not await loop.decide_arrivals(["j"])


async def test_a_kept_pass_is_void_after_the_pass_interval(pool: asyncpg.Pool) -> None:
    # Ageing and estimates move with the clock: from the pass's clock plus the interval (when
    # the timer pass re-decides everything) arrivals are not decided against it.
    at = [datetime.now(UTC)]
    loop = PassLoop(pool, Tuning(), interval_s=5.0, clock=lambda: at[0])
    await loop.run_once()
    at[0] += timedelta(seconds=4.9)
    assert await loop.decide_arrivals(["j"])  # ("j" is not queued: nothing to decide)
    at[0] += timedelta(seconds=0.2)
    assert not await loop.decide_arrivals(["j"])


async def test_an_arrival_in_a_queue_with_a_job_backing_off_gets_a_pass(
    scheduler_with: Tuned,
) -> None:
    # A job backing off after a failure is kept from the policy and told its place last in
    # its queue; an arrival decided alone would take that place too (the fast path does not
    # tell the held job again), so a pass decides it.
    scheduler = await scheduler_with(pass_interval_s=60.0, restart_backoff_s=600.0)
    work = scheduler.work
    assert work is not None
    await scheduler.heartbeat("n1", gpus=4)
    body = QueueRequest(team="vision", quotas={"cpu": QuotaRequest(nominal=2)})
    await admin.put_queue(scheduler.pool, "q", body, OPERATOR)
    await scheduler.submit("r", gpus=2, max_restarts=1)
    grant = await running(scheduler, "r")
    failed = JobFailed(
        job_id="r",
        allocation_id=grant.allocation_id,
        node_id="n1",
        epoch=grant.epoch,
        finished_at=datetime.now(UTC),
        exit_code=1,
        reason="crashed",
    )
    await scheduler.send(failed, "r")
    await scheduler.submit("a", gpus=2)
    await running(scheduler, "a")
    await scheduler.submit("b", gpus=2)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "b")
    await until(lambda: work.passes.idle_with_kept_pass)
    fast = work.passes.fast_arrivals

    await scheduler.submit("c", gpus=2, priority="low")
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "c")
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "r" and p.position == 3)
    positions = await scheduler.pool.fetch(
        "SELECT job_id, pending_position FROM jobs WHERE status = 'QUEUED' ORDER BY job_id"
    )
    assert [tuple(row) for row in positions] == [("b", 1), ("c", 2), ("r", 3)]
    assert work.passes.fast_arrivals == fast


async def test_an_arrival_of_a_class_the_kept_pass_does_not_know_gets_a_pass(
    scheduler_with: Tuned,
) -> None:
    # A class defined after the kept pass was made (its NOTIFY not heard yet: written here
    # without one) is unknown to it: a pass decides a job of that class. Decided alone, the
    # job ranked as if of the default class: behind "b", where it outranks it.
    scheduler, work = await _quota_filled_by_a(scheduler_with)
    await scheduler.submit("b", gpus=2)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "b")
    await until(lambda: work.passes.idle_with_kept_pass)
    passes, fast = work.passes.passes, work.passes.fast_arrivals
    await scheduler.pool.execute(
        "INSERT INTO priority_classes (name, value, preemptible, min_runtime_seconds) "
        "VALUES ('urgent', 150, true, 0)"
    )

    await scheduler.submit("c", gpus=2, priority="urgent")
    (c,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "c")
    assert c.position == 1
    assert work.passes.fast_arrivals == fast
    assert work.passes.passes > passes


async def test_a_change_that_asks_for_a_pass_drops_the_kept_pass_before_it_commits(
    pool: asyncpg.Pool, nats_settings: NatsSettings
) -> None:
    # Between the commit of a batch that asks for a pass (here a new node) and that pass, a
    # batch of arrivals must not be decided against the state before it.
    async with Bus.connect(nats_settings, "scheduler-test") as bus:
        work = LeaderWork(NAME, pool, bus, SUBJECTS, Tuning(), pass_interval_s=60.0)
        await work.passes.run_once()
        assert work.passes.idle_with_kept_pass
        now = datetime.now(UTC)
        beat = RunnerHeartbeat(
            node_id="n1", hostname="n1.local", gpu_flavor="cpu", gpu_count=4, sent_at=now
        )
        async with pool.acquire() as conn, conn.transaction():
            await work.handlers.on_heartbeat(conn, beat, now)
            assert not work.passes.idle_with_kept_pass  # already before the commit
        assert not await work.passes.decide_arrivals(["j"])


async def test_a_deposed_leader_decides_no_arrival_by_the_fast_path(pool: asyncpg.Pool) -> None:
    # The fast path checks leadership under the scheduling lock, as a pass does: a leader
    # deposed since its kept pass publishes nothing and forgets it.
    leading = [True]

    async def guard(conn: asyncpg.Connection) -> None:
        if not leading[0]:
            raise NotLeader("another scheduler leads")

    loop = PassLoop(pool, Tuning(), interval_s=60.0, guard=guard)
    await loop.run_once()
    assert await loop.decide_arrivals(["j"])  # ("j" is not queued: nothing to decide)
    leading[0] = False
    assert not await loop.decide_arrivals(["j"])
    assert not loop.idle_with_kept_pass


async def test_an_arrival_of_a_team_whose_spent_budget_lowers_it_is_decided_by_the_fast_path(
    scheduler_with: Tuned,
) -> None:
    # Seen: every arrival of a team whose spent budget lowers its new jobs cost a whole
    # pass (at 10,000 nodes, seconds), because only a pass worded their "deprioritized"
    # note; a team submitting while over budget so made the scheduler pass on each arrival.
    scheduler, work = await _quota_filled_by_a(scheduler_with)
    await scheduler.send(budget_state(1, exhausted=True, policy="deprioritize"), "vision")
    await scheduler.submit("b", gpus=2, priority="low", lowered_from="normal")
    await scheduler.wait_for(
        JobPending, lambda p: p.job_id == "b" and p.reason.startswith("deprioritized:")
    )
    await until(lambda: work.passes.idle_with_kept_pass)
    passes, fast = work.passes.passes, work.passes.fast_arrivals

    # "c" (lowered by the spent budget) and "d" (low because its user asked) wait behind "b".
    await scheduler.submit("c", gpus=2, priority="low", lowered_from="high")
    (c,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "c")
    await scheduler.submit("d", gpus=2, priority="low")
    (d,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "d")
    assert c.reason.startswith("deprioritized: the budget of team vision is spent")
    assert "queue q uses 2 of its 2 cpu quota" in c.reason
    assert d.reason.startswith("queue q uses 2 of its 2 cpu quota")
    assert (c.position, d.position) == (2, 3)
    assert (work.passes.passes, work.passes.fast_arrivals) == (passes, fast + 2)

    # A full pass over the same state agrees: nothing about "c" or "d" is news to it.
    await work.passes.run_once()
    for told in (c, d):
        row = await scheduler.pool.fetchrow(
            "SELECT pending_reason, pending_position, pending_blocking, pending_suggestion, "
            "pending_estimated_start FROM jobs WHERE job_id = $1",
            told.job_id,
        )
        assert tuple(row) == (
            told.reason,
            told.position,
            told.blocking,
            told.suggestion,
            told.estimated_start,
        )
    assert len(scheduler.events(JobPending, lambda p: p.job_id in ("c", "d"))) == 2


async def test_an_arrival_of_a_team_whose_budget_reserves_is_decided_by_the_fast_path(
    scheduler_with: Tuned,
) -> None:
    # Seen: every arrival of a team with a budget that reserves cost a whole pass, and sent
    # the whole batch it came in (every team's arrivals) to it. One that leaves the
    # budget's reservations as they were (it fits, and holds no other job of its team) is
    # decided like any other; one that waits for its budget still gets a pass.
    scheduler, work = await _quota_filled_by_a(scheduler_with)
    now = datetime.now(UTC)
    reserving = BudgetUpdated(
        team="vision",
        month=f"{now.year:04d}-{now.month:02d}",
        amount="100.000000",
        spent="0.000000",
        currency="USD",
        policy="refuse",
        exhausted=False,
        revision=1,
        rates={"cpu": ReservationRates(gpu_hour="2.5")},
    )
    await scheduler.send(reserving, "vision")
    await scheduler.submit("b", gpus=2)  # 5.041667 at worst (the hour and the kill grace)
    (b,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "b")
    assert (b.position, b.blocking) == (1, "a")
    await until(lambda: work.passes.idle_with_kept_pass)
    passes, fast = work.passes.passes, work.passes.fast_arrivals

    # "c" fits too (15.125001 of 100.00) and can only wait behind "b": the fast path tells it.
    await scheduler.submit("c", gpus=2, priority="low")
    (c,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "c")
    assert (c.position, c.blocking) == (2, "a")
    assert c.reason.startswith("queue q uses 2 of its 2 cpu quota")
    assert (work.passes.passes, work.passes.fast_arrivals) == (passes, fast + 1)

    # A full pass over the same state agrees: nothing about "c" is news to it.
    await work.passes.run_once()
    row = await scheduler.pool.fetchrow(
        "SELECT pending_reason, pending_position, pending_blocking, pending_suggestion, "
        "pending_estimated_start FROM jobs WHERE job_id = 'c'"
    )
    assert tuple(row) == (c.reason, c.position, c.blocking, c.suggestion, c.estimated_start)
    assert len(scheduler.events(JobPending, lambda p: p.job_id == "c")) == 1

    # "d" (100.00 at worst: 20 h with the kill grace) does not fit beside them: a pass decides it and tells why.
    await until(lambda: work.passes.idle_with_kept_pass)
    passes = work.passes.passes
    await scheduler.submit(
        "d", gpus=2, priority="low", max_runtime_seconds=72000 - KILL_GRACE_SECONDS
    )
    (d,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "d")
    assert "cannot cover this job's worst case (100.000000 USD" in d.reason
    assert work.passes.passes > passes
