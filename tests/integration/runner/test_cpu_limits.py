"""A job's CPU is limited by the kernel, in a cgroup of its own attempt: its quota is what it
declares (``cpus_per_gpu`` x its GPUs), else the node's default. The job itself reads its
cgroup (``/proc/self/cgroup``) and the quota there, so the test sees what the job is under;
no timing is measured (a quota throttles, it does not kill)."""

from __future__ import annotations

import json
import textwrap
import uuid
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
from trainyard_platform.services.runner.cgroups import (
    Hierarchy,
    NodeCgroups,
    cpu_limit,
    runner_folder,
)
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.launch import sandbox_name
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import AllocationGranted, JobSucceeded
from trainyard_platform.shared.storage import open_store

_CGROUPS = writable_cgroups("memory", "cpu")
CPU = _CGROUPS["cpu"] if _CGROUPS else None
"""Where a root runner makes the jobs' cpu cgroups (None: it cannot)."""

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CPU is None,
        reason="jobs get CPU quotas only from a root runner on a host with writable memory "
        "and cpu cgroup controllers",
    ),
]

# The job reports its own cpu cgroup (relative to the hierarchy's root) and its quota.
REPORT = textwrap.dedent(
    """
    import json, sys
    mount, out = sys.argv[1], sys.argv[2]
    for line in open("/proc/self/cgroup"):
        ident, names, path = line.rstrip("\\n").split(":", 2)
        if ident != "0" and "cpu" in names.split(","):
            folder = mount + path
            files = ("cpu.cfs_period_us", "cpu.cfs_quota_us")
        elif ident == "0" and names == "":
            folder = mount + path
            files = ("cpu.max",)
        else:
            continue
        quota = {f: open(folder + "/" + f).read().strip() for f in files}
        json.dump({"path": path, "quota": quota}, open(out, "w"))
        break
    """
)


def report(
    settings: Settings, folder: Path, out: Path, gpu: int, cpus_per_gpu: int
) -> AllocationGranted:
    assert CPU is not None
    folder.mkdir(exist_ok=True)
    (folder / "report.py").write_text(REPORT)
    code = upload_bundle(open_store(settings.storage.uri), "team-a", folder)
    # The hierarchy's mount point: the runner's own cgroup is below it by the path it shows.
    mount = str(CPU.own).removesuffix(own_cgroup_path())
    granted = grant(
        settings.node_id, [mount, str(out)], entrypoint="report", gpu_indices=[gpu], code=code
    )
    spec = granted.spec.model_copy(update={"cpus_per_gpu": cpus_per_gpu})
    return granted.model_copy(update={"spec": spec})


def own_cgroup_path() -> str:
    """This process's cgroup in the cpu hierarchy, as ``/proc/self/cgroup`` shows it."""
    assert CPU is not None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        ident, names, path = line.split(":", 2)
        if (CPU.version == 1 and "cpu" in names.split(",")) or (CPU.version == 2 and ident == "0"):
            return path.rstrip("/")
    raise AssertionError("no cpu cgroup")


async def test_a_jobs_cgroup_has_the_cpu_quota_it_declares_else_the_nodes_default(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
    launches: Path,
) -> None:
    assert CPU is not None
    settings = settings.model_copy(update={"job_cpus_per_gpu": 0.5})
    await start_runner(settings)
    declared = report(settings, tmp_path / "job", launches / "declared", gpu=0, cpus_per_gpu=2)
    default = report(settings, tmp_path / "job", launches / "default", gpu=1, cpus_per_gpu=0)
    await publish(bus, declared, settings.node_id)
    await publish(bus, default, settings.node_id)
    await events.first(JobSucceeded, declared.job_id)
    await events.first(JobSucceeded, default.job_id)

    for allocation, out, quota in (
        (declared, "declared", 200_000),  # 2 CPUs per GPU x 1 GPU
        (default, "default", 50_000),  # TRAINYARD_RUNNER_JOB_CPUS_PER_GPU 0.5 x 1 GPU
    ):
        seen = json.loads((launches / out).read_text())
        name = sandbox_name(allocation.allocation_id)
        folder = runner_folder(settings.node_id, settings.job_uids)
        assert seen["path"] == f"{own_cgroup_path()}/trainyard/{folder}/{name}"
        if CPU.version == 1:
            assert seen["quota"] == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(quota)}
        else:
            assert seen["quota"] == {"cpu.max": f"{quota} 100000"}


def test_a_runner_under_a_cpu_quota_caps_its_jobs_quotas_at_it() -> None:
    """In a container (here: a cgroup made by the test) limited to 2/3 of a CPU, a job
    declaring 4 CPUs gets the container's 2/3: cgroup v1 refuses a child a quota over its
    parent's (EINVAL), which would fail every such attempt as the platform's."""
    assert CPU is not None
    own = CPU.own / f"test-{uuid.uuid4().hex[:8]}"
    own.mkdir()
    try:
        if CPU.version == 1:
            (own / "cpu.cfs_period_us").write_text("3000")
            (own / "cpu.cfs_quota_us").write_text("2000")
        else:
            (own / "cpu.max").write_text("2000 3000")
        node = NodeCgroups({"cpu": Hierarchy(CPU.version, own)}, "node-a")
        node._set_up()
        assert node.cpu_ceiling() == pytest.approx(2 / 3)
        limit = cpu_limit(4, 1, None, node.cpus(), 1, node.cpu_ceiling())
        assert limit is not None and limit.quota_us == 66666
        assert limit.source.endswith(", capped at the 0.666667 CPUs of the runner's own cgroup")
        cgroup = node.create("sb1", None, None, limit)
        name = "cpu.cfs_quota_us" if CPU.version == 1 else "cpu.max"
        assert (cgroup.folders[0] / name).read_text().split()[0] == "66666"
        cgroup.remove()
        node.close()
    finally:
        for folder in (own / "trainyard" / "node-a", own / "trainyard", own):
            if folder.exists():
                folder.rmdir()
