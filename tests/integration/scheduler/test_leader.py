"""Leader election on a real database: one leads, a follower takes over when the leader's
lock session dies, and the deposed leader's transactions fail their check.

The check has two parts: the process's own belief (``is_leader``, cleared as soon as it
notices the loss) and, for the window before it notices (a partitioned leader, a watchdog
not yet run), the database-side check: the leader lock must be granted, in this database,
to the lock session's backend, in ``pg_locks``. The tests below reach that second part
with a leadership that still believes it leads (``believes``), and check every condition
of the ``pg_locks`` query against a lock that differs from the leader lock in one way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import asyncpg
import pytest

from tests.integration.scheduler.conftest import until
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.leader import LEADER_LOCK_KEY, Leadership, NotLeader
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.inbox import idempotent_batches

pytestmark = pytest.mark.integration


class Candidate:
    """A ``Leadership`` running in the background, recording its terms."""

    def __init__(
        self,
        dsn: str,
        stop: asyncio.Event,
        retry_s: float = 0.1,
        kind: type[Leadership] = Leadership,
    ) -> None:
        self.leadership = kind(dsn, retry_s=retry_s, check_s=0.1, session_timeout_s=5)
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


def believes(leadership: Leadership, pid: int) -> Leadership:
    """``leadership`` as it is between losing its lock and noticing it: it still believes
    that backend ``pid`` holds the leader lock for it (white box: the belief is ``_pid``)."""
    leadership._pid = pid
    assert leadership.is_leader
    return leadership


async def _refused_by_pg_locks(leadership: Leadership, conn: asyncpg.Connection) -> None:
    """The check fails, and it is the database-side check that fails it."""
    pid = leadership._pid
    assert pid is not None, "the process still believes it leads"
    with pytest.raises(NotLeader, match=f"no longer held by backend {pid}"):
        await leadership.check(conn)
    assert not leadership.is_leader  # a refused check ends the belief at once
    believes(leadership, pid)  # (so that the caller's next check asks the database again)


@contextlib.asynccontextmanager
async def _session(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def _effects(pool: asyncpg.Pool) -> list[str]:
    return [r["what"] for r in await pool.fetch("SELECT what FROM t_effects ORDER BY what")]


async def test_a_deposed_leader_that_has_not_noticed_cannot_commit(
    database_url: str, pool: asyncpg.Pool
) -> None:
    """A leader's lock session ends and a follower takes over; the old leader has not
    noticed yet. Its next batch takes the scheduling lock, is refused by the ``pg_locks``
    check and commits nothing; the new leader's batch commits."""
    await pool.execute("CREATE TABLE t_effects (what text)")
    stop = asyncio.Event()
    first = Candidate(database_url, stop, retry_s=1.0)
    second: Candidate | None = None
    try:
        await until(lambda: first.leadership.is_leader)
        old_pid = await lock_holder(pool)
        assert old_pid is not None
        second = Candidate(database_url, stop)
        await pool.execute("SELECT pg_terminate_backend($1)", old_pid)
        await until(lambda: second is not None and second.leadership.is_leader)
        # Let the first finish stepping down (it competes again), then make it believe again.
        tries = first.leadership.attempts
        await until(lambda: first.leadership.attempts > tries)
        deposed = believes(first.leadership, old_pid)

        def batch_of(leadership: Leadership):  # type: ignore[no-untyped-def]
            async def locked(conn: asyncpg.Connection) -> None:
                await repo.lock_scheduler(conn)  # as the scheduler's batches and passes do
                await leadership.check(conn)

            async def apply(deliveries: Sequence[Delivery], conn: asyncpg.Connection) -> None:
                for d in deliveries:
                    await conn.execute("INSERT INTO t_effects VALUES ($1)", d.envelope.subject)

            return idempotent_batches(pool, "scheduler", apply, guard=locked)

        def delivery(job_id: str) -> Delivery:
            payload = JobCancelRequested(job_id=job_id, team="t", user="u")
            return Delivery(Envelope.wrap(payload, source=SUBMISSION, subject=job_id))

        with pytest.raises(NotLeader, match=f"no longer held by backend {old_pid}"):
            await batch_of(deposed)([delivery("from-the-deposed-leader")])
        await batch_of(second.leadership)([delivery("from-the-new-leader")])
        assert await _effects(pool) == ["from-the-new-leader"]
        assert await pool.fetchval("SELECT count(*) FROM inbox") == 1
    finally:
        stop.set()
        first.leadership._pid = None
        await asyncio.gather(first.task, *([second.task] if second else []))


