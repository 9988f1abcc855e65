"""Lost nodes: a node the scheduler could hear for ``node_timeout_seconds``, and did not, is
LOST.

Only time the scheduler was itself hearing counts against a node. A heartbeat is *heard* once
the scheduler's consumer has handled it, and the scheduler *hears* while its NATS connection
is up, its consumer fetches without a fault and has caught up with the stream, and JetStream
answers a probe (``BusHearing``; ``shared.bus.Bus.hearing``). That gives, at each tick, a
``Hearing``: ``since`` (when the scheduler last began hearing: the start of this watch, i.e.
of the leadership term, a NATS reconnect, the consumer's first good fetch after a faulty one,
the first answered probe after an unanswered one) and ``through`` (every heartbeat published
before it has been handled). The rule (``judgment_cutoff``): a READY node whose last heartbeat
is older than ``through - node_timeout`` is lost, and nobody is judged at all until
``through - since >= node_timeout + grace``. So:
- the scheduler's own outage (NATS cut off, a half-open connection, JetStream not answering,
  the scheduler down or not leading) never counts: after it, every node's clock restarts at
  ``since`` and the runners get the timeout plus ``node_reconnect_grace_seconds`` to be heard
  again (they may have been cut off by the same outage and must reconnect first);
- a backlog does not count either: heartbeats still queued in the stream, unread because the
  consumer lags or waits out a database outage, hold ``through`` back, so the node is judged
  only by what the scheduler has had the chance to read.

Contract of ``sweep_silent_nodes`` (one transaction, under the scheduling lock): every READY
node whose last heartbeat is older than the cutoff becomes LOST; every job with a live
allocation on it loses its whole gang (each allocation released with outcome ``lost``, billed
up to the node's last heartbeat; the gang's other nodes are told to stop); each job is
requeued for its next attempt at once (no back-off: the node is gone), or FAILED ("node_lost:
node lost; max restarts (N) reached after M attempts") once ``spec.max_restarts`` restarts are
used (failures and lost nodes share the count); the GPUs held on a lost node for ended
allocations whose runner was still stopping them are freed (``leases``: the node is placed
on no more; a retired node must hold nothing); then a pass places what it can. A success the
runner of a lost allocation reports later is still accepted (``late_success``).

``NodeWatch.run`` sweeps every ``node_check_interval_seconds`` until stopped. A failed sweep is
logged and retried on the next tick: a database outage must not stop the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import asyncpg

from trainyard_platform.services.scheduler import allocation_repository as allocation_repo
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.leader import NotLeader
from trainyard_platform.services.scheduler.leases import end_gang
from trainyard_platform.services.scheduler.scheduling import Clock, Tuning, run_pass, utc_now
from trainyard_platform.shared.bus import Bus, Hearing
from trainyard_platform.shared.db import DATABASE_FAULTS, failed_rounds_from_zero, log_failed_round
from trainyard_platform.shared.inbox import Guard, no_guard

log = logging.getLogger(__name__)

_SKIPPED: tuple[type[BaseException], ...] = (NotLeader, *DATABASE_FAULTS)
"""Why a round is skipped and tried again: leadership lost, or the database failed."""

Hear = Callable[[], Awaitable[Hearing | None]]
"""What the scheduler has been able to hear now (None: it is not hearing)."""

PROBE_TIMEOUT_S = 2.0
"""How long the watch waits for JetStream to answer its probe."""


def judgment_cutoff(
    hearing: Hearing, node_timeout: timedelta, grace: timedelta = timedelta(0)
) -> datetime | None:
    """The time before which a node's last heartbeat means it is lost, or None while nobody
    may be judged: a node is lost when the scheduler heard everything up to
    ``hearing.through`` and nothing from it for ``node_timeout``, and the scheduler has been
    hearing for at least ``node_timeout + grace`` (a node silent since before ``since`` is
    judged as if heard at ``since``)."""
    cutoff = hearing.through - node_timeout
    if hearing.since + grace > cutoff:
        return None
    return cutoff


async def sweep_silent_nodes(
    conn: asyncpg.Connection,
    cutoff: datetime,
    now: datetime,
    tuning: Tuning | None = None,
    guard: Guard = no_guard,
) -> list[str]:
    """Declare the READY nodes last heard before ``cutoff`` lost and requeue their jobs;
    returns the ids of the lost nodes."""
    tuning = tuning or Tuning()
    await repo.lock_scheduler(conn)
    await guard(conn)
    lost = await repo.mark_lost_nodes(conn, cutoff, now)
    for node in lost:
        allocations = await allocation_repo.live_allocations_on(conn, node["node_id"])
        log.warning(
            "node %s lost (last heartbeat %s, heard through %s); releasing %d allocation(s)",
            node["node_id"],
            node["last_heartbeat"].isoformat(),
            cutoff.isoformat(),
            len(allocations),
        )
        for allocation in allocations:
            job = await repo.job_for_update(conn, allocation.job_id)
            gang = await allocation_repo.live_allocations(conn, allocation.job_id)
            if job is None or not gang:  # its gang already ended with another lost node
                continue
            await end_gang(
                conn,
                job,
                gang,
                "lost",
                node["last_heartbeat"],
                now,
                tuning,
                reporter=allocation.allocation_id,
            )
    if lost:
        # What was held on them while a runner stopped an ended allocation is gone with them.
        await allocation_repo.free_stopping_on(conn, [n["node_id"] for n in lost], now)
        await run_pass(conn, now, tuning)
    return [n["node_id"] for n in lost]


async def sweep_lost_nodes(
    conn: asyncpg.Connection,
    now: datetime,
    node_timeout: timedelta,
    tuning: Tuning | None = None,
    guard: Guard = no_guard,
) -> list[str]:
    """``sweep_silent_nodes`` for a scheduler that heard everything up to ``now``."""
    return await sweep_silent_nodes(conn, now - node_timeout, now, tuning, guard)


class BusHearing:
    """What the leader's consumer ``consumer`` has heard on ``bus`` (``Bus.hearing``), only
    while JetStream answers a probe of that consumer (``consumer_info``): a connection can
    look up while nothing comes through it (half-open, JetStream unavailable), and then empty
    fetches would pass for a drained stream. An unanswered probe ends the hearing; it
    begins again at the next answered one."""

    def __init__(self, bus: Bus, consumer: str, probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self._bus = bus
        self._consumer = consumer
        self._timeout = probe_timeout_s
        self._answered_since: datetime | None = None

    async def __call__(self) -> Hearing | None:
        asked = utc_now()
        try:
            await self._bus.jetstream.consumer_info(
                self._bus.settings.stream, self._consumer, timeout=self._timeout
            )
        except Exception as exc:  # whatever it is, JetStream did not answer: not hearing
            if self._answered_since is not None:
                what = f"{type(exc).__name__}: {exc}".rstrip(": ")
                log.warning("JetStream does not answer (%s); no node is judged meanwhile", what)
            self._answered_since = None
            return None
        if self._answered_since is None:
            self._answered_since = asked
        heard = self._bus.hearing(self._consumer)
        if heard is None:
            return None
        since = max(heard.since, self._answered_since)
        return Hearing(since, heard.through) if heard.through >= since else None


class NodeWatch:
    """The periodic lost-node sweep of one scheduler process (see the module docstring).

    ``hearing``: what the scheduler hears (``BusHearing``); without one, it is taken to hear
    everything, at once, since the watch started (a test's in-process scheduler).
    ``last_cutoff``: the cutoff of the latest sweep that judged nodes (None: none yet)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        interval_seconds: float,
        timeout_seconds: float,
        clock: Clock = utc_now,
        tuning: Tuning | None = None,
        guard: Guard = no_guard,
        *,
        hearing: Hear | None = None,
        grace_seconds: float = 0.0,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self._pool = pool
        self._interval = interval_seconds
        self._timeout = timedelta(seconds=timeout_seconds)
        self._grace = timedelta(seconds=grace_seconds)
        self._clock = clock
        self._tuning = tuning or Tuning()
        self._guard = guard
        self._hearing = hearing
        self._started = clock()
        self._judging = False
        self._on_lost = on_lost
        self.last_cutoff: datetime | None = None

    async def cutoff(self) -> datetime | None:
        """What the next sweep judges by (see ``judgment_cutoff``), None: nobody now."""
        if self._hearing is None:
            heard: Hearing | None = Hearing(self._started, self._clock())
        else:
            heard = await self._hearing()
        if heard is None:
            return None
        since = max(heard.since, self._started)
        if heard.through < since:
            return None
        return judgment_cutoff(Hearing(since, heard.through), self._timeout, self._grace)

    async def sweep(self) -> list[str]:
        cutoff = await self.cutoff()
        if cutoff is None:
            if self._judging:
                log.warning(
                    "not judging nodes: the scheduler is not hearing the bus, or has not "
                    "heard for the node timeout plus the reconnect grace since it last began"
                )
            self._judging = False
            return []
        if not self._judging:
            log.info("judging nodes: heard everything up to %s", cutoff.isoformat())
            self._judging = True
        async with self._pool.acquire() as conn, conn.transaction():
            lost = await sweep_silent_nodes(conn, cutoff, self._clock(), self._tuning, self._guard)
            if lost:
                self._on_lost()  # before the commit: the fast path must not use the old nodes
        self.last_cutoff = cutoff
        return lost

    async def run(self, stop: asyncio.Event) -> None:
        self._started = self._clock()  # this term's hearing begins now
        failed_rounds_from_zero("lost-node-sweep")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval)
            if stop.is_set():
                return
            try:
                await self.sweep()
            except _SKIPPED as exc:
                log_failed_round(
                    log, "lost-node-sweep", "lost-node sweep failed: %s; retrying next tick", exc
                )
