"""The storage collector against real PostgreSQL and a real S3 endpoint (moto's server):
it frees exactly what nothing references, after the grace period, and never a checkpoint
committed while it runs."""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import urllib3

from tests.integration.registry.modelkit import (
    VISION,
    app_as,
    apply,
    commit_checkpoint,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_registry import T0, ref, spec, started, succeeded
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.services.registry.collector import StorageCollector
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.services.registry.service import NAME
from trainyard_platform.services.registry.uploads import S3Uploads
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import CheckpointSaved, JobCancelled, JobFailed
from trainyard_platform.shared.events.trust import SCHEDULER, routing_key_of
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.storage import ObjectStore, S3Store
from trainyard_platform.shared.storage.local import LocalStore
from trainyard_platform.shared.storage.s3 import client_from_settings

pytestmark = pytest.mark.integration

T = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
GRACE = timedelta(hours=1)


@pytest.fixture
def database(database_url: str) -> DatabaseSettings:
    """The settings the registry's pool was opened with (the collector's lock connection)."""
    return DatabaseSettings(url=database_url)


class Clock:
    def __init__(self) -> None:
        self.now = T

    def __call__(self) -> datetime:
        return self.now


def folder_keys(store: ObjectStore, job_id: str, step: int) -> set[str]:
    return set(store.list(f"jobs/{job_id}/checkpoints/step-{step:08d}/"))


async def test_the_collector_frees_exactly_what_nothing_references(
    pool: asyncpg.Pool, database: DatabaseSettings, store: ObjectStore
) -> None:
    done = await job_with_checkpoints(pool, store, [])  # ended: only retention keeps its own
    sizes = {}
    for step in (1, 2, 3, 4):
        sizes[step] = (await commit_checkpoint(pool, store, done.id, step)).size_bytes
    await apply(pool, store, done.id, JobCancelled(job_id=done.id, reason="by its user"))
    running = await job_with_checkpoints(pool, store, [])
    await commit_checkpoint(pool, store, running.id, 1)
    # Started; its checkpoint.saved arrives during the pass.
    late = (await job_with_checkpoints(pool, store, [])).id
    await commit_checkpoint(pool, store, late, 9, record=False)
    lost = f"job-{uuid.uuid4().hex[:8]}"  # a checkpoint whose event never came
    await commit_checkpoint(pool, store, lost, 5, record=False)
    async with app_as(pool, store, VISION) as client:
        made = await register(client, "vision", "digits", done)  # step 4, copied
        assert made.status_code == 201
    orphan_copy = f"registry/vision/digits/{uuid.uuid4()}/checkpoint.pt"
    store.put_bytes(orphan_copy, b"a copy whose registration rolled back")
    foreign = ["bundles/vision/code.tar.gz", f"jobs/{done.id}/logs/chunk-00000001"]
    for key in foreign:
        store.put_bytes(key, b"not the collector's")
    before = set(store.list(""))

    clock = Clock()
    collector = StorageCollector(pool, database, store, keep=2, grace=GRACE, clock=clock)
    first = await collector.collect_once()
    # Everything deletable is only marked: nothing has been deletable for the grace period.
    assert (first.deleted, first.marked) == (0, 2 + 2 + 2 + 2 + 1)
    assert set(store.list("")) == before

    clock.now = T + GRACE + timedelta(minutes=1)
    arrived: list[str] = []

    async def meanwhile(phase: str) -> None:
        if phase == "listed":  # a running job commits a checkpoint after the listing
            arrived.append((await commit_checkpoint(pool, store, running.id, 2)).uri)
        if phase == "marked":  # a checkpoint.saved that was in flight is recorded
            await commit_checkpoint(pool, store, late, 9)

    second = await collector.collect_once(meanwhile)
    deleted = before - set(store.list(""))
    assert deleted == folder_keys_before(before, done.id, (1, 2)) | folder_keys_before(
        before, lost, (5,)
    ) | {orphan_copy}
    assert second.deleted == len(deleted)
    assert second.freed_bytes == sizes[1] + sizes[2]
    # Kept: the ended job's two newest, the running job's (old and new), the late one, the
    # registered copy, and what is not the collector's.
    assert folder_keys(store, done.id, 3) and folder_keys(store, done.id, 4)
    assert folder_keys(store, running.id, 1) and folder_keys(store, running.id, 2)
    assert folder_keys(store, late, 9)
    assert made.json()["artifact"]["uri"].endswith(
        next(k for k in store.list("registry/") if k != orphan_copy)
    )
    assert all(store.exists(key) for key in foreign)
    # The late checkpoint's marks go with the next pass, which deletes nothing more.
    async with pool.acquire() as conn:
        marked = {r["key"] for r in await conn.fetch("SELECT key FROM storage_marks")}
    assert marked == folder_keys(store, late, 9)
    clock.now += GRACE * 5
    third = await collector.collect_once()
    assert (third.deleted, third.deletable) == (0, 0)
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM storage_marks") == 0


async def test_a_running_jobs_late_success_and_marked_resume_point_outlive_its_retention(
    pool: asyncpg.Pool, database: DatabaseSettings, store: ObjectStore
) -> None:
    """A job whose attempt 0 was declared lost but runs on: attempt 1 (resumed from step 1)
    gets further, beyond attempt 0's last checkpoint (step 2), and a third attempt's runner
    marked step 3 resumed before its start is heard. While the job runs, neither leaves:
    attempt 0's last, what its late success registers (its mark refused by the store: the
    registry's own records keep it), nor the marked one (the marks in the store). Once the
    late success is heard and registered (a copy of its own), the job has ended: both go after the grace."""
    job = (await job_with_checkpoints(pool, store, [])).id
    for step in (1, 2):
        await commit_checkpoint(pool, store, job, step)  # attempt 0 (alloc-<job>, epoch 1)
    second = f"alloc1-{job}"
    await apply(pool, store, job, started(job, second, 1, spec(), ref(store, job, 1).uri))
    for step in (3, 4, 5):
        checkpoint = ref(store, job, step)
        store.put_bytes(checkpoint.manifest_uri.rpartition(f"{store.root_uri}/")[2], b"{}")
        saved = CheckpointSaved(
            job_id=job, allocation_id=second, epoch=2, checkpoint=checkpoint, saved_at=T0
        )
        await apply(pool, store, job, saved)
    resumed_mark = f"jobs/{job}/checkpoints/step-00000003/resumed-a0002"
    store.put_bytes(resumed_mark, b"")
    clock = Clock()
    collector = StorageCollector(pool, database, store, keep=2, grace=GRACE, clock=clock)
    before = set(store.list("jobs/"))
    for _ in range(2):
        await collector.collect_once()
        clock.now += GRACE * 2
    assert set(store.list("jobs/")) == before  # step 1: attempt 1 resumed from it

    late = succeeded(job, f"alloc-{job}", ref(store, job, 2))
    await apply(pool, store, job, late)
    async with pool.acquire() as conn:
        step = await conn.fetchval(
            "SELECT artifact_step FROM model_versions WHERE job_id = $1", job
        )
    assert step == 2  # registered from attempt 0's last checkpoint
    for _ in range(2):
        await collector.collect_once()
        clock.now += GRACE * 2
    # Step 1 stays as the version's lineage parent (attempt 1 resumed from it).
    assert before - set(store.list("jobs/")) == folder_keys_before(before, job, (2, 3))


async def test_a_late_success_heard_days_after_the_failure_finds_its_checkpoint(
    pool: asyncpg.Pool, database: DatabaseSettings, store: ObjectStore
) -> None:
    """Attempt 0 was declared lost after its step 2; attempt 1 resumed from it, saved steps 3
    to 5, and the job failed for good. Days later attempt 0's node is heard again with its
    success, which the scheduler keeps: it registers attempt 0's last checkpoint, step 2.
    The collector had freed step 2 a grace after the failure (beyond the newest 2, its
    resume no longer protected): the success registered nothing. A failed job keeps the
    latest of each attempt until a late success (or never) ends it otherwise."""
    job = (await job_with_checkpoints(pool, store, [])).id
    for step in (1, 2):
        await commit_checkpoint(pool, store, job, step)  # attempt 0 (alloc-<job>, epoch 1)
    second = f"alloc1-{job}"
    await apply(pool, store, job, started(job, second, 1, spec(), ref(store, job, 2).uri))
    for step in (3, 4, 5):
        checkpoint = ref(store, job, step)
        store.put_bytes(checkpoint.manifest_uri.rpartition(f"{store.root_uri}/")[2], b"{}")
        saved = CheckpointSaved(
            job_id=job, allocation_id=second, epoch=2, checkpoint=checkpoint, saved_at=T0
        )
        await apply(pool, store, job, saved)
    final = JobFailed(
        job_id=job,
        allocation_id=second,
        node_id="node-a",
        epoch=2,
        finished_at=T0 + timedelta(hours=2),
        exit_code=1,
        reason="exit 1",
    )
    await as_the_scheduler(pool, store, final)
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT status FROM tracked_jobs WHERE job_id = $1", job) == (
            "failed"
        )
    clock = Clock()
    collector = StorageCollector(pool, database, store, keep=2, grace=GRACE, clock=clock)
    before = set(store.list("jobs/"))
    for _ in range(3):  # days after the failure
        await collector.collect_once()
        clock.now += timedelta(days=1)
    # Freed: all but the newest 2 and each attempt's last (step 2 of attempt 0).
    assert before - set(store.list("jobs/")) == folder_keys_before(before, job, (1, 3))

    await as_the_scheduler(pool, store, succeeded(job, f"alloc-{job}", ref(store, job, 2)))
    async with pool.acquire() as conn:
        registered = await conn.fetchrow(
            "SELECT artifact_step, artifact_key FROM model_versions WHERE job_id = $1", job
        )
        status = await conn.fetchval("SELECT status FROM tracked_jobs WHERE job_id = $1", job)
    assert registered is not None and registered["artifact_step"] == 2
    assert store.exists(registered["artifact_key"]) and status == "succeeded"