async def test_the_check_reads_the_leader_lock_of_the_lock_session(database_url: str) -> None:
    """Held by the lock session: passes; released (the session still alive, so nothing in
    the process notices), or taken by another session: refused; the other session passes."""
    async with (
        _session(database_url) as checking,
        _session(database_url) as mine,
        _session(database_url) as other,
    ):
        leadership = believes(Leadership(database_url), mine.get_server_pid())
        rival = believes(Leadership(database_url), other.get_server_pid())
        assert await mine.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
        await leadership.check(checking)
        await _refused_by_pg_locks(rival, checking)

        assert await mine.fetchval("SELECT pg_advisory_unlock($1)", LEADER_LOCK_KEY)
        await _refused_by_pg_locks(leadership, checking)
        await _refused_by_pg_locks(rival, checking)

        assert await other.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
        await rival.check(checking)
        await _refused_by_pg_locks(leadership, checking)
        # A session may check itself too (the check runs on any connection).
        await rival.check(other)


@pytest.mark.parametrize(
    ("what", "take"),
    [
        ("the key above it", "SELECT pg_advisory_lock($1::bigint + 1)"),
        # Same low 32 bits, but classid 1 (the key's high half): not the leader lock.
        ("another high half", "SELECT pg_advisory_lock((1::bigint << 32) | $1::bigint)"),
        # The two-key form: classid 0, objid the key, but objsubid 2.
        ("the two-key form", "SELECT pg_advisory_lock(0, $1::int)"),
        ("the key below it", "SELECT pg_advisory_lock($1::bigint - 1)"),
    ],
)
async def test_a_lock_that_is_not_the_leader_lock_does_not_count(
    database_url: str, what: str, take: str
) -> None:
    async with _session(database_url) as checking, _session(database_url) as mine:
        leadership = believes(Leadership(database_url), mine.get_server_pid())
        await mine.execute(take, LEADER_LOCK_KEY)
        await _refused_by_pg_locks(leadership, checking)
        # The same session with the real leader lock passes.
        assert await mine.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
        await leadership.check(checking)


async def test_a_lock_waited_for_is_not_held(database_url: str) -> None:
    async with (
        _session(database_url) as checking,
        _session(database_url) as mine,
        _session(database_url) as holder,
    ):
        leadership = believes(Leadership(database_url), mine.get_server_pid())
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
        waiting = asyncio.create_task(mine.execute("SELECT pg_advisory_lock($1)", LEADER_LOCK_KEY))
        try:

            async def queued() -> bool:
                return bool(
                    await checking.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted "
                        "AND locktype = 'advisory')",
                        leadership._pid,
                    )
                )

            await until(queued)
            await _refused_by_pg_locks(leadership, checking)
            assert await holder.fetchval("SELECT pg_advisory_unlock($1)", LEADER_LOCK_KEY)
            await asyncio.wait_for(waiting, 10)
            await leadership.check(checking)  # granted now
        finally:
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting


async def test_the_leader_lock_of_another_database_does_not_count(
    database_url: str, postgres_server: PostgresServer
) -> None:
    """Advisory locks belong to one database: a scheduler of another installation on the same
    server holding the same key leads that one, not this one."""
    name = f"test_{uuid.uuid4().hex}"
    elsewhere = postgres_server.create_database(name)
    try:
        async with (
            _session(database_url) as checking_here,
            _session(elsewhere) as checking_there,
            _session(elsewhere) as theirs,
        ):
            leadership = believes(Leadership(elsewhere), theirs.get_server_pid())
            assert await theirs.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
            await leadership.check(checking_there)
            await _refused_by_pg_locks(leadership, checking_here)
    finally:
        postgres_server.drop_database(name)


async def test_a_process_that_knows_it_lost_is_refused_without_asking(database_url: str) -> None:
    leadership = Leadership(database_url)
    assert not leadership.is_leader and leadership.role == "follower"
    with pytest.raises(NotLeader, match=r"^this scheduler is not the leader$"):
        await leadership.check(None)  # type: ignore[arg-type]  # no query is made


