"""Places for work in flight that every replica of a service counts together.

A limit on work in flight kept in one process's memory (a team's transfers, uploads,
comparisons at once) is multiplied by the replicas: with N of them behind the load
balancer a team had N times its share. ``Slots`` keeps the places in the service's own
database (table ``held_slots``, platform migration 0006), so the share is one for all.

Contract:
- ``Slots(pool, kind, lease_s=LEASE_S)``: the places of one kind of work (``kind``, e.g.
  ``"registry.transfers"``). Every instance over the same database (each replica's) shares
  them; a place is a row (kind, scope, slot number 0 to ``most`` - 1).
- ``await take(scope, most)``: one of the ``most`` places of ``scope`` (a team), or
  ``None`` when all ``most`` are held, by any replica. It asks this instance's own count
  first (no database round trip when this replica alone holds them all), then takes a
  free number by inserting its row (``INSERT ... ON CONFLICT DO NOTHING``-like) or a row
  whose lease ran out (a conditional update); two takers of one number: one wins, the
  other tries the next. So at most ``most`` of a scope are held at once, whatever the
  replicas. Cancelled, ``take`` gives back a place it took anyway.
- While held, a place's lease (``lease_s``, by the database's clock) is renewed every
  third of it, one ``UPDATE`` for all of this instance's places, by a task of its own run
  outside every request's context (in no request's trace), on a connection of its own
  (``db.connection_beside``: named ``trainyard-slots-<kind>``, opened at its first renewal
  and closed when this instance holds no place any more), not one of ``pool``'s: a pool
  whose every connection is in use for longer than a lease (slow requests, a pool of a
  few) would make each renewal give up waiting for one, and a holder lose its place while
  its work runs. A pool not opened by ``db.open_pool``, or PostgreSQL refusing another
  connection, renews on ``pool``. A replica that dies, or cannot reach its database for
  longer than the lease, renews nothing: its places free themselves when their leases end
  (and, in the second case, its work may then run beside a newcomer's past the share until
  it ends).
- Rows of holders gone (a dead replica's, one whose delete failed, numbers past a share
  since lowered) would otherwise stay until a take of the same number: up to kinds x
  scopes (teams) x ``most`` rows, read by every take of their scope. Each renewal round
  also deletes at most ``SWEPT_PER_ROUND`` rows of its kind whose lease ended more than a
  lease ago (a row taken over meanwhile is live again and kept). Nobody's place is taken
  by it: a row past its lease was free to take already.
- ``give_back_soon(slot)`` (from synchronous code) and ``await give_back(slot)`` delete
  the row; neither raises: a row that cannot be deleted (PostgreSQL away) is logged and
  frees itself when its lease ends. ``held(scope, most, refused)`` holds a place while its
  block runs, raising ``refused()`` when there is none.
- A pool connection is taken only for each statement, never for the work itself. Call
  ``take``, ``held`` and ``give_back`` holding no connection of ``pool``: as many callers
  at once as it has connections, each holding one while waiting for another, would all
  wait for one none gives back. A block under ``held`` may take one (a place is taken
  before the connection and given back after it).
- ``close()`` (a shutdown) stops renewing (closing the renewals' connection) and gives back
  what is still held.
- A database fault (``db.DATABASE_FAULTS``) of ``take`` is raised to its caller: an HTTP
  request then answers 503, as for any query.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

import asyncpg

from trainyard_platform.shared.db import (
    DATABASE_FAULTS,
    connection_beside,
    failed_rounds_from_zero,
    log_failed_round,
)
from trainyard_platform.shared.logs import error_text

log = logging.getLogger(__name__)
T = TypeVar("T")

LEASE_S: Final = 30.0
"""How long a place outlives its holder's last renewal: a dead replica's places are free
again at most this long after it died."""
RENEWAL_LOOP: Final = "slot_renewal"
_CLOSE_TIMEOUT_S: Final = 5.0

_TAKE = """
WITH free AS (
    SELECT n FROM generate_series(0, $3::integer - 1) AS n
    WHERE NOT EXISTS (
        SELECT 1 FROM held_slots AS h
        WHERE h.kind = $1 AND h.scope = $2 AND h.slot = n AND h.expires_at > now()
    )
    ORDER BY n
    LIMIT 1
), taken AS (
    INSERT INTO held_slots AS h (kind, scope, slot, holder, expires_at)
    SELECT $1, $2, n, $4, now() + make_interval(secs => $5) FROM free
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
        WHERE h.expires_at <= now()
    RETURNING h.slot
)
SELECT (SELECT slot FROM taken) AS slot, EXISTS (SELECT 1 FROM free) AS any_free
"""
# A number seen free may be taken by another replica before this insert gets it: the
# insert then waits for that one's commit and, its row live, takes nothing (any_free but no
# slot), and the next try sees it held. Each lost race is a place someone else took, so
# ``most`` + 1 tries always end in a place or in none free.

_RENEW = """
UPDATE held_slots SET expires_at = now() + make_interval(secs => $3)
WHERE kind = $1 AND holder = ANY($2::text[])
"""

_GIVE_BACK = "DELETE FROM held_slots WHERE kind = $1 AND scope = $2 AND slot = $3 AND holder = $4"

_SWEEP = """
DELETE FROM held_slots AS h
WHERE h.kind = $1 AND h.expires_at < now() - make_interval(secs => $2)
  AND (h.scope, h.slot) IN (
    SELECT scope, slot FROM held_slots
    WHERE kind = $1 AND expires_at < now() - make_interval(secs => $2)
    LIMIT $3
  )
