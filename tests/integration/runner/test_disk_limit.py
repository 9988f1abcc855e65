"""A job's disk limit (``TRAINYARD_RUNNER_JOB_DISK_GIB``): the runner measures the job's
sandbox every few seconds and stops a job over it, which fails as ``user_error`` naming the
limit; a job within it runs to its end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.runner.conftest import EventLog, StartRunner, grant, publish, upload_bundle
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import JobFailed, JobSucceeded
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration

WRITER = """\
import os, sys, time
mib, then = int(sys.argv[1]), sys.argv[2]
with open(os.path.join(os.environ["TMPDIR"], "data"), "wb") as out:
    for _ in range(mib):
        out.write(os.urandom(1024 * 1024))
    out.flush()
    os.fsync(out.fileno())
time.sleep(60 if then == "wait" else 1)
"""


async def test_a_job_over_its_disk_limit_is_stopped_and_one_within_it_succeeds(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, tmp_path: Path
) -> None:
    # Before: no limit at all; the 20 MiB job waited out its max runtime with its writes kept,
    # as one writing without end would have filled the disk of the runner's ledger and logs.
    settings = settings.model_copy(update={"job_disk_gib": 0.01, "job_disk_check_seconds": 0.2})
    await start_runner(settings)
    code_folder = tmp_path / "writer"
    code_folder.mkdir()
    (code_folder / "write.py").write_text(WRITER)
    code = upload_bundle(open_store(settings.storage.uri), "team-a", code_folder)
    over = grant(settings.node_id, ["20", "wait"], entrypoint="write.py", code=code)
    within = grant(
        settings.node_id, ["1", "exit"], entrypoint="write.py", code=code, gpu_indices=[0]
    )
    await publish(bus, over, settings.node_id)
    await publish(bus, within, settings.node_id)

    failed = await events.first(JobFailed, over.job_id, timeout=30)
    assert failed.failure_kind == "user_error"
    assert failed.reason.startswith("the job wrote 0.0")
    assert failed.reason.endswith(
        " GiB to its sandbox, over its disk limit of 0.01 GiB (TRAINYARD_RUNNER_JOB_DISK_GIB)"
    )
    await events.first(JobSucceeded, within.job_id, timeout=30)


async def test_code_over_the_disk_limit_fails_the_job_before_it_starts(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
    launches: Path,
    code_dir: Path,
) -> None:
    """What the steps before the job write to its sandbox (its code here) counts against its
    limit from the moment the sandbox exists. Before, the sandbox was first measured once
    the job ran: a job whose code alone was over its limit ran (and one ending before the
    first measurement succeeded), and a repository of any size filled the node's disk."""
    settings = settings.model_copy(update={"job_disk_gib": 0.01})
    await start_runner(settings)
    (code_dir / "weights.bin").write_bytes(os.urandom(20 * 1024 * 1024))
    code = upload_bundle(open_store(settings.storage.uri), "team-a", code_dir)
    job = grant(settings.node_id, ["succeed", str(launches)], code=code)
    await publish(bus, job, settings.node_id)

    failed = await events.first(JobFailed, job.job_id, timeout=60)
    assert failed.failure_kind == "user_error"
    assert failed.reason.startswith("before the job started, the job wrote 0.0")
    assert failed.reason.endswith(
        " GiB to its sandbox, over its disk limit of 0.01 GiB (TRAINYARD_RUNNER_JOB_DISK_GIB)"
    )
    assert not (launches / job.allocation_id).exists(), "the job never ran"
    assert events.of(JobSucceeded, job.job_id) == []
