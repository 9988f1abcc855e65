"""An object store that does not answer while a grant comes (MinIO hung: its server paused
with SIGSTOP) is no fault of the job: the runner waits it out and runs the job once the
store answers, instead of failing its attempt ("could not fetch code bundle", a
``platform_error``). It waits in the launch's own task, never in the node's consumer: a
cancel or a preemption of any job of the node, the one waiting included, is acted on while
the store is still away."""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.runner.conftest import (
    EventLog,
    StartRunner,
    grant,
    publish,
    upload_bundle,
)
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.services.runner.checkpoints import COPY_PREFIX, job_prefix
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationRevoked,
    CheckpointSaved,
    JobFailed,
    JobPreempted,
    JobStarted,
    JobSucceeded,
)
from trainyard_platform.shared.outages import OBJECT_STORE
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3 server of this module's own, since its test pauses it."""
    with S3Server(log_dir=tmp_path_factory.mktemp("s3-runner")) as server:
        yield server


async def test_a_grant_met_by_a_store_that_does_not_answer_runs_once_it_answers(
    s3: S3Server,
    settings: Settings,
    code_dir: Path,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
) -> None:
    storage = s3.storage_settings(f"s3://runner-{uuid.uuid4().hex[:12]}").model_copy(
        update={"s3_connect_timeout_seconds": 1.0, "s3_read_timeout_seconds": 1.0}
    )
    code = upload_bundle(open_store(storage.uri, storage), "team-a", code_dir)
    settings = settings.model_copy(update={"storage": storage})
    runner = await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)], code=code)

    s3.send_signal(signal.SIGSTOP)
    try:
        await publish(bus, allocation, settings.node_id)
        async with asyncio.timeout(60):  # each fetch gives up within a few seconds
            while not OBJECT_STORE.away:
                assert not events.of(JobFailed, allocation.job_id)
                await asyncio.sleep(0.1)
        # Waited out by the launch, not by the consumer: it goes on reading revocations.
        assert not runner.agent._bus.paused
    finally:
        s3.send_signal(signal.SIGCONT)

    done = await events.first(JobSucceeded, allocation.job_id, timeout=60)
    assert done.allocation_id == allocation.allocation_id
    assert events.of(JobFailed, allocation.job_id) == []


def revocation(allocation: AllocationGranted, reason: str) -> AllocationRevoked:
    return AllocationRevoked(
        allocation_id=allocation.allocation_id,
        job_id=allocation.job_id,
        node_id=allocation.node_id,
        epoch=allocation.epoch,
        reason=reason,
        grace_seconds=0.5,
    )


async def test_cancels_and_preemptions_are_acted_on_while_a_launch_waits_for_the_store(
    s3: S3Server,
    settings: Settings,
    code_dir: Path,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
) -> None:
    """The fetch of a grant's inputs waited out the outage inside the node's only consumer:
    a preemption of a job already running there, and a cancel of the job being fetched,
    waited for the store to come back (minutes, hours), holding the GPUs all along."""
    storage = s3.storage_settings(f"s3://runner-{uuid.uuid4().hex[:12]}").model_copy(
        update={"s3_connect_timeout_seconds": 1.0, "s3_read_timeout_seconds": 1.0}
    )
    code = upload_bundle(open_store(storage.uri, storage), "team-a", code_dir)
    settings = settings.model_copy(update={"storage": storage})
    runner = await start_runner(settings)
    running = grant(settings.node_id, ["ignore-term", str(launches)], code=code, gpu_indices=[0])
    waiting = grant(settings.node_id, ["succeed", str(launches)], code=code, gpu_indices=[1])
    await publish(bus, running, settings.node_id)
    await events.first(JobStarted, running.job_id)

    s3.send_signal(signal.SIGSTOP)
    try:
        await publish(bus, waiting, settings.node_id)
        async with asyncio.timeout(60):  # its fetch gives up within a few seconds
            while not OBJECT_STORE.away:
                await asyncio.sleep(0.1)
        await publish(bus, revocation(running, "preempted"), settings.node_id)
        preempted = await events.first(JobPreempted, running.job_id)
        assert preempted.reason == "preempted"
        await publish(bus, revocation(waiting, "cancelled"), settings.node_id)
        cancelled = await events.first(JobPreempted, waiting.job_id)
        assert cancelled.reason == "cancelled"
        assert cancelled.allocation_id == waiting.allocation_id
        assert OBJECT_STORE.away  # all of it while the store is still away
    finally:
        s3.send_signal(signal.SIGCONT)
    # The cancelled job never ran, not even once the store answered again.
    await runner.shutdown()
    assert events.of(JobStarted, waiting.job_id) == []
    assert events.of(JobSucceeded, waiting.job_id) == []
    assert not (launches / waiting.allocation_id).exists()


