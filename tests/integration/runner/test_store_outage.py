"""An object store that does not answer while a grant comes (MinIO hung: its server paused
with SIGSTOP) is no fault of the job: the runner waits it out and runs the job once the
store answers, instead of failing its attempt ("could not fetch code bundle", a
``platform_error``)."""

from __future__ import annotations

import asyncio
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
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import JobFailed, JobSucceeded
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
            while not runner.agent._bus.paused:
                assert not events.of(JobFailed, allocation.job_id)
                await asyncio.sleep(0.1)
        assert "object store unreachable" in next(iter(runner.agent._bus.paused.values()))
    finally:
        s3.send_signal(signal.SIGCONT)

    done = await events.first(JobSucceeded, allocation.job_id, timeout=60)
    assert done.allocation_id == allocation.allocation_id
    assert events.of(JobFailed, allocation.job_id) == []
