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
from trainyard_platform.services.scheduler.admin_repository import CONFIG_CHANNEL
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


async def test_a_listener_the_database_refuses_ends_no_term_and_keeps_no_connection(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database refusing the pass loop's ``LISTEN``: passes still run (on the timer and
    when poked), each round tries to listen again, and no connection is kept from the pool
    (the listener has one of its own, closed again). (Before, a refused ``LISTEN`` ended
    the term.)"""
    async with pool.acquire():
        pass
    idle = pool.get_idle_size()
    tries: list[int] = []

    async def refused(*args: object) -> None:
        tries.append(len(tries))
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(asyncpg.Connection, "add_listener", refused)
    guarded: list[int] = []

    async def guard(conn: asyncpg.Connection) -> None:
        guarded.append(len(guarded))

    loop = PassLoop(pool, Tuning(), interval_s=0.05, guard=guard)
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    try:
        await until(lambda: (len(guarded) >= 2 and len(tries) >= 2) or running.done())
        assert not running.done(), running.exception()
    finally:
        stop.set()
        loop.poke()
        await asyncio.wait_for(running, 10)
    assert pool.get_idle_size() == idle


async def _listener_pid(pool: asyncpg.Pool) -> int | None:
    pid: int | None = await pool.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'trainyard-scheduler-config'"
    )
    return pid


async def test_a_lost_listener_listens_again_and_config_changes_are_heard(
    pool: asyncpg.Pool,
) -> None:
    """The pass loop's ``NOTIFY`` connection is lost (its backend terminated, as a database
    restart or a failover does): it listens again at once, on a new connection, and a
    config change said after that wakes a pass though the timer is an hour away. (Before,
    the listener was a pooled connection that was never listened on again: every later
    change waited for the timer.)"""
    guarded: list[int] = []

    async def guard(conn: asyncpg.Connection) -> None:
        guarded.append(len(guarded))

    loop = PassLoop(pool, Tuning(), interval_s=3600.0, guard=guard)
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    try:
        await until(lambda: guarded)
        first = await _listener_pid(pool)
        assert first is not None
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", first)

        async def listening_again() -> bool:
            pid = await _listener_pid(pool)
            return pid is not None and pid != first

        await until(listening_again)
        await until(lambda: not loop._wake.is_set())  # the catch-up pass has started
        passes = len(guarded)
        await pool.execute("SELECT pg_notify($1, 'queues')", CONFIG_CHANNEL)
        await until(lambda: len(guarded) > passes or running.done())
        assert not running.done(), running.exception()
    finally:
        stop.set()
        loop.poke()
        await asyncio.wait_for(running, 10)
    assert await _listener_pid(pool) is None  # closed with the term
