"""A parent version cannot vanish under a job: from the moment the registry hears of a job
naming it as ``parent_model`` (its ``job.submitted``: admitted, still waiting) until the job
ends, deleting that version answers 409 naming the job. Before, only a running job kept its
parent: one deleted while the job waited (between admission and start) was gone when the
job started, which then fine-tuned from nothing."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg
import pytest

from tests.integration.registry.modelkit import VISION, app_as, apply
from tests.integration.registry.test_lineage import run_job
from tests.integration.registry.test_registry import T0, ref, spec, started, succeeded
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobCancelled,
    JobCancelRequested,
    JobSubmitted,
)
from trainyard_platform.shared.events.trust import REGISTRY, forged_because, nats_subject_for
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


async def test_a_version_a_waiting_job_fine_tunes_from_cannot_be_deleted_until_it_ends(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    base = f"base-{tag}"
    await run_job(pool, store, base)
    parent = f"/v1/models/vision/{base}/versions/1"
    waiting, cancelled = str(uuid.uuid4()), str(uuid.uuid4())
    tuned = spec(f"tuned-{tag}").model_copy(update={"parent_model": f"vision/{base}:1"})
    for job in (waiting, cancelled):
        await apply(pool, store, job, JobSubmitted(job_id=job, spec=tuned, submitted_at=T0))

    # Admitted, not started: the race. The parent stays, and the refusal names both jobs.
    async with app_as(pool, store, VISION) as vision:
        refused = await vision.delete(parent)
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert f"waiting job {waiting} (admitted, not started)" in detail
        assert f"waiting job {cancelled} (admitted, not started)" in detail

    # One is cancelled while it waits; the other is granted, starts, and succeeds.
    await apply(pool, store, cancelled, JobCancelled(job_id=cancelled, reason="by alice"))
    allocation = f"a-{waiting}"
    grant = AllocationGranted(
        allocation_id=allocation,
        job_id=waiting,
        node_id="node-a",
        gpu_indices=[0],
        epoch=1,
        attempt=0,
        granted_at=T0 + timedelta(minutes=1),
        spec=tuned,
    )
    await apply(pool, store, waiting, grant)
    async with app_as(pool, store, VISION) as vision:
        refused = await vision.delete(parent)
        assert refused.status_code == 409, refused.text
        assert f"waiting job {waiting} (admitted, not started)" in refused.json()["detail"]
        assert cancelled not in refused.json()["detail"]
    await apply(pool, store, waiting, started(waiting, allocation, 0, tuned))
    async with app_as(pool, store, VISION) as vision:
        refused = await vision.delete(parent)
        assert refused.status_code == 409 and f"running job {waiting}" in refused.text
    await apply(pool, store, waiting, succeeded(waiting, allocation, ref(store, waiting, 3)))
    async with app_as(pool, store, VISION) as vision:
        # Ended: its own version (a live child) is what keeps the parent now.
        assert f"vision/tuned-{tag} v1" in (await vision.delete(parent)).text
        assert (await vision.delete(f"/v1/models/vision/tuned-{tag}/versions/1")).is_success
        assert (await vision.delete(parent)).status_code == 200


async def test_a_job_that_ended_before_the_registry_heard_of_it_keeps_no_parent(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """The registry's deliveries need not come in the order they were published: a job's
    ``job.cancelled`` (or a late redelivery of its ``job.submitted`` or grant) may be handled
    before the event naming its parent. A job that ended before the registry heard of it
    keeps nothing; before, its parent could never be deleted again ("waiting job ...")."""
    tag = uuid.uuid4().hex[:6]
    base = f"base-{tag}"
    await run_job(pool, store, base)
    parent = f"/v1/models/vision/{base}/versions/1"
    tuned = spec(f"tuned-{tag}").model_copy(update={"parent_model": f"vision/{base}:1"})
    cancelled, granted = str(uuid.uuid4()), str(uuid.uuid4())
    for job in (cancelled, granted):
        await apply(pool, store, job, JobCancelled(job_id=job, reason="by alice"))
    await apply(pool, store, cancelled, JobSubmitted(job_id=cancelled, spec=tuned, submitted_at=T0))
    grant = AllocationGranted(
        allocation_id=f"a-{granted}",
        job_id=granted,
        node_id="node-a",
        gpu_indices=[0],
        epoch=1,
        attempt=0,
        granted_at=T0,
        spec=tuned,
    )
    await apply(pool, store, granted, grant)
    async with app_as(pool, store, VISION) as vision:
        deleted = await vision.delete(parent)
        assert deleted.status_code == 200, deleted.text


async def test_a_job_s_parent_is_the_version_admitted_not_one_made_again_under_its_name(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Submission admits ``vision/base:1`` and puts that version's id in the spec; the
    version and its model are deleted and the model made again (a new ``v1``) before the
    registry hears ``job.submitted``. The job's parent is the version admitted (its
    tombstone), never the new ``v1``, which stays free to delete. Before, the registry
    looked ``vision/base:1`` up by name when it heard of the job and recorded the new model's
    version: lineage to weights the job never used, and the new ``v1`` held for the job."""
    tag = uuid.uuid4().hex[:6]
    base = f"base-{tag}"
    await run_job(pool, store, base)

    async def v1_id() -> str:
        async with pool.acquire() as conn:
            found = await conn.fetchval(
                "SELECT v.id FROM model_versions v JOIN models m ON m.id = v.model_id "
                "WHERE m.team = 'vision' AND m.name = $1 AND m.deleted_at IS NULL "
                "AND v.version = 1",
                base,
            )
        return str(found)

    admitted = await v1_id()
    async with app_as(pool, store, VISION) as vision:
        for path in (f"{base}/versions/1", base):
            assert (await vision.delete(f"/v1/models/vision/{path}")).status_code == 200
    await run_job(pool, store, base)
    made_again = await v1_id()
    assert made_again != admitted

    job, forged = str(uuid.uuid4()), str(uuid.uuid4())
    tuned = spec(f"tuned-{tag}").model_copy(
        update={"parent_model": f"vision/{base}:1", "parent_model_version_id": admitted}
    )
    await apply(pool, store, job, JobSubmitted(job_id=job, spec=tuned, submitted_at=T0))
    # An id that is not the version the reference names is no parent at all.
    other = tuned.model_copy(update={"parent_model": f"vision/tuned-{tag}:1"})
    await apply(pool, store, forged, JobSubmitted(job_id=forged, spec=other, submitted_at=T0))
    async with pool.acquire() as conn:
        parents = {
            r["job_id"]: str(r["parent_version_id"])
            for r in await conn.fetch(
                "SELECT job_id, parent_version_id FROM job_parents WHERE job_id = ANY($1)",
                [job, forged],
            )
        }
    assert parents == {job: admitted}
    async with app_as(pool, store, VISION) as vision:
        gone = await vision.delete(f"/v1/models/vision/{base}/versions/1")
        assert gone.status_code == 200, gone.text


