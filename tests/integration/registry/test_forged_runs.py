"""Red team, third pass: a runner's reports about jobs it was never granted.

A runner's NATS user may publish ``job.*`` events for any job id (the subject cannot name
its node), and the registry believed a ``job.started`` whatever it said: a runner (its
credentials, or the host of one) could make up an allocation of any job and a spec naming
any team, then a checkpoint and a success, and the registry registered a model version in
that team's name from whatever object the runner named (the "zeroed weights" of issue 9),
put a run in the team's experiments, and took the made-up spec's team as the owner of the
job's metrics and record. The registry now believes a ``job.started`` only as the scheduler
granted it (job, node, attempt, epoch and spec), and a checkpoint or a success only of such
a run.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from tests.integration.registry.test_registry import (
    T0,
    grant_of,
    ref,
    spec,
    started,
    succeeded,
)
from trainyard_platform.services.registry import handlers as registry_handlers
from trainyard_platform.services.registry.domain import RunNotRecorded
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.shared.bus import Delivery, NotYet, Reject
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import CheckpointSaved
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


async def _apply(pool: asyncpg.Pool, store: ObjectStore, payload: Payload) -> None:
    handle = RegistryHandlers(store).consumer(pool)
    job = payload.job_id
    await handle([Delivery(Envelope.wrap(payload, source=owner(payload), subject=job))])


async def _count(pool: asyncpg.Pool, table: str, job: str) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE job_id = $1", job)
        return count


async def test_a_start_the_scheduler_never_granted_records_nothing(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    forged = started(job, "made-up", 0, spec("victim-model", "vision"))
    with pytest.raises(registry_handlers.NotGranted, match="made-up") as refused:
        await _apply(pool, store, forged)
    # Waited for past ack_wait before it is dead-lettered, as a grant held by a replica that
    # died comes back only then (billing's release and the registry's success alike).
    assert isinstance(refused.value, NotYet)
    with pytest.raises(RunNotRecorded, match="made-up"):  # retried, then dead-lettered
        await _apply(pool, store, succeeded(job, "made-up", ref(store, job, 1)))
    for table in ("runs", "tracked_jobs", "model_versions", "checkpoints"):
        assert await _count(pool, table, job) == 0, table


async def test_a_start_that_says_another_spec_than_its_grant_is_refused(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    genuine = started(job, f"a-{job}", 0, spec("mine", "speech"))
    await _apply(pool, store, grant_of(genuine))
    other_team = genuine.model_copy(update={"spec": spec("mine", "vision")})
    with pytest.raises(Reject, match="spec"):
        await _apply(pool, store, other_team)
    other_node = genuine.model_copy(update={"node_id": "node-z"})
    with pytest.raises(Reject, match="node"):
        await _apply(pool, store, other_node)
    assert await _count(pool, "runs", job) == 0
    await _apply(pool, store, genuine)
    assert await _count(pool, "runs", job) == 1


async def test_a_checkpoint_or_success_of_an_allocation_not_started_for_the_job_is_not_believed(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job, other = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    for name, team in ((job, "vision"), (other, "speech")):
        start = started(name, f"a-{name}", 0, spec(name, team))
        await _apply(pool, store, grant_of(start))
        await _apply(pool, store, start)
    # The other job's runner claims a checkpoint and a success of job's under its own run.
    theirs = ref(store, other, 7)
    saved = CheckpointSaved(
        job_id=job, allocation_id=f"a-{other}", epoch=1, checkpoint=theirs, saved_at=T0
    )
    with pytest.raises(Reject, match=f"a-{other}"):
        await _apply(pool, store, saved)
    with pytest.raises(Reject, match=f"a-{other}"):
        await _apply(pool, store, succeeded(job, f"a-{other}", theirs))
    assert await _count(pool, "checkpoints", job) == 0
    assert await _count(pool, "model_versions", job) == 0


async def test_a_success_naming_another_jobs_checkpoint_registers_nothing(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    victim, thief = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    start = started(thief, f"a-{thief}", 0, spec("stolen", "speech"))
    await _apply(pool, store, grant_of(start))
    await _apply(pool, store, start)
    # Its own runner says the job ended with the victim's checkpoint (another team's).
    await _apply(pool, store, succeeded(thief, f"a-{thief}", ref(store, victim, 3)))
    assert await _count(pool, "model_versions", thief) == 0
