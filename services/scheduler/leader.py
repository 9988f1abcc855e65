"""Leader election: of several scheduler processes, exactly one leads.

Contract:
- Leadership is a session-level PostgreSQL advisory lock (``pg_try_advisory_lock``) taken on
  a dedicated connection that is held for the whole leadership. Advisory locks belong to
  one database, so every scheduler of one installation competes for the same lock.
- A follower tries every ``retry_s``. When the leader dies its connection drops, Postgres
  frees the lock, and a follower takes it on its next try. A leader that lost its lock
  waits ``2 * retry_s`` before it competes again, so a standing follower takes over. A hung or partitioned leader's
  session is ended by Postgres after ``session_timeout_s`` without a query
  (``idle_session_timeout``), so a follower takes over then.
- While leading, ``run`` runs ``lead(stop_leading)``: the leader's work (consuming events,
  passes, periodic sweeps), which must return soon after ``stop_leading`` is set.
- The leader checks its lock connection every ``check_s``. When the check fails (or the
  connection reports its end, or the watchdog itself ends for any reason) it stops leading
  at once: ``is_leader`` turns false before anything else, so ``check`` fails every
  transaction still in flight (their events are handed back for the next leader), and
  ``stop_leading`` is set. ``check`` finding the lock gone is a loss too: the process that
  finds it stops leading and competes again, whatever its watchdog says (seen: the lock
  session ended by ``idle_session_timeout`` under heavy load, no loss noticed, and every
  transaction refused for half an hour while ``/readyz`` said leader).
- ``check(conn)``, called inside every transaction that changes the scheduler's state after
  it took the scheduling lock, raises ``NotLeader`` unless this process holds the leader lock
  at that moment (read from ``pg_locks`` by the lock connection's backend pid). Under the
  scheduling lock the old and the new leader's transactions are serialised, so a deposed
  leader's transaction either committed before the new leader's first one or fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Literal

import asyncpg

from trainyard_platform.shared import outages
from trainyard_platform.shared.bus import NotNow
from trainyard_platform.shared.db import DATABASE_FAULTS, connect
from trainyard_platform.shared.logs import error_text

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x7459_5344
"""The advisory lock's key (a positive 32-bit number: ``pg_locks`` shows classid 0, objid
the key, objsubid 1)."""

Role = Literal["leader", "follower"]
Lead = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


class NotLeader(NotNow):
    """This process does not hold the leader lock: its transaction must not commit. Raised in
    an event batch's transaction, the bus hands the batch back for the new leader
    (``bus.NotNow``): it says nothing of the events, so it is never counted against them."""


class Leadership:
    """One process's part in the election (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        *,
        retry_s: float = 1.0,
        check_s: float = 1.0,
        session_timeout_s: float = 10.0,
    ) -> None:
        self._dsn = dsn
        self._retry_s = retry_s
        self._check_s = check_s
        self._session_timeout_s = session_timeout_s
        self._pid: int | None = None
        self._lost: asyncio.Event | None = None
        """Set to end the current term (``_lead``)."""
        self.since: datetime | None = None
        self.terms = 0
        """How many times this process became the leader."""
        self.attempts = 0
        """How many times it tried to take the lock."""

    @property
    def is_leader(self) -> bool:
        return self._pid is not None

    @property
    def role(self) -> Role:
        return "leader" if self.is_leader else "follower"

    async def check(self, conn: asyncpg.Connection) -> None:
        """Raise ``NotLeader`` unless this process holds the leader lock now."""
        pid, term = self._pid, self._lost
        if pid is None:
            raise NotLeader("this scheduler is not the leader")
        held = await conn.fetchval(
            """SELECT EXISTS (
                   SELECT 1 FROM pg_locks
                   WHERE locktype = 'advisory' AND granted AND pid = $2
                     AND database = (SELECT oid FROM pg_database
                                     WHERE datname = current_database())
                     AND classid::bigint = 0 AND objid::bigint = $1 AND objsubid = 1)""",
            LEADER_LOCK_KEY,
            pid,
        )
        if not held:
            # Only the term checked: if it ended while the query ran and a new one began,
            # this refusal says nothing of the new term's lock.
            if self._lost is term:
                self._deposed(f"the leader lock is no longer held by backend {pid}")
            raise NotLeader(f"the leader lock is no longer held by backend {pid}")

    def _deposed(self, why: str) -> None:
        """Stop leading at once (``is_leader`` false first, ``since`` gone with it), and end
        the term."""
        if self._pid is not None:
            self._pid = None
            self.since = None
            log.error("%s: no longer leading", why)
        if self._lost is not None:
            self._lost.set()

    async def run(self, stop: asyncio.Event, lead: Lead) -> None:
        """Compete for leadership until ``stop`` is set; lead whenever this process wins."""
        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            led = False
            try:
                conn = await connect(
                    self._dsn, timeout=10, server_settings=self._session_settings()
                )
                led = await self._compete(conn, stop, lead)
            except DATABASE_FAULTS as exc:
                # Tried every retry_s: an outage is one line (``outages``), not one a try.
                if not outages.report(exc):
                    log.warning("leader election: %s; retrying", error_text(exc))
            finally:
                self._pid = None
                if conn is not None:
                    await _close(conn)  # the lock goes with the connection
            # A deposed leader lets the followers go first (they try every retry_s).
            await _sleep(stop, (2 if led else 1) * self._retry_s)

    async def _compete(self, conn: asyncpg.Connection, stop: asyncio.Event, lead: Lead) -> bool:
        """Try for the lock until won (then lead; True when the term is over) or stopped."""
        while not stop.is_set():
            self.attempts += 1
            if await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY):
                await self._lead(conn, stop, lead)
                return True
            await _sleep(stop, self._retry_s)
        return False

    def _session_settings(self) -> dict[str, str]:
        settings = {"application_name": "trainyard-scheduler-leader"}
        if self._session_timeout_s > 0:
            settings["idle_session_timeout"] = str(int(self._session_timeout_s * 1000))
        return settings

    async def _lead(self, conn: asyncpg.Connection, stop: asyncio.Event, lead: Lead) -> None:
        lost = self._lost = asyncio.Event()
        stop_leading = asyncio.Event()
        conn.add_termination_listener(lambda _: lost.set())
        self._pid = conn.get_server_pid()
        self.since = datetime.now(UTC)
        self.terms += 1
        log.info("leading (lock held by backend %d)", self._pid)
        watchdog = asyncio.create_task(self._watch(conn, lost), name="leader-watchdog")
        work = asyncio.create_task(lead(stop_leading), name="leader-work")
        waiters = [asyncio.ensure_future(e.wait()) for e in (stop, lost)]
        try:
            await asyncio.wait([work, watchdog, *waiters], return_when=asyncio.FIRST_COMPLETED)
            if watchdog.done() and not lost.is_set():
                # The watchdog never ends on its own while the lock is held: without it no
                # loss would be noticed, so its end is one.
                failure = None if watchdog.cancelled() else watchdog.exception()
                log.error("the leader lock's watchdog ended: %r", failure, exc_info=failure)
                lost.set()
            if lost.is_set():
                # Stop at once: every transaction still in flight now fails its check.
                self._deposed("lost the leader lock connection")
            stop_leading.set()
            await work  # a crash of the leader's work propagates (the process exits)
        finally:
            stop_leading.set()
            for task in (*waiters, watchdog):
                task.cancel()
            if not work.done():
                work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(watchdog, *waiters, return_exceptions=True)
            self._pid = None
            self._lost = None
            self.since = None
            log.info("no longer leading")

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        while not lost.is_set():
            try:
                await conn.fetchval("SELECT 1", timeout=max(self._check_s, 1.0))
            except DATABASE_FAULTS as exc:
                log.error("leader lock connection failed: %s", error_text(exc))
                lost.set()
                return
            await _sleep(lost, self._check_s)


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def _close(conn: asyncpg.Connection) -> None:
    """Close the lock connection (which frees the lock); never hang on a dead one."""
    try:
        await asyncio.wait_for(conn.close(), timeout=2)
    except DATABASE_FAULTS:
        conn.terminate()