async def test_a_job_whose_parent_was_deleted_before_the_registry_heard_of_it_is_cancelled(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Submission admits a job fine-tuning from ``vision/base:1`` (its id pinned); the
    version is deleted before the registry hears the job's ``job.submitted``, so nothing
    held it. Before, the registry recorded the job as the tombstone's child and logged it:
    the job was scheduled, ran, and failed when it fetched a parent that was gone, or
    trained from nothing its lineage could name. The registry now asks for the job's
    cancellation (``job.cancel_requested``, on its own subject, which the bus believes of
    the registry alone), the reason naming the deleted version; once. A job that had ended
    already is left alone."""
    tag = uuid.uuid4().hex[:6]
    base = f"base-{tag}"
    await run_job(pool, store, base)
    async with pool.acquire() as conn:
        admitted = await conn.fetchval(
            "SELECT v.id FROM model_versions v JOIN models m ON m.id = v.model_id "
            "WHERE m.team = 'vision' AND m.name = $1 AND v.version = 1",
            base,
        )
    tuned = spec(f"tuned-{tag}").model_copy(
        update={"parent_model": f"vision/{base}:1", "parent_model_version_id": str(admitted)}
    )
    async with app_as(pool, store, VISION) as vision:
        assert (await vision.delete(f"/v1/models/vision/{base}/versions/1")).status_code == 200
    orphan, ended = str(uuid.uuid4()), str(uuid.uuid4())
    await apply(pool, store, ended, JobCancelled(job_id=ended, reason="by alice"))
    for job in (orphan, ended):
        submitted = JobSubmitted(job_id=job, spec=tuned, submitted_at=T0)
        await apply(pool, store, job, submitted)
        await apply(pool, store, job, submitted.model_copy())  # heard again: asked once
    grant = AllocationGranted(
        allocation_id=f"a-{orphan}",
        job_id=orphan,
        node_id="node-a",
        gpu_indices=[0],
        epoch=1,
        attempt=0,
        granted_at=T0,
        spec=tuned,
    )
    await apply(pool, store, orphan, grant)

    rows = await pool.fetch(
        "SELECT subject, convert_from(body, 'UTF8')::jsonb AS event FROM outbox "
        "WHERE convert_from(body, 'UTF8')::jsonb->>'type' = $1 ORDER BY seq",
        JobCancelRequested.TYPE,
    )
    asked = [r for r in rows if r["event"]["data"]["job_id"] in (orphan, ended)]
    assert [r["event"]["data"]["job_id"] for r in asked] == [orphan]
    (request,) = asked
    event = request["event"]
    assert event["source"] == REGISTRY and event["data"]["team"] == "vision"
    assert event["data"]["reason"].startswith(
        f"its parent model version vision/{base}:1 was deleted after the job was admitted"
    )
    subject = nats_subject_for(event["type"], event["source"], event["subject"])
    assert subject == f"{JobCancelRequested.TYPE}.by-registry"
    assert forged_because(event["type"], REGISTRY, subject=subject, routing_key=orphan) is None
    # The edge stays the tombstone's: the job was admitted as that version's child.
    async with pool.acquire() as conn:
        parent = await conn.fetchval(
            "SELECT parent_version_id FROM job_parents WHERE job_id = $1", orphan
        )
    assert parent == admitted
