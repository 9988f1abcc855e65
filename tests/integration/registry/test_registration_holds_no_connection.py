"""A job's success copies its checkpoint holding no connection of the registry's pool.

A registration copies the whole checkpoint (gigabytes for a large model) and reads it back
to verify it. The event handler did that inside the inbox's transaction, on a connection of
the pool: a few large models registering at once held every connection for minutes, so
every HTTP request and every other event of the registry waited for one and failed (503,
"the database is not answering"), and the open transactions held back PostgreSQL's vacuum.
Now the copy is made before the transaction (``RegistryHandlers.prepare``), so with a pool
of one connection a request and other events are served while a copy is under way.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from tests.integration.registry.modelkit import VISION, app_as, job_with_checkpoints, register
from tests.integration.registry.test_registry import (
    envelopes,
    ref,
    spec,
    started,
    succeeded,
    version_rows,
)
from trainyard_platform.services.registry import repository as registry_repo
from trainyard_platform.services.registry.handlers import CopyNotMade, RegistryHandlers
from trainyard_platform.services.registry.service import NAME
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.trust import RUNNER
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


class SlowCopy:
    """Makes ``store.copy`` wait until released (a large model's copy, made slow)."""

    def __init__(self, store: Any) -> None:
        self.release = threading.Event()
        self.entered = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._copy = store.copy
        store.copy = self.copy

    def copy(self, src: str, dst: str) -> None:
        self._loop.call_soon_threadsafe(self.entered.set)
        self.release.wait(60)
        self._copy(src, dst)


@pytest.fixture
async def one_connection(database_url: str, pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """A registry pool of a single connection (``pool`` has migrated the schema)."""
    settings = DatabaseSettings(
        url=database_url, pool_min_size=1, pool_max_size=1, acquire_timeout_seconds=3
    )
    async with open_pool(settings, NAME) as small:
        yield small


def _registering(job: Any, pool: asyncpg.Pool, store: ObjectStore) -> asyncio.Task[None]:
    """The registry's consumer over ``pool`` handling ``job``'s success, as a task."""
    handle = RegistryHandlers(store).consumer(pool)
    success: Envelope[Payload] = Envelope.wrap(
        succeeded(job.id, f"alloc-{job.id}", job.checkpoints[0]), source=RUNNER, subject=job.id
    )
    return asyncio.create_task(handle([Delivery(success)]))


async def test_a_registration_copying_its_checkpoint_holds_no_connection(
    pool: asyncpg.Pool, one_connection: asyncpg.Pool, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [1])
    slow = SlowCopy(store)
    registering = _registering(job, one_connection, store)
    try:
        async with asyncio.timeout(30):
            await slow.entered.wait()
        # The copy is under way: the pool's only connection is free for others meanwhile.
        async with asyncio.timeout(20):
            async with app_as(one_connection, store, VISION) as client:
                listed = await client.get("/v1/models")
            assert listed.status_code == 200, listed.text
            # Another job's events, through the same handlers and pool.
            other = await job_with_checkpoints(one_connection, store, [1], name="other")
        assert not registering.done()
    finally:
        slow.release.set()
    async with asyncio.timeout(30):
        await registering

    rows = await version_rows(pool, job.id)
    assert [(r["version"], r["origin"]) for r in rows] == [(1, "job_success")]
    async with pool.acquire() as conn:
        checkpoints = await conn.fetchval(
            "SELECT count(*) FROM checkpoints WHERE job_id = $1", other.id
        )
    assert checkpoints == 1


async def test_a_success_in_the_batch_of_its_start_is_copied_before_its_own_transaction(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Before the batch, the success's run is not recorded, so nothing is copied for it;
    its transaction never copies: the batch fails whole (``CopyNotMade``, a ``NotYet``)
    and, handled one event at a time as the bus then does, the success is copied first
    and registered once. A redelivery of it copies nothing more."""
    copied: list[str] = []
    copy = store.copy

    def counted(src: str, dst: str) -> None:
        copied.append(dst)
        copy(src, dst)

    store.copy = counted  # type: ignore[method-assign]
    handle = RegistryHandlers(store).consumer(pool)
    job = f"job-{uuid.uuid4().hex[:8]}"
    success: Envelope[Payload] = Envelope.wrap(
        succeeded(job, "alloc-1", ref(store, job, 1)), source=RUNNER, subject=job
    )
    batch = [Delivery(e) for e in envelopes(started(job, "alloc-1", 0, spec()), job)]
    batch.append(Delivery(success))

    with pytest.raises(CopyNotMade):
        await handle(batch)
    assert copied == []
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM runs WHERE job_id = $1", job) == 0

    for delivery in batch:
        await handle([delivery])
    await handle([Delivery(success)])  # redelivered

    assert len(copied) == 1
    rows = await version_rows(pool, job)
    assert len(rows) == 1 and copied[0].endswith(f"/{rows[0]['id']}/checkpoint.pt")


class SlowDelete:
    """Makes ``store.delete`` wait until released (a store that answers slowly)."""

    def __init__(self, store: Any) -> None:
        self.release = threading.Event()
        self.entered = asyncio.Event()
        self.deleted: list[str] = []
        self._loop = asyncio.get_running_loop()
        self._delete = store.delete
        store.delete = self.delete

    def delete(self, key: str) -> None:
        self._loop.call_soon_threadsafe(self.entered.set)
        self.release.wait(60)
        self._delete(key)
        self.deleted.append(key)


async def test_a_copy_its_transaction_did_not_record_is_deleted_holding_no_connection(
    pool: asyncpg.Pool,
    one_connection: asyncpg.Pool,
    store: ObjectStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Storing the version fails: the batch's transaction rolls back, and the copy is
    deleted after it. With a pool of one connection a statement is served while the store
    deletes it. Before, the copy was deleted inside the transaction (``models.record``),
    holding the pool's only connection: the statement waited until the acquire timeout."""
    job = await job_with_checkpoints(pool, store, [1])

    async def refused(*_: Any) -> None:
        raise RuntimeError("the version was not stored")

    monkeypatch.setattr(registry_repo, "insert_version", refused)
    slow = SlowDelete(store)
    registering = _registering(job, one_connection, store)
    try:
        async with asyncio.timeout(30):
            await slow.entered.wait()
        async with asyncio.timeout(20):
            assert await one_connection.fetchval("SELECT 1") == 1
    finally:
        slow.release.set()
    with pytest.raises(RuntimeError, match="not stored"):
        async with asyncio.timeout(30):
            await registering
    assert len(slow.deleted) == 1 and slow.deleted[0].startswith("registry/")
    assert store.list("registry/") == []
    assert await version_rows(pool, job.id) == []


async def test_a_registration_whose_version_was_not_stored_frees_its_copy_holding_no_connection(
    pool: asyncpg.Pool,
    one_connection: asyncpg.Pool,
    store: ObjectStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same through ``POST .../versions``: its transaction rolls back, the copy is
    deleted after it, and another request is served meanwhile on a pool of one."""
    job = await job_with_checkpoints(pool, store, [1])

    async def refused(*_: Any) -> None:
        raise RuntimeError("the version was not stored")

    monkeypatch.setattr(registry_repo, "insert_version", refused)
    slow = SlowDelete(store)
    async with app_as(one_connection, store, VISION) as client:
        registering = asyncio.create_task(register(client, "vision", "digits", job))
        try:
            async with asyncio.timeout(30):
                await slow.entered.wait()
            async with asyncio.timeout(20):
                listed = await client.get("/v1/models")
            assert listed.status_code == 200, listed.text
        finally:
            slow.release.set()
        async with asyncio.timeout(30):
            answered = await registering
    assert answered.status_code == 500
    assert len(slow.deleted) == 1 and store.list("registry/") == []
    assert await version_rows(pool, job.id) == []
