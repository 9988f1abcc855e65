"""Leader election on a real database: one leads, a follower takes over when the leader's
lock session dies, and the deposed leader's transactions fail their check."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from services.scheduler import repository as repo
from services.scheduler.leader import LEADER_LOCK_KEY, Leadership, NotLeader
from tests.integration.scheduler.conftest import until

pytestmark = pytest.mark.integration


class Candidate:
    """A ``Leadership`` running in the background, recording its terms."""

    def __init__(self, dsn: str, stop: asyncio.Event, retry_s: float = 0.1) -> None:
        self.leadership = Leadership(dsn, retry_s=retry_s, check_s=0.1, session_timeout_s=5)
        self.led = 0
        self.stepped_down = 0
        self.task = asyncio.create_task(self.leadership.run(stop, self.lead))

    async def lead(self, stop_leading: asyncio.Event) -> None:
        self.led += 1
        await stop_leading.wait()
        self.stepped_down += 1


async def lock_holder(pool: asyncpg.Pool) -> int | None:
    pid: int | None = await pool.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND objid::bigint = $1 AND objsubid = 1",
        LEADER_LOCK_KEY,
    )
    return pid


async def test_one_leads_and_a_follower_takes_over(database_url: str, pool: asyncpg.Pool) -> None:
    stop = asyncio.Event()
    # The first backs off longer after losing the lock, so the takeover is the second's.
    first = Candidate(database_url, stop, retry_s=1.0)
    second: Candidate | None = None
    try:
        await until(lambda: first.leadership.is_leader)
        second = Candidate(database_url, stop)
        await until(lambda: second.leadership.attempts >= 3)
        assert (first.leadership.role, second.leadership.role) == ("leader", "follower")
        assert (first.led, second.led) == (1, 0)

        async with pool.acquire() as conn, conn.transaction():
            await repo.lock_scheduler(conn)
            await first.leadership.check(conn)
            with pytest.raises(NotLeader):
                await second.leadership.check(conn)

        # A transaction of the leader is in flight when its lock session dies.
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await repo.lock_scheduler(conn)
            await first.leadership.check(conn)
            holder = await lock_holder(pool)
            assert holder is not None
            await pool.execute("SELECT pg_terminate_backend($1)", holder)
            await until(lambda: second is not None and second.leadership.is_leader)
            with pytest.raises(NotLeader):
                await first.leadership.check(conn)  # the deposed leader cannot commit work
            await tx.rollback()

        assert not first.leadership.is_leader
        assert (first.stepped_down, second.led) == (1, 1)
        # The old leader competes again, as a follower.
        tries = first.leadership.attempts
        await until(lambda: first.leadership.attempts >= tries + 3)
        assert first.leadership.role == "follower"
        assert await lock_holder(pool) != holder
    finally:
        stop.set()
        await asyncio.gather(first.task, *([second.task] if second else []))
    assert not first.leadership.is_leader and not second.leadership.is_leader