"""
# The outer condition is checked again on a row another replica took over meanwhile (its
# lease renewed), so a row taken over is never swept.
SWEPT_PER_ROUND: Final = 100
"""Most rows of dead holders one renewal round deletes: a bounded statement each round."""


@dataclass(frozen=True)
class Slot:
    """One place held: ``number`` of ``scope``, by ``holder`` (unique to this take)."""

    scope: str
    number: int
    holder: str


class Slots:
    """The places of one kind of work in one service's database (see the module)."""

    def __init__(self, pool: asyncpg.Pool, kind: str, *, lease_s: float = LEASE_S) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self.kind = kind
        self.lease_s = lease_s
        self._pool = pool
        self._holder = f"{socket.gethostname()}:{os.getpid()}"
        self._held: dict[str, Slot] = {}
        self._counts: Counter[str] = Counter()
        self._renewer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def take(self, scope: str, most: int) -> Slot | None:
        if most < 1:
            raise ValueError("most must be at least 1")
        if self._counts[scope] >= most:
            return None
        # Counted at once, so this replica's own requests racing for the scope do not all
        # go to the database; given back below unless a place was taken.
        self._counts[scope] += 1
        claim = self._spawn(self._claim(scope, most))
        try:
            slot = await asyncio.shield(claim)
        except asyncio.CancelledError:
            claim.add_done_callback(partial(self._abandoned, scope))
            raise
        except BaseException:
            self._uncount(scope)
            raise
        if slot is None:
            self._uncount(scope)
        return slot

    def _abandoned(self, scope: str, claim: asyncio.Task[Slot | None]) -> None:
        slot = None if claim.cancelled() or claim.exception() is not None else claim.result()
        if slot is None:
            self._uncount(scope)
        else:
            self.give_back_soon(slot)

    async def _claim(self, scope: str, most: int) -> Slot | None:
        holder = f"{self._holder}:{uuid.uuid4().hex}"
        for _ in range(most + 1):
            row = await self._pool.fetchrow(_TAKE, self.kind, scope, most, holder, self.lease_s)
            if row["slot"] is not None:
                slot = Slot(scope, row["slot"], holder)
                self._held[holder] = slot
                self._renew_while_held()
                return slot
            if not row["any_free"]:
                return None
        return None

    def give_back_soon(self, slot: Slot) -> asyncio.Task[None] | None:
        """Stop renewing ``slot`` at once and delete its row in the background."""
        if self._held.pop(slot.holder, None) is None:
            return None
        self._uncount(slot.scope)
        return self._spawn(self._delete(slot))

    async def give_back(self, slot: Slot) -> None:
        deleting = self.give_back_soon(slot)
        if deleting is not None:
            # Shielded: a request cancelled again while it gives back still deletes.
            await asyncio.shield(deleting)

    @asynccontextmanager
    async def held(
        self, scope: str, most: int, refused: Callable[[], BaseException]
    ) -> AsyncIterator[Slot]:
        slot = await self.take(scope, most)
        if slot is None:
            raise refused()
        try:
            yield slot
        finally:
            await self.give_back(slot)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.wait([self._renewer])  # it closes its connection
        for slot in list(self._held.values()):
            await self.give_back(slot)

    async def _delete(self, slot: Slot) -> None:
        try:
            await self._pool.execute(_GIVE_BACK, self.kind, slot.scope, slot.number, slot.holder)
        except DATABASE_FAULTS as exc:
            log.warning(
                "could not give back place %d of %s %s (it frees itself within %.0f s): %s",
                slot.number,
                self.kind,
                slot.scope,
                self.lease_s,
                error_text(exc),
            )

    def _renew_while_held(self) -> None:
        if self._renewer is None or self._renewer.done():
            # Outside every request's context: started by the take of whichever request came
            # first, it outlives it, and its renewals and sweeps are in no request's trace
            # (nor its log lines tagged with that request's ids).
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew(), context=contextvars.Context()
            )

    async def _renew(self) -> None:
        failed_rounds_from_zero(RENEWAL_LOOP)
        own: asyncpg.Connection | None = None
        try:
            while self._held:
                await asyncio.sleep(self.lease_s / 3)
                holders = list(self._held)
                if not holders:
                    return
                if own is None or own.is_closed():
                    own = await self._connection_of_its_own()
                on = own if own is not None else self._pool
                try:
                    await on.execute(_RENEW, self.kind, holders, self.lease_s)
                except DATABASE_FAULTS as exc:
                    log_failed_round(
                        log, RENEWAL_LOOP, f"could not renew the leases of {self.kind}: %s", exc
                    )
                    _drop(own)
                    own = None
                    continue
                try:
                    await on.execute(_SWEEP, self.kind, self.lease_s, SWEPT_PER_ROUND)
                except DATABASE_FAULTS as exc:
                    log_failed_round(
                        log,
                        RENEWAL_LOOP,
                        f"could not delete the dead places of {self.kind}: %s",
                        exc,
                    )
                    _drop(own)
                    own = None
        finally:
            if own is not None:
                await _close(own)

    async def _connection_of_its_own(self) -> asyncpg.Connection | None:
        """A connection for the renewals alone, or None to renew on the pool (one not
        opened by ``db.open_pool``, or PostgreSQL refusing another connection now: told to
        ``outages.POSTGRES`` by ``db.connect``)."""
        try:
            return await connection_beside(self._pool, purpose=f"slots-{self.kind}")
        except DATABASE_FAULTS:
            return None

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _uncount(self, scope: str) -> None:
        self._counts[scope] -= 1
        if self._counts[scope] <= 0:
            del self._counts[scope]


def _drop(conn: asyncpg.Connection | None) -> None:
    """Close ``conn`` at once: after a fault it may be mid-operation (the next round opens
    another)."""
    if conn is not None:
        conn.terminate()


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=_CLOSE_TIMEOUT_S)
    except DATABASE_FAULTS:  # a timeout among them
        conn.terminate()
    except BaseException:  # cancelled again while closing
        conn.terminate()
        raise


__all__: Sequence[str] = ["LEASE_S", "SWEPT_PER_ROUND", "Slot", "Slots"]
