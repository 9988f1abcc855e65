"""The leader's work: consume events, run passes, sweep for lost nodes.

Contract:
- ``PassLoop`` runs a scheduling pass (in its own transaction, under the scheduling lock and
  the leader check) whenever it is poked -- by a handler after a change of supply or demand
  has committed, or by an admin change of queues, quotas or classes (``NOTIFY`` on
  ``CONFIG_CHANNEL``) -- and at least every ``interval_s``. Pokes that arrive while a pass
  runs are coalesced into the next pass, and after each pass the loop rests as long as the
  pass took, so passes use at most about half of the leader's time and a burst of events
  gathers into a few passes, not one each (a 10 ms pass delays the next by 10 ms). Before
  each pass it revokes the GPUs of victims whose preemption grace is over (``leases``). A
  pass that placed jobs leaves the pending notes to an immediate follow-up pass over the
  settled state (``run_pass(settled_notes=True)``), unless notes have waited ``interval_s``
  already. When a job backs off after a failure, the loop also wakes when the first such
  job becomes eligible (``jobs.eligible_at``), so it is placed then, not up to
  ``interval_s`` later.
- ``LeaderWork.run(stop)`` is what a leader does until ``stop``: the event consumer (each
  fetched batch applied in one transaction, under the scheduling lock and the leader check),
  the pass loop and the lost-node watch, which judges nodes only by what this consumer has
  heard (``node_watch.BusHearing``). A database error in a pass is logged and retried; a
  crash of any part stops the process (``ServiceRuntime``'s rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import asyncpg

from services.scheduler import repository as repo
from services.scheduler.admin_repository import CONFIG_CHANNEL
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.leader import NotLeader
from services.scheduler.leases import release_expired_notices
from services.scheduler.node_watch import BusHearing, NodeWatch
from services.scheduler.scheduling import Clock, Tuning, run_pass, utc_now
from shared.bus import Bus, Delivery
from shared.event_metrics import measured
from shared.inbox import Guard, idempotent_batches, no_guard

log = logging.getLogger(__name__)

EVENT_BATCH = 256
"""Events the leader applies per transaction. Large on purpose: each batch is followed by one
pass, and a pass costs about the same for 256 new jobs as for 64 (loading the snapshot
dominates); measured in ``bench/scheduler_e2e.py``: 64 -> 256 took sustained throughput with
completions from about 300 to about 450 decisions/s."""


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
        """Monotonic time when the next job backing off becomes eligible (None: none)."""
        self.passes = 0

    def poke(self) -> None:
        """Ask for a pass soon (after the caller's transaction commits)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        listener = await self._pool.acquire()
        await listener.add_listener(CONFIG_CHANNEL, self._on_notify)
        self.poke()
        try:
            while not stop.is_set():
                await self._sleep(stop)
                if stop.is_set():
                    return
                self._wake.clear()
                started = time.monotonic()
                try:
                    await self.run_once()
                except NotLeader as exc:
                    log.info("pass skipped: %s", exc)
                except (
                    OSError,
                    TimeoutError,
                    asyncpg.PostgresError,
                    asyncpg.InterfaceError,
                ) as exc:
                    log.warning("scheduling pass failed: %s; retrying", exc)
                    await asyncio.sleep(min(1.0, self._interval_s))
                    self.poke()
                finished = time.monotonic()
                self._rest_until = finished + (finished - started)
        finally:
            with contextlib.suppress(OSError, asyncpg.InterfaceError):
                await listener.remove_listener(CONFIG_CHANNEL, self._on_notify)
            await self._pool.release(listener)

    async def run_once(self) -> None:
        """One pass now: forced releases first, then the policy, in one transaction."""
        started = time.monotonic()
        async with self._pool.acquire() as conn, conn.transaction():
            await repo.lock_scheduler(conn)
            await self._guard(conn)
            now, at = self._clock(), time.monotonic()
            await release_expired_notices(conn, now, self._tuning)
            overdue = started - self._notes_at >= self._interval_s
            decisions = await run_pass(conn, now, self._tuning, settled_notes=not overdue)
            eligible_at = await repo.next_eligible_at(conn, now)
        self._due_at = None
        if eligible_at is not None:
            self._due_at = at + (eligible_at - now).total_seconds()
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
        clock: Clock = utc_now,
        guard: Guard = no_guard,
    ) -> None:
        self.passes = PassLoop(pool, tuning, pass_interval_s, clock, guard)
        self.handlers = SchedulerHandlers(
            clock=clock, consumer=name, tuning=tuning, poke=self._ask_for_pass
        )
        self._pass_asked = False
        self.watch = NodeWatch(
            pool,
            node_check_interval_s,
            node_timeout_s,
            clock,
            tuning,
            guard,
            hearing=BusHearing(bus, name),
            grace_seconds=node_reconnect_grace_s,
        )
        self._guard = guard
        self._name = name
        self._pool = pool
        self._bus = bus
        self._subjects = subjects

    def _ask_for_pass(self) -> None:
        self._pass_asked = True

    async def run(self, stop: asyncio.Event) -> None:
        async def locked(conn: asyncpg.Connection) -> None:
            # One lock and one leader check per batch, in this order: leadership may have
            # changed while the lock was awaited.
            await repo.lock_scheduler(conn)
            await self._guard(conn)

        apply = idempotent_batches(self._pool, self._name, self.handlers.apply, guard=locked)

        async def handle(deliveries: Sequence[Delivery]) -> None:
            await apply(deliveries)
            # Only now, after the commit: a pass poked earlier could start before it and miss
            # what these events changed (a submission does not wait for the pass lock).
            if self._pass_asked:
                self._pass_asked = False
                self.passes.poke()

        tasks = [
            asyncio.create_task(
                self._bus.consume_batches(
                    self._name,
                    self._subjects,
                    measured(self._name, handle),
                    stop,
                    batch=EVENT_BATCH,
                ),
                name="events",
            ),
            asyncio.create_task(self.passes.run(stop), name="passes"),
            asyncio.create_task(self.watch.run(stop), name="node-watch"),
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