async def test_a_final_checkpoint_the_store_cannot_take_is_reported_never_passed_over(
    s3: S3Server,
    settings: Settings,
    code_dir: Path,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
) -> None:
    """A job whose final checkpoint could not be uploaded before its end gave up waiting
    (15 minutes of outage) succeeded with its previous checkpoint as its artifact: the
    registry registered the older weights as the model, and nothing said so. It now fails
    as the platform's error, naming both checkpoints, and is retried from the older one."""
    storage = s3.storage_settings(f"s3://runner-{uuid.uuid4().hex[:12]}").model_copy(
        update={"s3_connect_timeout_seconds": 1.0, "s3_read_timeout_seconds": 1.0}
    )
    code = upload_bundle(open_store(storage.uri, storage), "team-a", code_dir)
    settings = settings.model_copy(
        update={"storage": storage, "checkpoint_upload_wait_seconds": 3.0}
    )
    await start_runner(settings)
    job = grant(settings.node_id, ["checkpoint-twice", str(launches)], code=code)
    await publish(bus, job, settings.node_id)
    first = await events.first(CheckpointSaved, job.job_id)
    assert first.checkpoint.step == 1

    s3.send_signal(signal.SIGSTOP)
    try:
        (launches / "go").touch()  # the job stages step 2 and exits 0
        failed = await events.first(JobFailed, job.job_id, timeout=60)
    finally:
        s3.send_signal(signal.SIGCONT)
    assert failed.failure_kind == "platform_error"
    assert "checkpoint of step 2 could not be uploaded" in failed.reason
    assert "the latest uploaded is step 1" in failed.reason
    assert events.of(JobSucceeded, job.job_id) == []


async def test_a_checkpoint_reported_lost_is_not_in_the_store_when_its_upload_ends_late(
    s3: S3Server,
    settings: Settings,
    code_dir: Path,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The end's wait for the final checkpoint ran out and the job was told it was lost,
    but its upload went on in its thread: once the store answered, the upload finished and
    its manifest made it a checkpoint in the store, one the platform said it never had. The
    upload is now given up with the verdict: what landed after it is deleted, and no
    manifest is written."""
    storage = s3.storage_settings(f"s3://runner-{uuid.uuid4().hex[:12]}").model_copy(
        # Long enough that the upload waits for the store rather than failing: a slow one.
        update={"s3_connect_timeout_seconds": 1.0, "s3_read_timeout_seconds": 120.0}
    )
    code = upload_bundle(open_store(storage.uri, storage), "team-a", code_dir)
    settings = settings.model_copy(
        update={"storage": storage, "checkpoint_upload_wait_seconds": 3.0}
    )
    await start_runner(settings)
    job = grant(settings.node_id, ["checkpoint-twice", str(launches)], code=code)
    await publish(bus, job, settings.node_id)
    await events.first(CheckpointSaved, job.job_id)

    s3.send_signal(signal.SIGSTOP)
    try:
        with caplog.at_level(logging.ERROR, logger="trainyard_platform.services.runner"):
            (launches / "go").touch()  # the job stages step 2 and exits 0
            async with asyncio.timeout(60):  # the verdict, 3 s after the job's end
                while not any("left unuploaded" in r.getMessage() for r in caplog.records):
                    await asyncio.sleep(0.1)
        # Its upload still under way: the store has not answered since.
        copies = list((settings.work_dir / "jobs").glob(f"*/{COPY_PREFIX}*"))
        assert copies
    finally:
        s3.send_signal(signal.SIGCONT)
    failed = await events.first(JobFailed, job.job_id, timeout=60)
    assert "its checkpoint of step 2 was still uploading" in failed.reason
    assert "the latest uploaded is step 1" in failed.reason

    async with asyncio.timeout(120):  # the store answers: the upload ends in its thread
        while any(copy.exists() for copy in copies):
            await asyncio.sleep(0.1)
    store = open_store(f"{storage.uri}/{job_prefix(job.job_id)}", storage)
    assert [k for k in store.list("step-") if k.startswith("step-00000002")] == []
    assert [e.checkpoint.step for e in events.of(CheckpointSaved, job.job_id)] == [1]
