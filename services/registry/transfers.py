"""How many artifact transfers the registry runs at once, in all and per team.

A registration, a ``download`` and a ``content`` each read a whole artifact (gigabytes of
a model) from the object store into the registry's disk and hash it (``artifacts``).
Unbounded, one team asking for its large model many times at once filled the registry's
disk and every thread of ``asyncio.to_thread``, stalling every other team's requests.

Contract:
- ``Transfers(most, per_team, slots)`` lets at most ``per_team`` transfers of one team
  (the caller's: a grantee's transfers count for the grantee; operators count as one
  team) run at once across every replica of the registry, and ``most`` in all at once on
  this replica (its own disk and threads). A team's places are held in the registry's
  database (``slots``, ``shared.slots``: leased, so a dead replica's free themselves);
  this replica's own count is asked first, so a team past its share here is refused
  without a query. Without ``slots`` (unit tests), a team's share is this process's.
- ``run(team, fn, *args)`` runs ``fn(*args)`` on one of the transfers' own ``most``
  threads (never those of ``asyncio.to_thread``, which the rest of the registry uses) and
  answers its result; its place is taken before and given back once ``fn`` has returned
  or raised, however it ends, a caller that stopped waiting (a client gone) included.
  With no place: ``HTTPException`` 429 naming the team and its limit when the team holds
  its share, else 503 (the registry is busy); both with ``Retry-After``. Nothing waits
  in a queue, so nothing a client abandons holds a place. Call it holding no connection
  of the registry's pool: the team's place is taken and given back through that pool.
- This replica's counts are bookkeeping on one event loop: no locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from litestar.exceptions import HTTPException

from trainyard_platform.shared.slots import Slot, Slots

T = TypeVar("T")
DEFAULT_MAX_TRANSFERS: Final = 4
"""Artifact transfers the registry runs at once (``TRAINYARD_REGISTRY_MAX_TRANSFERS``)."""
DEFAULT_MAX_TRANSFERS_PER_TEAM: Final = 2
"""Of them, one team's (``TRAINYARD_REGISTRY_MAX_TRANSFERS_PER_TEAM``)."""
RETRY_AFTER_S: Final = 5
"""What a refused transfer is told to wait: about what a model of a few GiB takes."""


class Transfers:
    """Places for artifact transfers (see the module)."""

    def __init__(self, most: int, per_team: int, slots: Slots | None = None) -> None:
        if most < 1 or per_team < 1:
            raise ValueError("most and per_team must be at least 1")
        self.most = most
        self.per_team = per_team
        self._slots = slots
        self._held: dict[str | None, int] = {}
        self._threads = ThreadPoolExecutor(max_workers=most, thread_name_prefix="transfer")
        self._running: set[asyncio.Task[Any]] = set()

    def held(self, team: str | None) -> int:
        return self._held.get(team, 0)

    async def run(self, team: str | None, fn: Callable[..., T], *args: object) -> T:
        self._take(team)
        slot = None
        try:
            if self._slots is not None:
                slot = await self._slots.take(_scope(team), self.per_team)
                if slot is None:
                    raise self._team_full(team)
            loop = asyncio.get_running_loop()
            work = loop.create_task(self._transfer(team, slot, fn, *args))
        except BaseException:
            self._give_back(team)
            if slot is not None and self._slots is not None:
                self._slots.give_back_soon(slot)
            raise
        self._running.add(work)
        work.add_done_callback(self._settled)
        # The place is given back when the thread's work ends, not when the caller stops
        # waiting: a cancelled request (a client gone) leaves its thread reading on.
        return await asyncio.shield(work)

    async def _transfer(
        self, team: str | None, slot: Slot | None, fn: Callable[..., T], *args: object
    ) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)
        finally:
            self._give_back(team)
            if slot is not None and self._slots is not None:
                await self._slots.give_back(slot)

    def _settled(self, done: asyncio.Task[Any]) -> None:
        self._running.discard(done)
        if not done.cancelled():
            done.exception()  # read: nobody may await a transfer whose caller went away

    def _team_full(self, team: str | None) -> HTTPException:
        who = "operators" if team is None else f"team {team!r}"
        return HTTPException(
            status_code=429,
            detail=f"too many model transfers at once: {who} has {self.per_team} under "
            f"way, the most a team may (TRAINYARD_REGISTRY_MAX_TRANSFERS_PER_TEAM); "
            f"retry after {RETRY_AFTER_S} s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _take(self, team: str | None) -> None:
        if self.held(team) >= self.per_team:
            raise self._team_full(team)
        if sum(self._held.values()) >= self.most:
            raise HTTPException(
                status_code=503,
                detail=f"the registry has {self.most} model transfers under way, the most it "
                f"runs at once (TRAINYARD_REGISTRY_MAX_TRANSFERS); retry after {RETRY_AFTER_S} s",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self._held[team] = self.held(team) + 1

    def _give_back(self, team: str | None) -> None:
        left = self.held(team) - 1
        if left > 0:
            self._held[team] = left
        else:
            self._held.pop(team, None)

    def close(self) -> None:
        """Let the threads end once what runs on them has (an app's shutdown)."""
        self._threads.shutdown(wait=False, cancel_futures=True)


def _scope(team: str | None) -> str:
    return "operators" if team is None else f"team:{team}"


__all__: Sequence[str] = [
    "DEFAULT_MAX_TRANSFERS",
    "DEFAULT_MAX_TRANSFERS_PER_TEAM",
    "RETRY_AFTER_S",
    "Transfers",
]
