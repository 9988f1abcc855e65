"""PostgreSQL access: one asyncpg pool per service, confined to the service's own schema.

Contract:
- ``open_pool`` yields a pool whose connections have ``search_path`` set to the service's
  schema, so unqualified table names in a service's SQL always mean its own tables.
- ``migrate`` applies forward-only numbered SQL files (``NNNN_name.sql``) exactly once each,
  in order, each in its own transaction, under an advisory lock so that several replicas
  starting together do not race. The platform's own tables (outbox, inbox) come first from
  ``shared/migrations``; a service's files follow from its ``migrations/`` folder.
- A connection goes back to the pool with its transaction rolled back (if one is still
  open) and nothing else reset on the server: no round trip per release. The code on pooled
  connections therefore leaves no session state behind (no session ``SET``, no ``LISTEN``
  left registered, session advisory locks released before the connection is; a leader's
  lock lives on a connection of its own). Functions given to ``on_release`` run as each
  connection goes back.
- A session advisory lock held across work that is not one statement (a pass of many
  statements, object store calls) is taken with ``session_lock``, on a connection of its
  own, never on one of the pool's: held on a pooled connection it would be one connection
  fewer for every request while the work waits on the store, and the work's own
  statements, which take the pool's connections, would wait for ever on a pool of one.
- Work that must not wait for a busy pool (a lease renewed in time, ``shared.slots``) runs
  on ``connection_beside(pool)``: a connection of its own to the pool's database and schema,
  with the pool's bounds, that the caller closes.
- PostgreSQL that stops answering (a paused server, a network path that holds the
  connection open and passes nothing) never holds a caller for ever: every statement waits
  at most ``DatabaseSettings.query_timeout_seconds`` (asyncpg's ``command_timeout``; asyncpg
  then cancels it, its transaction is rolled back, and a connection whose cancellation does
  not answer either is closed), every ``acquire`` at most ``acquire_timeout_seconds`` (also
  the bound on handing the connection back), and opening a connection at most
  ``connect_timeout_seconds``. Each is a ``TimeoutError``, which ``bus.infrastructure_fault``
  calls "PostgreSQL not answering": a handler's event is waited out, an HTTP request answers
  503, a loop logs a failed round. A one-off command whose statements may rightly run long
  (a rebuild of rollups) opens its pool with ``long_statements=True``; migrations give their
  statements ``MIGRATION_TIMEOUT_S``.
- PostgreSQL away is logged as one line when it goes and one when it answers again
  (``outages.POSTGRES``), told by every connection opened (``connect``: the pools', the
  scheduler leader's) and every readiness ``ping``. asyncpg's pool, which connects again to
  keep ``pool_min_size`` connections after it lost them, logs each failed try with its
  traceback ("Failed to restore the pool connection floor"); a record of that for a
  database fault is dropped (``connect`` told it already), any other keeps its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.logs import error_text
from trainyard_platform.shared.metrics import instrument
from trainyard_platform.shared.outages import POSTGRES
from trainyard_platform.shared.settings import DatabaseSettings

PLATFORM_MIGRATIONS = Path(__file__).parent / "migrations"

DATABASE_FAULTS: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset and timed-out connections (TimeoutError is one)
    asyncpg.PostgresError,
    asyncpg.InterfaceError,  # "the underlying connection is closed", "pool is closing"
    asyncpg.InternalClientError,
)
"""What a loop that talks to PostgreSQL survives, trying again on its next round, instead
of taking its process down: the server's errors, a connection lost, refused or timed out,
and asyncpg's ``InternalClientError``. A pooled connection that an outage left in the middle
of an operation raises the last ("cannot switch to state 15; another operation (2) is in
progress", asyncpg issue 784): seen when PostgreSQL was killed during a scheduling pass, it
made the scheduler exit with status 1. The pool terminates such a connection when its reset
fails on release, so the next round gets a fresh one."""
MIGRATION_TIMEOUT_S = 3600.0
"""Longest one migration file, or the wait for another replica's migrations, may take: a
migration may rewrite a large table, far past the query timeout of the service's work."""
_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_release_listeners: list[Callable[[asyncpg.Connection], None]] = []


def on_release(listener: Callable[[asyncpg.Connection], None]) -> None:
    """Call ``listener(conn)`` whenever a connection of any pool of this process goes back to
    its pool, after its transaction ended. It must not raise or block."""
    _release_listeners.append(listener)


async def connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect``, telling ``outages.POSTGRES`` whether PostgreSQL answered."""
    try:
        conn = await asyncpg.connect(*args, **kwargs)
    except DATABASE_FAULTS as exc:
        POSTGRES.failed(exc)
        raise
    POSTGRES.answered()
    return conn


@asynccontextmanager
async def session_lock(
    settings: DatabaseSettings, key: str, *, purpose: str
) -> AsyncIterator[bool]:
    """Try PostgreSQL's session advisory lock ``hashtext(key)`` once (never waiting for its
    holder) on a connection opened for it alone, not one of a pool's; yield whether it was
    taken. On exit the connection is closed, which frees the lock.

    The connection is opened within ``settings.connect_timeout_seconds``, its statements
    are bounded by ``query_timeout_seconds``, and it is named ``trainyard-<purpose>`` in
    ``pg_stat_activity``. It is one more connection to PostgreSQL per holder, for as long
    as the ``async with`` lasts. Should it drop meanwhile (PostgreSQL restarted), the lock
    is gone with it and the holder is not told: use it where two holders at once are a
    waste, not a fault (a leader that must know uses ``scheduler.leader``)."""
    conn = await connect(
        settings.url,
        timeout=settings.connect_timeout_seconds,
        command_timeout=settings.query_timeout_seconds,
        server_settings={"application_name": f"trainyard-{purpose}"},
    )
    try:
        yield bool(await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", key))
    finally:
        try:
            await asyncio.wait_for(conn.close(), timeout=settings.connect_timeout_seconds)
        except DATABASE_FAULTS:
            conn.terminate()  # the lock goes with the session either way


class _PoolFloorOutage(logging.Filter):
    """Drops asyncpg's record of a failed try to keep the pool's floor when the failure is a
    database fault: ``connect`` told ``outages.POSTGRES`` of it, in one line a minute."""

    def filter(self, record: logging.LogRecord) -> bool:
        failure = record.exc_info[1] if record.exc_info else None
        return not (
            str(record.msg).startswith("Failed to restore the pool connection floor")
            and isinstance(failure, DATABASE_FAULTS)
        )


_POOL_FLOOR_FILTER = _PoolFloorOutage()
logging.getLogger("asyncpg.pool").addFilter(_POOL_FLOOR_FILTER)


class BoundedPool(asyncpg.Pool):  # type: ignore[misc]  # asyncpg ships no types
    """asyncpg's pool, whose ``acquire`` without a timeout of its own waits at most
    ``acquire_timeout`` (asyncpg's own acquire timeout, which also bounds the release): its
    ``fetch``, ``execute`` and the like acquire that way too. ``opened_with`` is the
    settings and schema ``open_pool`` opened it with (``connection_beside``)."""

    def __init__(
        self,
        *args: Any,
        acquire_timeout: float,
        opened_with: tuple[DatabaseSettings, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.acquire_timeout = acquire_timeout
        self.opened_with = opened_with

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self.acquire_timeout if timeout is None else timeout)


@asynccontextmanager
async def open_pool(
    settings: DatabaseSettings, schema: str, *, long_statements: bool = False
) -> AsyncIterator[asyncpg.Pool]:
    """Open a pool bound to ``schema`` (created if missing); close it on exit. Its
    statements, acquires and connects are bounded by ``settings`` (see the module);
    ``long_statements``: no bound on a statement (a one-off command's long rebuild)."""
    _check_schema(schema)
    await _ensure_schema(settings, schema)
    pool = BoundedPool(
        settings.url,
        acquire_timeout=settings.acquire_timeout_seconds,
        opened_with=(settings, schema),
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        max_queries=50_000,  # asyncpg's defaults (create_pool's)
        max_inactive_connection_lifetime=300.0,
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        command_timeout=None if long_statements else settings.query_timeout_seconds,
        timeout=settings.connect_timeout_seconds,
        server_settings={"search_path": schema},
        init=_init_connection,
        reset=_released,
        connect=connect,
    )
    await pool
    POSTGRES.watched()
    try:
        yield pool
    finally:
        await pool.close()


async def connection_beside(pool: asyncpg.Pool, *, purpose: str) -> asyncpg.Connection | None:
    """A connection of its own to the database and schema of ``pool`` (one ``open_pool``
    opened; None for any other pool), with the same bounds on its statements and its
    opening, named ``trainyard-<purpose>`` in ``pg_stat_activity``; the caller closes it.
    For work that must go on however busy the pool is (a lease renewed in time): waiting for
    a connection of the pool, it could wait past ``acquire_timeout_seconds`` and give up."""
    opened_with = getattr(pool, "opened_with", None)
    if opened_with is None:
        return None
    settings, schema = opened_with
    conn = await connect(
        settings.url,
        timeout=settings.connect_timeout_seconds,
        command_timeout=settings.query_timeout_seconds,
        server_settings={"search_path": schema, "application_name": f"trainyard-{purpose}"},
    )
    try:
        await _init_connection(conn)
    except BaseException:
        conn.terminate()
        raise
    return conn


class Listening:
    """``LISTEN channel`` on a connection of its own beside ``pool`` (``connection_beside``;
    on one of ``pool``'s for a pool ``open_pool`` did not open), ``on_notify`` called for each
    ``NOTIFY``, ``on_lost`` when the connection is lost (a database restart, a terminated
    backend): a listener kept on a pooled connection was one connection fewer for the whole
    leadership, and one lost was never heard from again.

    ``ensure()`` opens it when there is none (first, or since it was lost) and says whether it
    did: notifications sent while there was none are missed, so a caller that opened one
    again catches up (a scheduler runs a pass). It raises what opening raises (one of
    ``DATABASE_FAULTS``), leaving none open. ``close()`` ends it (idempotent)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        channel: str,
        on_notify: Callable[..., object],
        on_lost: Callable[[], object],
        *,
        purpose: str,
    ) -> None:
        self._pool = pool
        self._channel = channel
        self._on_notify = on_notify
        self._on_lost = on_lost
        self._purpose = purpose
        self._conn: asyncpg.Connection | None = None
        self._pooled = False

    async def ensure(self) -> bool:
        if self._conn is not None and not self._conn.is_closed():
            return False
        await self.close()
        conn = await connection_beside(self._pool, purpose=self._purpose)
        self._pooled = conn is None
        if conn is None:
            conn = await self._pool.acquire()
        try:
            await conn.add_listener(self._channel, self._on_notify)
        except BaseException:
            await self._drop(conn)
            raise
        conn.add_termination_listener(self._lost)
        self._conn = conn
        return True

    def _lost(self, conn: object) -> None:
        if conn is self._conn:
            self._on_lost()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.remove_termination_listener(self._lost)
        with contextlib.suppress(*DATABASE_FAULTS):
            await conn.remove_listener(self._channel, self._on_notify)
        await self._drop(conn)

    async def _drop(self, conn: asyncpg.Connection) -> None:
        if self._pooled:
            await self._pool.release(conn)
        else:
            with contextlib.suppress(*DATABASE_FAULTS):
                await conn.close(timeout=5)
            if not conn.is_closed():
                conn.terminate()


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb columns round-trip as Python objects instead of strings.
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _released(conn: asyncpg.Connection) -> None:
    # asyncpg has already rolled back an open transaction; its default reset would add a
    # round trip (RESET ALL, UNLISTEN *, ...) to every release for state this code never leaves.
    for listener in _release_listeners:
        listener(conn)


async def _ensure_schema(settings: DatabaseSettings, schema: str) -> None:
    conn = await asyncpg.connect(
        settings.url,
        timeout=settings.connect_timeout_seconds,
        command_timeout=settings.query_timeout_seconds,
    )
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    except asyncpg.UniqueViolationError:
        pass  # another replica created it between our check and our create
    finally:
        await conn.close()


async def migrate(pool: asyncpg.Pool, schema: str, service_migrations: Path) -> list[str]:
    """Apply pending migrations (platform first, then the service's); return those applied."""
    _check_schema(schema)
    applied: list[str] = []
    async with pool.acquire() as conn:
        # One lock per schema: replicas of one service wait for each other, services don't.
        await conn.execute(
            "SELECT pg_advisory_lock(hashtext($1))",
            f"migrate:{schema}",
            timeout=MIGRATION_TIMEOUT_S,
        )
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       id text PRIMARY KEY,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {r["id"] for r in await conn.fetch("SELECT id FROM schema_migrations")}
            for source, folder in (
                ("platform", PLATFORM_MIGRATIONS),
                ("service", service_migrations),
            ):
                for path in migration_files(folder):
                    migration_id = f"{source}/{path.name}"
                    if migration_id in done:
                        continue
                    async with conn.transaction():
                        await conn.execute(path.read_text(), timeout=MIGRATION_TIMEOUT_S)
                        await conn.execute(
                            "INSERT INTO schema_migrations (id) VALUES ($1)", migration_id
                        )
                    applied.append(migration_id)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", f"migrate:{schema}")
    return applied


def log_failed_round(logger: logging.Logger, loop: str, message: str, exc: BaseException) -> None:
    """Log and count a round of ``loop`` that failed with one of ``DATABASE_FAULTS`` and is
    tried again: an outage (``bus.infrastructure_fault``) in one warning line, as it may
    fail every round until the database is back; anything else (a query the database
    refuses for good, asyncpg's client errors such as "another operation is in progress":
    a bug) at error level with its traceback, so a loop that survives it does not hide it.
    Counted in ``trainyard.loop.failed_rounds`` (``loop``, ``cause``: ``outage`` or
    ``error``; the alert ``TrainyardLoopFailing`` fires on errors). ``message`` ends with
    ``%s``, which gets the error's text (``logs.error_text``: a timeout's is empty)."""
    outage = infrastructure_fault(exc) is not None
    _failed_rounds.add(1, {"loop": loop, "cause": "outage" if outage else "error"})
    if outage:
        logger.warning(message, error_text(exc))
    else:
        logger.error(message, error_text(exc), exc_info=exc)


def failed_rounds_from_zero(loop: str) -> None:
    """Report ``loop``'s failed rounds of both causes at 0, as the loop starts: a counter
    first seen at its first failure, at 1, shows no ``increase`` to Prometheus, so the alert
    ``TrainyardLoopFailing`` would miss that failure (every ``log_failed_round`` loop calls
    this; ``tests/unit/shared/test_loop_rounds_from_zero.py``)."""
    for cause in ("outage", "error"):
        _failed_rounds.add(0, {"loop": loop, "cause": cause})


_failed_rounds = instrument("trainyard.loop.failed_rounds")


async def ping(pool: asyncpg.Pool) -> bool:
    """Readiness: the database answers a trivial query (told to ``outages.POSTGRES``). No
    connection to be had because every one of the pool's is in use is not ready, but no
    outage either: PostgreSQL answers, the process is busy."""
    acquired = False
    try:
        async with pool.acquire(timeout=2) as conn:
            acquired = True
            answered = bool(await conn.fetchval("SELECT true", timeout=2))
    except DATABASE_FAULTS as exc:
        if acquired or not _all_in_use(pool):
            POSTGRES.failed(exc)
        raise
    POSTGRES.answered()
    return answered


def _all_in_use(pool: asyncpg.Pool) -> bool:
    """Whether the pool holds all the connections it may and none is idle."""
    return bool(pool.get_size() >= pool.get_max_size() and pool.get_idle_size() == 0)


def migration_files(folder: Path) -> list[Path]:
    """The numbered migration files of ``folder`` in order; anything else there is an error."""
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.suffix == ".sql")
    for path in files:
        if not _MIGRATION_FILE.match(path.name):
            raise ValueError(f"migration {path.name}: name must look like 0001_what_it_does.sql")
    numbers = [int(p.name[:4]) for p in files]
    if numbers != list(range(1, len(files) + 1)):
        raise ValueError(
            f"migrations in {folder.name}: numbers must run 0001, 0002, ... without gaps"
        )
    return files


def _check_schema(schema: str) -> None:
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"schema {schema!r}: must be a lower-case SQL identifier")
