"""The pass loop outlives a failed pass, on a real PostgreSQL: whatever the database raises
(``shared.db.DATABASE_FAULTS``) ends that pass only, and the next one follows. Seen in the
chaos suite: PostgreSQL killed during a pass left a pooled connection mid-operation, asyncpg
raised ``InternalClientError`` at the next ``BEGIN``, and the scheduler exited with status
1; the watchdog that restarts it is not there in production."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.integration.scheduler.conftest import until
from trainyard_platform.services.scheduler.loops import PassLoop
from trainyard_platform.services.scheduler.scheduling import Tuning

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "fault",
    [
        asyncpg.InternalClientError(
            "cannot switch to state 15; another operation (2) is in progress"
        ),
        asyncpg.InterfaceError("cannot call Transaction.__aexit__(): connection is closed"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        ConnectionRefusedError(111, "Connect call failed"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_pass_the_database_fails_is_followed_by_the_next(
    pool: asyncpg.Pool, fault: Exception
) -> None:
    guarded: list[int] = []

    async def guard(conn: asyncpg.Connection) -> None:
        guarded.append(len(guarded))
        if len(guarded) == 1:
            raise fault

    loop = PassLoop(pool, Tuning(), interval_s=60.0, guard=guard)
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    try:
        await until(lambda: len(guarded) >= 2 or running.done())
        assert not running.done(), running.exception()
    finally:
        stop.set()
        loop.poke()
        await asyncio.wait_for(running, 10)


async def test_a_term_whose_listener_fails_gives_its_connection_back(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database failing right after the pass loop took its NOTIFY connection: the term
    ends, and the connection goes back to the pool (kept, every such term would take one
    for good, until readiness and every handler waited on an empty pool)."""
    async with pool.acquire():
        pass
    idle = pool.get_idle_size()

    async def refused(*args: object) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(asyncpg.Connection, "add_listener", refused)
    loop = PassLoop(pool, Tuning(), interval_s=60.0)
    with pytest.raises(ConnectionResetError):
        await loop.run(asyncio.Event())
    assert pool.get_idle_size() == idle
