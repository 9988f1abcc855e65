"""The leader's work: consume events, run passes, sweep for lost nodes.

Contract:
- ``PassLoop`` runs a scheduling pass (in its own transaction, under the scheduling lock and
  the leader check) whenever it is poked -- by a handler after a change of supply or demand
  has committed, or by an admin change of queues, quotas or classes (``NOTIFY`` on
  ``CONFIG_CHANNEL``, heard on a connection of its own, ``db.Listening``: one lost is opened
  again at once, followed by a pass for what it may have missed) -- and at least every
  ``interval_s``. Pokes that arrive while a pass
  runs are coalesced into the next pass, and after each pass the loop rests as long as the
  pass took, so passes use at most about half of the leader's time and a burst of events
  gathers into a few passes, not one each (a 10 ms pass delays the next by 10 ms). Before
  each pass it revokes the GPUs of victims whose preemption grace is over (``leases``). A
  pass that placed jobs leaves the pending notes to an immediate follow-up pass over the
  settled state (``run_pass(settled_notes=True)``), unless notes have waited ``interval_s``
  already. When a job backs off after a failure, the loop also wakes when the first such
  job becomes eligible (``jobs.eligible_at``), so it is placed then, not up to
  ``interval_s`` later; likewise when the first automatic cordon of a node runs out, and
  before each pass it lifts those that have (``cordon.lift_expired``).
- A pass that placed and preempted nothing is kept for the arrival fast path
  (``fast_path``): a batch of events that only queued new jobs has them decided against it
  (``PassLoop.decide_arrivals``) instead of asking for a pass, where each provably can only
  wait; anything else a pass reads that changes drops it first (``PassLoop.forget``).
- ``LeaderWork.run(stop)`` is what a leader does until ``stop``: the event consumer (each
  fetched batch applied in one transaction, under the scheduling lock and the leader check),
  the pass loop and the lost-node watch, which judges nodes only by what this consumer has
  heard (``node_watch.BusHearing``), and the node supply herald, which says every ready
  node's supply again (``node_supply.SupplyHerald``). A database error in a pass is logged
  and retried; a crash of any part stops the process (``ServiceRuntime``'s rule).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import asyncpg

from trainyard_platform.services.scheduler import cordon
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admin_repository import CONFIG_CHANNEL
from trainyard_platform.services.scheduler.fast_path import Kept, decide_arrivals
from trainyard_platform.services.scheduler.handlers import SchedulerHandlers
from trainyard_platform.services.scheduler.leader import NotLeader
from trainyard_platform.services.scheduler.leases import release_expired_notices
from trainyard_platform.services.scheduler.node_supply import HERALD_INTERVAL_S, SupplyHerald
from trainyard_platform.services.scheduler.node_watch import BusHearing, NodeWatch
from trainyard_platform.services.scheduler.scheduling import (
    Clock,
    PassResult,
    Tuning,
    run_pass,
    utc_now,
)
from trainyard_platform.shared.bus import Bus, Delivery
from trainyard_platform.shared.db import (
    DATABASE_FAULTS,
    Listening,
    failed_rounds_from_zero,
    log_failed_round,
)
from trainyard_platform.shared.inbox import Guard, idempotent_batches, no_guard

log = logging.getLogger(__name__)

_SKIPPED: tuple[type[BaseException], ...] = (NotLeader, *DATABASE_FAULTS)
"""Why a round is skipped and tried again: leadership lost, or the database failed."""

EVENT_BATCH = 1024
"""Events the leader applies per transaction. Large on purpose: each batch is followed by one
pass, and a pass over a long queue costs about the same after 1,024 new jobs as after 256
(loading, explaining and telling every waiting job dominates it); measured in
``bench/scheduler_e2e.py``: 64 -> 256 took sustained throughput with completions from about
300 to about 450 decisions/s; 256 -> 1,024 took a run of 10,800 jobs on 800 GPUs (10,000
waiting) from 40-42 passes to 27 (BENCHMARKS.md, "Scheduler end to end")."""


class PassLoop:
    """Scheduling passes on demand and on a timer (see the module docstring)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tuning: Tuning,
        interval_s: float = 5.0,
        clock: Clock = utc_now,
        guard: Guard = no_guard,
    ) -> None:
        self._pool = pool
        self._tuning = tuning
        self._interval_s = interval_s
        self._clock = clock
        self._guard = guard
        self._wake = asyncio.Event()
        self._notes_at = time.monotonic()
        self._rest_until = 0.0
        self._due_at: float | None = None
        """Monotonic time when the next job backing off becomes eligible, or the next
        automatic cordon ends, whichever is first (None: neither)."""
        self.passes = 0
        self._kept: Kept | None = None
        """The last settled pass, for the arrival fast path (``fast_path``); None: none
        that is still current."""
        self.fast_arrivals = 0
        """Jobs decided by the fast path."""
        self._forgotten = 0
        """How many times the kept pass was forgotten: a pass is kept only if nothing was
        forgotten while it ran or committed."""

    def poke(self) -> None:
        """Ask for a pass soon (after the caller's transaction commits)."""
        self._wake.set()

    @property
    def idle_with_kept_pass(self) -> bool:
        """No pass running or asked for, and a settled pass kept for the fast path."""
        return self._kept is not None and not self._wake.is_set()

    def forget(self) -> None:
        """Something a pass reads changed (or is about to, in a transaction not yet
        committed): the kept pass is no longer current."""
        self._kept = None
        self._forgotten += 1

    async def decide_arrivals(self, job_ids: Sequence[str]) -> bool:
        """Decide these jobs, just queued, by the fast path (``fast_path.decide_arrivals``)
        in a transaction of its own, under the scheduling lock and the leader check; False
        (and the kept pass forgotten) when a pass must decide them."""
        kept = self._kept
        if kept is None:
            return False
        decided = False
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await repo.lock_scheduler(conn)
                await self._guard(conn)
                # A pass or a change may have come first while the lock was awaited.
                if self._kept is kept:
                    decided = await decide_arrivals(conn, kept, job_ids, self._clock())
        except _SKIPPED as exc:
            log_failed_round(log, "fast-path", "fast path failed: %s; a pass decides", exc)
            decided = False
        if decided:
            self.fast_arrivals += len(job_ids)
        else:
            self.forget()
        return decided

    async def run(self, stop: asyncio.Event) -> None:
        failed_rounds_from_zero("scheduling-pass")
        failed_rounds_from_zero("fast-path")
        failed_rounds_from_zero("config-listener")
        listening = Listening(
            self._pool,
            CONFIG_CHANNEL,
            self._on_notify,
            self.poke,  # lost: the next round listens again
            purpose="scheduler-config",
        )
        try:
            while not stop.is_set():
                try:
                    if await listening.ensure():
                        self._on_notify()  # changes said while none listened are missed
                except DATABASE_FAULTS as exc:
                    # The pass below likely fails too; either way, the next round tries again.
                    log_failed_round(log, "config-listener", "cannot listen: %s; retrying", exc)
                await self._sleep(stop)
                if stop.is_set():
                    return
                self._wake.clear()
                started = time.monotonic()
                try:
                    await self.run_once()
                except NotLeader as exc:
                    log.info("pass skipped: %s", exc)
                except DATABASE_FAULTS as exc:
                    log_failed_round(
                        log, "scheduling-pass", "scheduling pass failed: %s; retrying", exc
                    )
                    await asyncio.sleep(min(1.0, self._interval_s))
                    self.poke()
                finished = time.monotonic()
                self._rest_until = finished + (finished - started)
        finally:
            await listening.close()

    async def run_once(self) -> None:
        """One pass now: forced releases first, then the policy, in one transaction; a
        settled pass is kept for the fast path once it has committed."""
        started = time.monotonic()
        self.forget()
        forgotten = self._forgotten
        kept: list[PassResult] = []
        async with self._pool.acquire() as conn, conn.transaction():
            await repo.lock_scheduler(conn)
            await self._guard(conn)
            now, at = self._clock(), time.monotonic()
            await release_expired_notices(conn, now, self._tuning)
            cordon_ends = await cordon.lift_expired(conn, now)
            overdue = started - self._notes_at >= self._interval_s
            decisions = await run_pass(
                conn, now, self._tuning, settled_notes=not overdue, keep=kept.append
            )
            due = [await repo.next_eligible_at(conn, now), cordon_ends]
            due_at = min((d for d in due if d is not None), default=None)
        # A change that got the lock as this pass committed may have forgotten it already
        # (before this coroutine resumed): then it is not the state any more.
        if kept and self._forgotten == forgotten:
            self._kept = Kept.of(kept[0], self._tuning.policy, self._interval_s, due_at)
        self._due_at = None
        if due_at is not None:
            self._due_at = at + (due_at - now).total_seconds()
        self.passes += 1
        log.debug(
            "pass %d: %d placed, %d preempted, %d waiting in %.1f ms",
            self.passes,
            len(decisions.placements),
            len(decisions.preemptions),
            len(decisions.explanations),
            1000 * (time.monotonic() - started),
        )
        if decisions.placements and not overdue:
            self.poke()  # the follow-up pass tells the waiting jobs
        else:
            self._notes_at = time.monotonic()

    def _on_notify(self, *_: object) -> None:
        self.forget()
        self.poke()

    async def _sleep(self, stop: asyncio.Event) -> None:
        """Until poked (after the rest that follows a pass), stopped, ``interval_s``, or the
        next job backing off becomes eligible."""
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        timeout = self._interval_s
        if self._due_at is not None:
            timeout = max(0.0, min(timeout, self._due_at - time.monotonic()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            rest = self._rest_until - time.monotonic()
            if rest > 0 and not stop.is_set():
                await asyncio.wait([waiters[1]], timeout=rest)
        finally:
            for task in waiters:
                task.cancel()


class LeaderWork:
    """Everything the leader runs (see the module docstring)."""

    def __init__(
        self,
        name: str,
        pool: asyncpg.Pool,
        bus: Bus,
        subjects: list[str],
        tuning: Tuning,
        *,
        pass_interval_s: float = 5.0,
        node_check_interval_s: float = 2.0,
        node_timeout_s: float = 15.0,
        node_reconnect_grace_s: float = 5.0,
        supply_herald_interval_s: float = HERALD_INTERVAL_S,
        clock: Clock = utc_now,
        guard: Guard = no_guard,
    ) -> None:
        self.passes = PassLoop(pool, tuning, pass_interval_s, clock, guard)
        self.handlers = SchedulerHandlers(
            clock=clock,
            consumer=name,
            tuning=tuning,
            poke=self._ask_for_pass,
            arrived=self._arrived,
            stale=self.passes.forget,
        )
        self._pass_asked = False
        self._arrivals: list[str] = []
        self.watch = NodeWatch(
            pool,
            node_check_interval_s,
            node_timeout_s,
            clock,
            tuning,
            guard,
            hearing=BusHearing(bus, name),
            grace_seconds=node_reconnect_grace_s,
            on_lost=self.passes.forget,
        )
        self.herald = SupplyHerald(pool, clock, guard, interval_s=supply_herald_interval_s)
        self._guard = guard
        self._name = name
        self._pool = pool
        self._bus = bus
        self._subjects = subjects

    def _ask_for_pass(self) -> None:
        # Called inside the batch's transaction: the kept pass is forgotten before the
        # change commits, so the fast path never decides against a state it no longer is.
        self.passes.forget()
        self._pass_asked = True

    def _arrived(self, job_id: str) -> None:
        self._arrivals.append(job_id)

    async def run(self, stop: asyncio.Event) -> None:
        self.passes.forget()  # (and when the term ends, below) never a pass of an old term

        async def locked(conn: asyncpg.Connection) -> None:
            # One lock and one leader check per batch, in this order: leadership may have
            # changed while the lock was awaited.
            await repo.lock_scheduler(conn)
            await self._guard(conn)

        apply = idempotent_batches(self._pool, self._name, self.handlers.apply, guard=locked)

        async def handle(deliveries: Sequence[Delivery]) -> None:
            self._arrivals = []
            await apply(deliveries)
            arrivals, self._arrivals = self._arrivals, []
            # Only now, after the commit: a pass poked earlier could start before it and miss
            # what these events changed (a submission does not wait for the pass lock). New
            # jobs alone are decided by the fast path where it can; else a pass decides.
            if self._pass_asked:
                self._pass_asked = False
                self.passes.poke()
            elif arrivals and not await self.passes.decide_arrivals(arrivals):
                self.passes.poke()

        tasks = [
            asyncio.create_task(
                self._bus.consume_batches(
                    self._name,
                    self._subjects,
                    handle,
                    stop,
                    batch=EVENT_BATCH,
                ),
                name="events",
            ),
            asyncio.create_task(self.passes.run(stop), name="passes"),
            asyncio.create_task(self.watch.run(stop), name="node-watch"),
            asyncio.create_task(self.herald.run(stop), name="node-supply-herald"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a crash propagates
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # The term is over: until this process leads again another leader may change
            # anything, unheard (no consumer, no NOTIFY listener), so no kept pass outlives it.
            self.passes.forget()
