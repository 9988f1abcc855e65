"""The storage collector: frees checkpoints beyond each job's retention and objects nothing
references, after a grace period, never anything in use (``collector_plan`` says what).

A pass (``StorageCollector.collect_once``):
1. takes a PostgreSQL advisory lock, so one registry replica collects at a time (another's
   pass is skipped, not queued). The lock is held for the whole pass, store calls
   included, so it lives on a connection of its own (``db.session_lock``), never on one
   of the pool's: the pass's statements take the pool's connections one at a time and give
   each back before the store is asked, so requests and events are served meanwhile, on a
   pool of one connection too;
2. lists the store's ``jobs/`` and ``registry/`` keys — *before* reading the references, so
   an object written during the pass is either not listed or listed and then looked up;
3. reads the references (recorded checkpoints, live versions' artifacts and lineage
   parents, running jobs' resume points, each attempt's latest checkpoint of a job running
   or failed, the jobs running) and plans what is deletable (a running job's folders that
   hold the runner's retention marks stay: ``collector_plan``). A failed job's attempts
   keep their latest because a late success can still replace that failure, however long
   after (the scheduler keeps the success of a node it had declared lost: docs/events.md,
   "A late success"), and it registers that attempt's last checkpoint;
4. marks each deletable key with when it was first seen deletable (``storage_marks``) and
   drops the marks of keys that are no longer deletable or gone;
5. reads the references again and deletes only keys deletable in both readings and marked
   at least ``grace`` ago, manifests first.
A checkpoint committed while a pass runs is therefore never deleted: it is not listed, or
it is referenced by the second reading, or (its ``checkpoint.saved`` still in flight) it is
only marked, and it is referenced long before its grace ends. Step 5's second reading is
what keeps an object whose reference arrived during the pass.

On an S3 store a pass also aborts the incomplete multipart uploads under ``jobs/`` and
``registry/`` that it has seen incomplete for ``grace`` (``uploads``; marks in
``storage_upload_marks``). ``python -m trainyard_platform.services.registry.collector``
runs one pass and prints its report as JSON; the service runs one every
``collector_interval_seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from trainyard_platform.services.registry.collector_plan import (
    Recorded,
    References,
    deletion_order,
    due,
    plan,
)
from trainyard_platform.services.registry.config import Settings
from trainyard_platform.services.registry.uploads import S3Uploads
from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.db import (
    DATABASE_FAULTS,
    failed_rounds_from_zero,
    log_failed_round,
    migrate,
    open_pool,
    session_lock,
)
from trainyard_platform.shared.runtime import settings_or_exit
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.storage import ObjectStore, S3Store, key_in_store, open_store
from trainyard_platform.shared.storage.s3 import client_from_settings

log = logging.getLogger(__name__)

LOCK_KEY = "trainyard-registry-storage-collector"
Clock = Callable[[], datetime]
Pause = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Report:
    """What one pass did: keys listed, deletable, newly marked, deleted."""

    ran: bool
    listed: int = 0
    deletable: int = 0
    marked: int = 0
    deleted: int = 0
    freed_bytes: int = 0
    """The bytes of deleted objects whose size the registry knows (recorded checkpoints)."""
    aborted_uploads: int = 0


async def _no_pause(_: str) -> None:
    return None


class StorageCollector:
    def __init__(
        self,
        pool: asyncpg.Pool,
        database: DatabaseSettings,
        store: ObjectStore,
        keep: int,
        grace: timedelta,
        clock: Clock = lambda: datetime.now(UTC),
        uploads: S3Uploads | None = None,
    ) -> None:
        """``database``: the settings ``pool`` was opened with, for the pass's lock
        connection (``db.session_lock``). ``uploads``: the store's incomplete multipart
        uploads (an S3 store's; see ``for_store``), aborted once they have stayed incomplete
        for ``grace``."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self._pool = pool
        self._database = database
        self._store = store
        self._keep = keep
        self._grace = grace
        self._clock = clock
        self._uploads = uploads

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """A pass every ``interval_s`` until ``stop``. A pass that PostgreSQL failed
        (``db.DATABASE_FAULTS``) or the object store (unreachable or unavailable:
        ``bus.infrastructure_fault``) is logged and tried again; anything else is a bug and
        propagates."""
        failed_rounds_from_zero("storage-collector")
        while not stop.is_set():
            try:
                report = await self.collect_once()
            except Exception as exc:
                if not isinstance(exc, DATABASE_FAULTS) and infrastructure_fault(exc) is None:
                    raise
                log_failed_round(
                    log,
                    "storage-collector",
                    f"storage collector: %s; trying again in {interval_s:.0f} s",
                    exc,
                )
            else:
                if report.deleted or report.marked:
                    log.info("storage collector: %s", report)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    async def collect_once(self, pause: Pause = _no_pause) -> Report:
        """One pass (module docstring). ``pause(phase)`` is awaited after the listing
        (``"listed"``) and after the marks (``"marked"``): where a test makes a checkpoint
        arrive in the middle of a pass."""
        async with session_lock(self._database, LOCK_KEY, purpose="storage-collector") as held:
            if not held:
                log.info("storage collector: another pass is running; skipped")
                return Report(ran=False)
            return await self._pass(pause)

    async def _pass(self, pause: Pause) -> Report:
        keys = await asyncio.to_thread(self._listing)
        await pause("listed")
        now = self._clock()
        async with self._pool.acquire() as conn:
            deletable = plan(keys, await self._references(conn), self._keep)
            async with conn.transaction():
                marked = await _remark(conn, deletable, now)
                first_seen = await _marks(conn)
        await pause("marked")
        async with self._pool.acquire() as conn:
            sizes = await self._recorded_sizes(conn)
            again = plan(keys, await self._references(conn), self._keep)
        doomed = [k for k in due(deletable, first_seen, now - self._grace) if k in again]
        # One thread for the whole batch: a hop to a thread per key costs more than an
        # in-cluster DELETE at a million objects.
        await asyncio.to_thread(self._delete_all, deletion_order(doomed))
        if doomed:
            async with self._pool.acquire() as conn:
                await conn.execute("DELETE FROM storage_marks WHERE key = ANY($1::text[])", doomed)
            log.info("storage collector: deleted %d objects", len(doomed))
        aborted = await self._abort_stale_uploads(now) if self._uploads is not None else 0
        return Report(
            ran=True,
            listed=len(keys),
            deletable=len(deletable),
            marked=marked,
            deleted=len(doomed),
            freed_bytes=sum(sizes.get(k, 0) for k in doomed),
            aborted_uploads=aborted,
        )

    async def _abort_stale_uploads(self, now: datetime) -> int:
        assert self._uploads is not None
        pending = await asyncio.to_thread(self._uploads.list)
        async with self._pool.acquire() as conn, conn.transaction():
            ids = [u.upload_id for u in pending]
            await conn.execute(
                """DELETE FROM storage_upload_marks m WHERE NOT EXISTS
                       (SELECT 1 FROM unnest($1::text[]) AS p(i) WHERE p.i = m.upload_id)""",
                ids,
            )
            await conn.execute(
                """INSERT INTO storage_upload_marks (upload_id, key, first_seen_at)
                   SELECT i, k, $3 FROM unnest($1::text[], $2::text[]) AS u(i, k)
                   ON CONFLICT (upload_id) DO NOTHING""",
                ids,
                [u.key for u in pending],
                now,
            )
            rows = await conn.fetch(
                "SELECT upload_id FROM storage_upload_marks WHERE first_seen_at <= $1",
                now - self._grace,
            )
        stale = {r["upload_id"] for r in rows}
        doomed = [u for u in pending if u.upload_id in stale]
        for upload in doomed:
            await asyncio.to_thread(self._uploads.abort, upload)
        if doomed:
            async with self._pool.acquire() as conn:
                await conn.execute(
                    "DELETE FROM storage_upload_marks WHERE upload_id = ANY($1::text[])",
                    [u.upload_id for u in doomed],
                )
            log.info("storage collector: aborted %d incomplete uploads", len(doomed))
        return len(doomed)

    async def _recorded_sizes(self, conn: asyncpg.Connection) -> dict[str, int]:
        rows = await conn.fetch("SELECT uri, size_bytes FROM checkpoints")
        found = ((key_in_store(self._store, r["uri"]), r["size_bytes"]) for r in rows)
        return {key: size for key, size in found if key is not None}

    def _delete_all(self, keys: list[str]) -> None:
        for key in keys:
            self._store.delete(key)

    def _listing(self) -> list[str]:
        return [*self._store.list("jobs/"), *self._store.list("registry/")]

    async def _references(self, conn: asyncpg.Connection) -> References:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            checkpoint_rows = await conn.fetch(
                "SELECT job_id, uri, step, saved_at FROM checkpoints"
            )
            protected_uris = await conn.fetch(
                """SELECT artifact_uri AS uri FROM model_versions
                   WHERE deleted_at IS NULL AND artifact_key IS NULL
                   UNION SELECT jsonb_array_elements_text(lineage->'parent_checkpoints')
                   FROM model_versions WHERE deleted_at IS NULL
                   UNION SELECT r.resumed_from FROM runs r
                   JOIN tracked_jobs t ON t.job_id = r.job_id
                   WHERE t.status = 'running' AND r.resumed_from IS NOT NULL
                   UNION (SELECT DISTINCT ON (c.allocation_id) c.uri FROM checkpoints c
                          JOIN tracked_jobs t ON t.job_id = c.job_id
                          WHERE t.status IN ('running', 'failed')
                          ORDER BY c.allocation_id, c.step DESC, c.saved_at DESC)"""
            )
            running = await conn.fetch("SELECT job_id FROM tracked_jobs WHERE status = 'running'")
            owned = await conn.fetch(
                "SELECT artifact_key FROM model_versions "
                "WHERE deleted_at IS NULL AND artifact_key IS NOT NULL"
            )
        recorded = []
        for row in checkpoint_rows:
            key = key_in_store(self._store, row["uri"])
            if key is not None:
                recorded.append(Recorded(row["job_id"], key, row["step"], row["saved_at"]))
        protected = {r["artifact_key"] for r in owned}
        for row in protected_uris:
            key = key_in_store(self._store, row["uri"])
            if key is not None:
                protected.add(key)
        return References(
            recorded=recorded, protected=protected, running={r["job_id"] for r in running}
        )


async def _remark(conn: asyncpg.Connection, deletable: Mapping[str, str], now: datetime) -> int:
    """Mark the deletable keys not marked yet (with ``now``); unmark all others. Returns how
    many were newly marked."""
    # An anti-join, not NOT (key = ANY(...)): that scans the whole array for every mark.
    await conn.execute(
        """DELETE FROM storage_marks m WHERE NOT EXISTS
               (SELECT 1 FROM unnest($1::text[]) AS d(k) WHERE d.k = m.key)""",
        list(deletable),
    )
    inserted = await conn.fetchval(
        """WITH new AS (
               INSERT INTO storage_marks (key, reason, first_seen_at)
               SELECT k, r, $3 FROM unnest($1::text[], $2::text[]) AS u(k, r)
               ON CONFLICT (key) DO NOTHING RETURNING 1)
           SELECT count(*) FROM new""",
        list(deletable),
        list(deletable.values()),
        now,
    )
    return int(inserted)


async def _marks(conn: asyncpg.Connection) -> dict[str, datetime]:
    rows = await conn.fetch("SELECT key, first_seen_at FROM storage_marks")
    return {r["key"]: r["first_seen_at"] for r in rows}


def for_store(pool: asyncpg.Pool, store: ObjectStore, settings: Settings) -> StorageCollector:
    """The collector the service runs (and the command), with the settings' retention and
    grace, aborting stale uploads when ``store`` is on S3."""
    uploads = None
    if isinstance(store, S3Store):
        client = client_from_settings(settings.storage)
        prefixes = [f"{store.prefix}jobs/", f"{store.prefix}registry/"]
        uploads = S3Uploads(client, store.bucket, prefixes)
    return StorageCollector(
        pool,
        settings.database,
        store,
        settings.collector_keep_checkpoints,
        timedelta(seconds=settings.collector_grace_seconds),
        uploads=uploads,
    )


async def collect_from_settings(settings: Settings) -> Report:
    """One pass with the service's own settings (the command)."""
    # Imported here: the service module imports this one to run the periodic pass.
    from trainyard_platform.services.registry.service import MIGRATIONS, NAME

    async with open_pool(settings.database, NAME) as pool:
        await migrate(pool, NAME, MIGRATIONS)
        store = await asyncio.to_thread(open_store, settings.storage.uri, settings.storage)
        return await for_store(pool, store, settings).collect_once()


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard_platform.services.registry.collector``: one pass, its report as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.services.registry.collector",
        description="Run one pass of the registry's storage collector (settings: "
        "TRAINYARD_REGISTRY_COLLECTOR_* and the shared TRAINYARD_* variables).",
    )
    parser.parse_args(argv)
    settings = settings_or_exit(parser.prog, Settings)
    logging.basicConfig(level=settings.log_level)
    report = asyncio.run(collect_from_settings(settings))
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