async def as_the_scheduler(pool: asyncpg.Pool, store: ObjectStore, payload: Payload) -> None:
    """``payload`` as the scheduler says it on a runner's behalf (its final ``job.failed``,
    the ``job.succeeded`` of a late success it kept)."""
    envelope = Envelope.wrap(payload, source=SCHEDULER, subject=routing_key_of(payload))
    await RegistryHandlers(store).consumer(pool)([Delivery(envelope)])


def folder_keys_before(before: set[str], job_id: str, steps: tuple[int, ...]) -> set[str]:
    return {
        k for k in before for s in steps if k.startswith(f"jobs/{job_id}/checkpoints/step-{s:08d}/")
    }


async def test_a_checkpoint_listed_before_it_is_recorded_is_not_deleted(
    pool: asyncpg.Pool, database: DatabaseSettings, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [])
    clock = Clock()
    collector = StorageCollector(pool, database, store, keep=1, grace=timedelta(0), clock=clock)
    await commit_checkpoint(pool, store, job.id, 1, record=False)

    async def recorded_meanwhile(phase: str) -> None:
        if phase == "listed":
            await commit_checkpoint(pool, store, job.id, 1)

    # Even without a grace period: listed as unreferenced, referenced by the time it is read.
    report = await collector.collect_once(recorded_meanwhile)
    assert report.deleted == 0 and folder_keys(store, job.id, 1)

    # Two passes at once: the second does not run.
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold(phase: str) -> None:
        if phase == "listed":
            held.set()
            await release.wait()

    first = asyncio.create_task(collector.collect_once(hold))
    await held.wait()
    assert not (await collector.collect_once()).ran
    release.set()
    assert (await first).ran


