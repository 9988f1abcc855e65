"""A job's memory is limited by the kernel, in a cgroup of its own attempt: a job over its
limit is killed there (not a neighbour, not the runner) and fails as its own doing, the
reason naming the field to change; a job within it runs to the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import textwrap
from pathlib import Path

import pytest

from tests.integration.runner.conftest import (
    EventLog,
    StartRunner,
    grant,
    publish,
    upload_bundle,
    writable_cgroups,
)
from trainyard_platform.services.runner.cgroups import runner_folder
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.launch import sandbox_name
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import AllocationGranted, JobFailed, JobSucceeded
from trainyard_platform.shared.storage import open_store

_CGROUPS = writable_cgroups("memory")
OWN_MEMORY_CGROUP = _CGROUPS["memory"].own if _CGROUPS else None
"""The runner's own memory cgroup, where a root runner can make the jobs' cgroups."""
ON_V1 = bool(_CGROUPS) and _CGROUPS["memory"].version == 1
"""cgroup v1 does not say which OOM killer killed: the reason says the limit was reached,
and its advice is conditional (``cgroups.JobCgroup.memory_evidence``)."""

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        OWN_MEMORY_CGROUP is None,
        reason="jobs get cgroups only from a root runner on a host with a writable memory "
        "cgroup controller",
    ),
]

HOG = textwrap.dedent(
    """
    import sys
    size = int(sys.argv[1]) * 1024 * 1024
    block = bytearray(size)
    for i in range(0, size, 4096):  # touched page by page: each one is charged
        block[i] = 1
    print("allocated", sys.argv[1], "MiB")
    """
)


def hog(settings: Settings, folder: Path, mib: int, gpu: int, memory_gib: int) -> AllocationGranted:
    """A grant of GPU ``gpu`` to a job declaring ``memory_gib`` per GPU that allocates
    ``mib`` MiB."""
    folder.mkdir(exist_ok=True)
    (folder / "hog.py").write_text(HOG)
    code = upload_bundle(open_store(settings.storage.uri), "team-a", folder)
    granted = grant(settings.node_id, [str(mib)], entrypoint="hog", gpu_indices=[gpu], code=code)
    spec = granted.spec.model_copy(update={"memory_gib_per_gpu": memory_gib})
    return granted.model_copy(update={"spec": spec})


def attempt_cgroup(settings: Settings, allocation: AllocationGranted) -> Path:
    assert OWN_MEMORY_CGROUP is not None
    name = sandbox_name(allocation.allocation_id)
    return (
        OWN_MEMORY_CGROUP / "trainyard" / runner_folder(settings.node_id, settings.job_uids) / name
    )


async def test_a_job_over_its_declared_memory_is_killed_and_fails_naming_the_field(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    runner = await start_runner(settings)
    over = hog(settings, tmp_path / "hog", 2048, gpu=0, memory_gib=1)
    within = hog(settings, tmp_path / "hog", 64, gpu=1, memory_gib=1)
    await publish(bus, over, settings.node_id)
    await publish(bus, within, settings.node_id)

    failed = await events.first(JobFailed, over.job_id)
    assert failed.failure_kind == "out_of_memory"  # the job's own doing: not platform_error
    assert failed.reason == (
        "the job was killed by the kernel's OOM killer after its memory reached its limit of "
        "1 GiB (spec.memory_gib_per_gpu 1 x 1 GPU) (page cache counts; this node's cgroup v1 "
        "does not tell the limit's OOM killer from the node's): if it used more than its "
        "limit, declare more memory_gib_per_gpu, or use less memory"
        if ON_V1
        else "the job exceeded its memory limit of 1 GiB (spec.memory_gib_per_gpu 1 x 1 GPU) "
        "and was killed by the kernel; declare more memory_gib_per_gpu, or use less memory"
    )
    assert failed.exit_code == -9
    assert "allocated" not in failed.log_tail

    succeeded = await events.first(JobSucceeded, within.job_id)
    assert succeeded.allocation_id == within.allocation_id
    # Each attempt's cgroup goes once it has ended (just after its end is published).
    async with asyncio.timeout(30):
        while attempt_cgroup(settings, over).exists() or attempt_cgroup(settings, within).exists():
            await asyncio.sleep(0.05)
    # And the node's, once the runner has stopped (and the runners' folder when it was the
    # last: what made this process's cgroup could not remove it with a child).
    await runner.shutdown()
    node = attempt_cgroup(settings, over).parent
    assert not node.exists()
    assert not node.parent.exists() or any(p.is_dir() for p in node.parent.iterdir())


async def test_a_job_declaring_no_memory_is_limited_to_the_nodes_default(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    settings = settings.model_copy(update={"job_memory_gib_per_gpu": 0.25})
    await start_runner(settings)
    over = hog(settings, tmp_path / "hog", 512, gpu=0, memory_gib=0)
    await publish(bus, over, settings.node_id)

    failed = await events.first(JobFailed, over.job_id)
    assert failed.failure_kind == "out_of_memory"
    limit = (
        "limit of 0.25 GiB (spec.memory_gib_per_gpu is 0, so the node's "
        "TRAINYARD_RUNNER_JOB_MEMORY_GIB_PER_GPU, 0.25 GiB x 1 GPU)"
    )
    assert failed.reason.startswith(
        f"the job was killed by the kernel's OOM killer after its memory reached its {limit}"
        if ON_V1
        else f"the job exceeded its memory {limit}"
    )


SLEEPER = textwrap.dedent(
    """
    import time
    print("sleeping", flush=True)
    time.sleep(600)
    """
)


def pids_running(cgroup: Path, marker: bytes) -> list[int]:
    """The processes in ``cgroup`` whose command line holds ``marker``."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
    return pids


async def job_pids(cgroup: Path, marker: bytes) -> list[int]:
    """``pids_running``, once there are any."""
    async with asyncio.timeout(30):
        while not (pids := pids_running(cgroup, marker)):
            await asyncio.sleep(0.05)
    return pids


async def test_a_job_killed_by_someone_else_is_not_out_of_memory(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    # An operator's kill -9 (or another process of the uid): a SIGKILL the runner did not
    # send, but its cgroup counts no OOM kill, so the tenant is not told to raise memory.
    await start_runner(settings)
    folder = tmp_path / "sleeper"
    folder.mkdir()
    (folder / "sleeper.py").write_text(SLEEPER)
    code = upload_bundle(open_store(settings.storage.uri), "team-a", folder)
    granted = grant(settings.node_id, [], entrypoint="sleeper", gpu_indices=[0], code=code)
    await publish(bus, granted, settings.node_id)

    for pid in await job_pids(attempt_cgroup(settings, granted), b"sleeper"):
        os.kill(pid, signal.SIGKILL)

    failed = await events.first(JobFailed, granted.job_id)
    assert failed.exit_code == -9
    assert failed.failure_kind == "user_error"
    assert failed.reason == (
        "killed by SIGKILL, which the runner did not send; the job's cgroup recorded no "
        "out-of-memory kill"
    )