async def test_a_follower_counts_each_try(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = asyncio.Event()
    sleeps = Sleeps(monkeypatch, stop)
    async with _session(database_url) as holder:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
        follower = Candidate(database_url, stop, retry_s=0.3)
        await until(lambda: len(sleeps.asked) >= 4)
        stop.set()
        await follower.task
    # One try per pause (the last pause may be the election's own, after stopping).
    assert follower.leadership.attempts in (len(sleeps.asked) - 1, len(sleeps.asked))
    assert set(sleeps.asked) == {0.3} and follower.led == 0


async def test_a_hung_leader_is_ended_by_the_session_timeout(
    database_url: str, pool: asyncpg.Pool
) -> None:
    """A leader that stops querying its lock session (hung, partitioned; here: a watchdog
    that checks only every minute) loses it to PostgreSQL's ``idle_session_timeout``."""
    stop = asyncio.Event()
    led = asyncio.Event()

    async def lead(stop_leading: asyncio.Event) -> None:
        led.set()
        await stop_leading.wait()

    hung = Leadership(database_url, retry_s=5, check_s=60, session_timeout_s=1)
    task = asyncio.create_task(hung.run(stop, lead))
    try:
        await until(lambda: hung.is_leader)
        holder = await lock_holder(pool)
        name = await pool.fetchval(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1", holder
        )
        assert name == "trainyard-scheduler-leader"
        assert led.is_set()
        # Ended by the server after 1 s idle: not leading well before the 60 s check.
        await until(lambda: not hung.is_leader, timeout=8)
        assert await lock_holder(pool) is None
    finally:
        stop.set()
        await task


def test_the_lock_session_settings() -> None:
    assert Leadership("postgresql://x", session_timeout_s=2.5)._session_settings() == {
        "application_name": "trainyard-scheduler-leader",
        "idle_session_timeout": "2500",
    }
    # 0: no timeout set (PostgreSQL's default, none).
    assert Leadership("postgresql://x", session_timeout_s=0)._session_settings() == {
        "application_name": "trainyard-scheduler-leader"
    }


class Sleeps:
    """Records the pauses ``leader._sleep`` is asked for until ``stop`` (the election's, not
    the watchdog's), and takes them shortened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stop: asyncio.Event) -> None:
        from trainyard_platform.services.scheduler import leader

        self.asked: list[float] = []
        real = leader._sleep

        async def sleep(until: asyncio.Event, seconds: float) -> None:
            if until is stop:
                self.asked.append(seconds)
            await real(until, min(seconds, 0.05))

        monkeypatch.setattr(leader, "_sleep", sleep)


async def test_an_unreachable_database_is_retried_every_retry_s(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stop = asyncio.Event()
    sleeps = Sleeps(monkeypatch, stop)
    nowhere = Leadership("postgresql://trainyard@127.0.0.1:1/none", retry_s=0.25)

    async def never(stop_leading: asyncio.Event) -> None:
        raise AssertionError("cannot lead without a database")

    with caplog.at_level("WARNING"):
        task = asyncio.create_task(nowhere.run(stop, never))
        await until(lambda: len(sleeps.asked) >= 3)
        stop.set()
        await task
    assert set(sleeps.asked) == {0.25}  # never led: no longer pause
    assert nowhere.attempts == 0 and not nowhere.is_leader
    # One line for the outage, not one a try (it logged "leader election: ...; retrying"
    # every retry_s, 1 s by default, for as long as PostgreSQL was away).
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("PostgreSQL (TRAINYARD_DATABASE_URL) unavailable: "), warning
    assert "refused" in warning.lower() or "connect" in warning.lower()


async def test_a_deposed_leader_pauses_twice_as_long_and_releases_its_lock_on_stop(
    database_url: str, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard_platform.services.scheduler import leader

    connects: list[dict[str, object]] = []
    real_connect = leader.asyncpg.connect

    async def connect(*args: object, **kwargs: object) -> asyncpg.Connection:
        connects.append(kwargs)
        return await real_connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(leader.asyncpg, "connect", connect)
    stop = asyncio.Event()
    sleeps = Sleeps(monkeypatch, stop)
    first = Candidate(database_url, stop, retry_s=0.5)
    try:
        await until(lambda: first.leadership.is_leader)
        assert connects == [
            {
                "timeout": 10,
                "server_settings": {
                    "application_name": "trainyard-scheduler-leader",
                    "idle_session_timeout": "5000",
                },
            }
        ]
        assert sleeps.asked == []  # won at the first try
        since = first.leadership.since
        assert since is not None and since.tzinfo is not None
        assert abs((datetime.now(UTC) - since).total_seconds()) < 30
        assert first.leadership.terms == 1
        await pool.execute("SELECT pg_terminate_backend($1)", await lock_holder(pool))
        await until(lambda: len(sleeps.asked) >= 1)
        assert sleeps.asked[0] == 1.0  # deposed: 2 x retry_s, so a follower goes first
        await until(lambda: first.leadership.is_leader)  # nobody else: it leads again
        assert len(connects) == 2
        assert first.leadership.terms == 2
        assert first.leadership.since is not None and first.leadership.since >= since
    finally:
        stop.set()
        await first.task
    assert not first.leadership.is_leader and first.leadership.since is None
    assert await lock_holder(pool) is None  # stopping closed the lock session


async def test_the_watchdog_deposes_a_leader_whose_lock_session_stops_answering(
    database_url: str, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock session's backend freezes (SIGSTOP: a partition or a hung server, the TCP
    connection still open, so nothing reports its end): the watchdog's query times out and
    the leader stops leading on its own."""
    stop = asyncio.Event()
    seen_by_work: list[bool] = []

    class Observed(Candidate):
        async def lead(self, stop_leading: asyncio.Event) -> None:
            await super().lead(stop_leading)
            # When the work is told to stop, the process already says it is not leading.
            seen_by_work.append(self.leadership.is_leader)

    with caplog.at_level("INFO", logger="trainyard_platform.services.scheduler.leader"):
        first = Observed(database_url, stop, retry_s=0.2)
        frozen: int | None = None
        try:
            await until(lambda: first.leadership.is_leader)
            names = {t.get_name() for t in asyncio.all_tasks()}
            assert {"leader-watchdog", "leader-work"} <= names
            frozen = await lock_holder(pool)
            assert frozen is not None
            assert f"leading (lock held by backend {frozen})" in caplog.messages
            os.kill(frozen, signal.SIGSTOP)
            # check_s is 0.1: the query times out after 1 s.
            await until(lambda: not first.leadership.is_leader, timeout=6)
            # The flag falls first; the work hears of it at its next turn of the event loop.
            await until(lambda: first.stepped_down == 1, timeout=6)
            assert seen_by_work == [False]
            failed = [m for m in caplog.messages if m.startswith("leader lock connection failed")]
            assert failed and "None" not in failed[0]  # names the failure
            assert "lost the leader lock connection: no longer leading" in caplog.messages
        finally:
            if frozen is not None:
                os.kill(frozen, signal.SIGCONT)
            stop.set()
            await first.task
    assert "no longer leading" in caplog.messages


async def test_a_watchdog_that_ends_on_an_unexpected_error_ends_the_term(
    database_url: str, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """Without its watchdog a leader would never notice a loss: the watchdog ending for any
    reason ends the term (logged with the error), and the process competes again."""
    stop = asyncio.Event()

    class Broken(Leadership):
        async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
            raise RuntimeError("a failure the watchdog does not expect")

    with caplog.at_level("INFO", logger="trainyard_platform.services.scheduler.leader"):
        first = Candidate(database_url, stop, retry_s=0.2, kind=Broken)
        try:
            await until(lambda: first.stepped_down >= 1, timeout=10)
            ended = [m for m in caplog.messages if m.startswith("the leader lock's watchdog ended")]
            assert ended and "a failure the watchdog does not expect" in ended[0]
            assert "lost the leader lock connection: no longer leading" in caplog.messages
            await until(lambda: first.led >= 2, timeout=10)  # it competed again, and won
        finally:
            stop.set()
            await first.task


async def test_a_check_that_finds_the_lock_gone_ends_the_term(
    database_url: str, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen under heavy load: the lock session lost the lock and the watchdog never noticed;
    every transaction's check was refused for half an hour while the process said it led.
    Now a refused check is itself a loss: the term ends and the process competes again."""
    stop = asyncio.Event()
    released = asyncio.Event()

    class Blind(Leadership):
        async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
            # The lock goes, the session stays: nothing reports an end, no query fails.
            await conn.fetchval("SELECT pg_advisory_unlock($1)", LEADER_LOCK_KEY)
            released.set()
            await lost.wait()

    with caplog.at_level("INFO", logger="trainyard_platform.services.scheduler.leader"):
        first = Candidate(database_url, stop, retry_s=0.2, kind=Blind)
        try:
            await asyncio.wait_for(released.wait(), timeout=10)
            pid = first.leadership._pid
            assert first.leadership.is_leader and pid is not None
            async with _session(database_url) as conn:
                with pytest.raises(NotLeader, match=f"no longer held by backend {pid}"):
                    await first.leadership.check(conn)
            assert not first.leadership.is_leader
            await until(lambda: first.stepped_down >= 1, timeout=10)
            assert (
                f"the leader lock is no longer held by backend {pid}: no longer leading"
                in caplog.messages
            )
        finally:
            stop.set()
            await first.task