async def test_one_pass_as_a_command(
    pool: asyncpg.Pool, store: ObjectStore, s3_server: S3Server, database_url: str
) -> None:
    lost = f"job-{uuid.uuid4().hex[:8]}"
    await commit_checkpoint(pool, store, lost, 1, record=False)
    env = {
        **os.environ,
        **s3_server.storage_env(store.root_uri),
        "TRAINYARD_DATABASE_URL": database_url,
        "TRAINYARD_REGISTRY_ADMIN_TOKEN": "op-token",
        "TRAINYARD_REGISTRY_COLLECTOR_GRACE_SECONDS": "0",
    }
    # Without a grace period a pass marks and deletes at once (the pass's own second
    # reading of the references still guards what arrives meanwhile).
    for expected in ({"marked": 2, "deleted": 2}, {"marked": 0, "deleted": 0}):
        done = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "trainyard_platform.services.registry.collector",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await done.communicate()
        assert done.returncode == 0, err.decode()
        report = json.loads(out.decode().strip().splitlines()[-1])
        assert report["ran"] and {k: report[k] for k in expected} == expected, report
    assert store.list("jobs/") == []


async def test_incomplete_uploads_are_aborted_after_the_grace_period(
    pool: asyncpg.Pool, database: DatabaseSettings, store: ObjectStore, s3_server: S3Server
) -> None:
    assert isinstance(store, S3Store)
    client = client_from_settings(s3_server.storage_settings())
    started = {
        key: client._create_multipart_upload(store.bucket, key, {})
        for key in ("jobs/j/checkpoints/step-00000001/checkpoint.pt", "bundles/vision/big")
    }
    prefixes = ["jobs/", "registry/"]
    clock = Clock()
    collector = StorageCollector(
        pool,
        database,
        store,
        keep=1,
        grace=GRACE,
        clock=clock,
        uploads=S3Uploads(client, store.bucket, prefixes),
    )

    def pending() -> set[str]:
        listed = client._list_multipart_uploads(store.bucket)
        return {u.object_name for u in listed.uploads}

    assert (await collector.collect_once()).aborted_uploads == 0  # first seen now
    assert pending() == set(started)
    clock.now += GRACE - timedelta(minutes=1)
    assert (await collector.collect_once()).aborted_uploads == 0  # not for long enough
    clock.now += timedelta(minutes=2)
    assert (await collector.collect_once()).aborted_uploads == 1
    assert pending() == {"bundles/vision/big"}  # not the collector's prefix


