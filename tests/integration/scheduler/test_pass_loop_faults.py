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