async def test_the_periodic_collector_waits_out_an_object_store_outage(
    pool: asyncpg.Pool, database: DatabaseSettings, tmp_path: Path
) -> None:
    """The service's loop (``run``): a pass the object store failed (unreachable: what the
    S3 client raises when its endpoint refuses) is logged and tried again, instead of ending
    the loop, and with it the registry's process."""
    stop = asyncio.Event()

    class Unreachable(LocalStore):
        listings = 0

        def list(self, prefix: str = "") -> builtins.list[str]:
            self.listings += 1
            if self.listings == 1:
                raise urllib3.exceptions.MaxRetryError(None, "/bucket", "connection refused")  # type: ignore[arg-type]
            stop.set()  # the pass after the outage runs to its end, then the loop stops
            return super().list(prefix)

    store = Unreachable(tmp_path / "store")
    await asyncio.wait_for(
        StorageCollector(pool, database, store, keep=2, grace=GRACE).run(stop, 0.01), 60
    )
    assert store.listings >= 2


async def test_a_pass_holds_no_connection_of_the_pool_while_it_waits_on_the_store(
    pool: asyncpg.Pool, database: DatabaseSettings, tmp_path: Path
) -> None:
    """With a registry pool of one connection, a statement is served while a pass waits on
    the object store (held here after its listing), and the pass then runs to its end.
    Before its lock moved to a connection of its own, the lock held the pool's only
    connection for the whole pass: the statement and the pass's own next one each waited
    for it until the acquire timeout."""
    one = database.model_copy(
        update={"pool_min_size": 1, "pool_max_size": 1, "acquire_timeout_seconds": 2.0}
    )
    store = LocalStore(tmp_path / "store")
    store.put_bytes("jobs/job-gone/checkpoints/step-00000001/checkpoint.pt", b"nothing's")
    listed, release = asyncio.Event(), asyncio.Event()

    async def store_slow(phase: str) -> None:
        if phase == "listed":
            listed.set()
            await release.wait()

    async with open_pool(one, NAME) as small:
        collector = StorageCollector(small, one, store, keep=1, grace=timedelta(0))
        passing = asyncio.create_task(collector.collect_once(store_slow))
        try:
            async with asyncio.timeout(20):
                await listed.wait()
                assert await small.fetchval("SELECT 1") == 1
        finally:
            release.set()
        async with asyncio.timeout(20):
            report = await passing
    assert report.ran and report.deleted == 1
