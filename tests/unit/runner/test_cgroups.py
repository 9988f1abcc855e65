"""The logic of job cgroups on a stand-in tree: where each controller is found (cgroup v1,
v2, both), the memory limit an attempt gets, the limits written, an OOM kill told apart,
and a runner that cannot have cgroups saying so once. The kernel's side (a job over its
limit killed, its end) is tests/integration/runner/test_memory_limits.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard_platform.services.runner import cgroups, domain
from trainyard_platform.services.runner.cgroups import (
    GIB,
    CpuLimit,
    Hierarchy,
    JobCgroup,
    MemoryLimit,
    NodeCgroups,
    cgroup_cpu_limit,
    cpu_limit,
    find_controllers,
    gpu_device_denials,
    memory_limit,
    node_cpus,
    node_memory_bytes,
    runner_folder,
)
from trainyard_platform.services.runner.sandbox import AsJob, JobUser

HYBRID_MOUNTINFO = """\
31 23 0:28 / {top} rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / {top}/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / {top}/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / {top}/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / {top}/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / {top}/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/65d64e67
1:cpu:/
0::/
"""


def test_a_hybrid_host_uses_its_v1_memory_pids_and_cpu_below_the_runners_own_cgroup(
    tmp_path: Path,
) -> None:
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    found = find_controllers(HYBRID_MOUNTINFO.format(top=tmp_path), HYBRID_CGROUP)
    assert found == {
        "memory": Hierarchy(1, tmp_path / "memory" / "process_api" / "65d64e67"),
        "pids": Hierarchy(1, tmp_path / "pids"),
        "cpu": Hierarchy(1, tmp_path / "cpu"),
    }


def test_a_v2_host_uses_the_controllers_its_own_cgroup_offers(tmp_path: Path) -> None:
    own = tmp_path / "system.slice" / "trainyard-runner.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = f"30 23 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    found = find_controllers(mountinfo, "0::/system.slice/trainyard-runner.service\n")
    assert found == {
        "memory": Hierarchy(2, own),
        "pids": Hierarchy(2, own),
        "cpu": Hierarchy(2, own),
    }

    # A runner that moved itself into its leaf still uses the cgroup above it.
    leaf = "0::/system.slice/trainyard-runner.service/trainyard-runner\n"
    assert find_controllers(mountinfo, leaf) == found

    (own / "cgroup.controllers").write_text("cpu io\n")  # memory not delegated to it
    only_cpu = find_controllers(mountinfo, "0::/system.slice/trainyard-runner.service\n")
    assert only_cpu == {"cpu": Hierarchy(2, own)}  # no memory: ``detect`` gives up


def test_a_mount_of_part_of_the_tree_is_followed_only_where_it_reaches_the_runner(
    tmp_path: Path,
) -> None:
    """In a container without a cgroup namespace the mount's root is the container's cgroup
    (``/docker/abc``): the runner's own cgroup is found below it, and a mount of another
    part of the tree is passed over."""
    mountinfo = (
        f"35 31 0:32 /docker/other {tmp_path}/elsewhere rw - cgroup cgroup rw,memory\n"
        f"36 31 0:32 /docker/abc {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
    )
    found = find_controllers(mountinfo, "4:memory:/docker/abc/runner\n")
    assert found == {"memory": Hierarchy(1, tmp_path / "memory" / "runner")}


def test_the_memory_limit_is_what_the_job_declares_else_the_nodes_default() -> None:
    declared = memory_limit(2, 2, None, 64 * GIB, 8)
    assert declared == MemoryLimit(4 * GIB, "spec.memory_gib_per_gpu 2 x 2 GPUs")
    assert declared.describe() == "4 GiB (spec.memory_gib_per_gpu 2 x 2 GPUs)"
    # Declared wins over the node's setting, and one GPU is "1 GPU".
    assert memory_limit(3, 1, 0, 64 * GIB, 8) == MemoryLimit(
        3 * GIB, "spec.memory_gib_per_gpu 3 x 1 GPU"
    )

    share = memory_limit(0, 2, None, 64 * GIB, 8)  # the node's memory over its GPUs
    assert share is not None and share.bytes == 16 * GIB
    assert "the node's memory divided by its GPUs, 8 GiB x 2 GPUs" in share.source
    assert "spec.memory_gib_per_gpu is 0" in share.source

    setting = memory_limit(0, 3, 0.5, 64 * GIB, 8)
    assert setting is not None and setting.bytes == 3 * GIB // 2
    assert "TRAINYARD_RUNNER_JOB_MEMORY_GIB_PER_GPU" in setting.source

    assert memory_limit(0, 2, 0, 64 * GIB, 8) is None  # 0: no limit
    node_without_gpus = memory_limit(0, 1, None, 8 * GIB, 0)
    assert node_without_gpus is not None and node_without_gpus.bytes == 8 * GIB


@pytest.mark.parametrize("version", [1, 2])
def test_a_runner_in_a_limited_cgroup_shares_out_no_more_than_its_limit(
    tmp_path: Path, version: int
) -> None:
    """In a container limited to 8 GiB on a larger host, the jobs' default share is of the
    8 GiB: their sum past it would bring the container's OOM killer onto the runner."""
    own = tmp_path / "outer" / "runner"
    own.mkdir(parents=True)
    node = NodeCgroups({"memory": Hierarchy(version, own)}, "node-a")  # type: ignore[arg-type]
    if version == 1:
        (own / "memory.stat").write_text(
            f"cache 0\nhierarchical_memory_limit {8 * GIB}\nhierarchical_memsw_limit 1\n"
        )
    else:
        (own / "memory.max").write_text("max\n")
        (own.parent / "memory.max").write_text(f"{8 * GIB}\n")
    assert node.memory_bytes() == min(8 * GIB, node_memory_bytes())
    unlimited = 9223372036854771712  # v1's "no limit"
    (own / "memory.stat").write_text(f"hierarchical_memory_limit {unlimited}\n")
    (own.parent / "memory.max").write_text("max\n")
    assert node.memory_bytes() == node_memory_bytes()


def v1_node(tmp_path: Path) -> NodeCgroups:
    memory, pids = tmp_path / "memory" / "own", tmp_path / "pids"
    return NodeCgroups({"memory": Hierarchy(1, memory), "pids": Hierarchy(1, pids)}, "node-a")


def test_an_attempts_v1_cgroups_get_its_memory_and_process_limits(tmp_path: Path) -> None:
    node = v1_node(tmp_path)
    node._set_up()
    cgroup = node.create("sb1", MemoryLimit(3 * GIB, "x"), 512)
    memory = tmp_path / "memory" / "own" / "trainyard" / "node-a" / "sb1"
    pids = tmp_path / "pids" / "trainyard" / "node-a" / "sb1"
    assert cgroup.folders == (memory, pids)
    assert (memory / "memory.limit_in_bytes").read_text() == str(3 * GIB)
    # This stand-in has no memory.memsw.limit_in_bytes: the cgroup is told not to swap.
    assert (memory / "memory.swappiness").read_text() == "0"
    assert (pids / "pids.max").read_text() == "512"
    assert cgroup.procs_files == (
        str(memory / "cgroup.procs").encode(),
        str(pids / "cgroup.procs").encode(),
    )


def test_an_attempts_v2_cgroup_gets_its_limits_and_no_swap(tmp_path: Path) -> None:
    own = tmp_path / "runner.service"
    hierarchy = Hierarchy(2, own)
    node = NodeCgroups({"memory": hierarchy, "pids": hierarchy}, "node-a")
    own.mkdir()
    node._set_up()
    for folder in (own, own / "trainyard", own / "trainyard" / "node-a"):
        assert (folder / "cgroup.subtree_control").read_text() == "+memory +pids"
    cgroup = node.create("sb1", MemoryLimit(GIB, "x"), 100)
    folder = own / "trainyard" / "node-a" / "sb1"
    assert cgroup.folders == (folder,)
    assert (folder / "memory.max").read_text() == str(GIB)
    assert (folder / "pids.max").read_text() == "100"
    no_limit = node.create("sb2", None, None)
    assert not (no_limit.folders[0] / "memory.max").exists()


V2_EVENTS = "low 0\nhigh 0\nmax {max}\noom {oom}\noom_kill {kills}\noom_group_kill 0\n"
V1_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
LIMIT_KILL = (
    "the job exceeded its memory limit of 4 GiB (spec.memory_gib_per_gpu 2 x 2 GPUs) and "
    "was killed by the kernel; declare more memory_gib_per_gpu, or use less memory"
)
LIMIT_REACHED_V1 = (
    "the job was killed by the kernel's OOM killer after its memory reached its limit of "
    "4 GiB (spec.memory_gib_per_gpu 2 x 2 GPUs) (page cache counts; this node's cgroup v1 "
    "does not tell the limit's OOM killer from the node's): if it used more than its limit, "
    "declare more memory_gib_per_gpu, or use less memory"
)


def job_cgroup(folder: Path, version: int, files: dict[str, str]) -> JobCgroup:
    """An attempt's cgroup whose memory folder is ``folder``, holding ``files``."""
    for name, text in files.items():
        (folder / name).write_text(text)
    limit = MemoryLimit(4 * GIB, "spec.memory_gib_per_gpu 2 x 2 GPUs")
    return JobCgroup((folder,), Hierarchy(version, folder), folder, limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "files", "expected"),
    [
        # v2: the limit's OOM killer was called (``oom``) and killed (``oom_kill``).
        (2, {"memory.events": V2_EVENTS.format(max=12, oom=1, kills=1)}, LIMIT_KILL),
        # The limit was hit and reclaimed from: nothing killed.
        (2, {"memory.events": V2_EVENTS.format(max=12, oom=0, kills=0)}, None),
        (2, {"memory.events": V2_EVENTS.format(max=0, oom=0, kills=0)}, None),
        # v1: a kill counted, the limit reached (failcnt). Page cache reclaimed at the limit
        # counts there too, and no v1 file says which OOM killer killed: the advice to
        # declare more memory is conditional.
        (
            1,
            {"memory.oom_control": V1_CONTROL.format(kills=1), "memory.failcnt": "7\n"},
            LIMIT_REACHED_V1,
        ),
        (1, {"memory.oom_control": V1_CONTROL.format(kills=0), "memory.failcnt": "7\n"}, None),
        # A kernel limiting memory+swap as well counts no failure: the peak is the limit.
        (
            1,
            {
                "memory.oom_control": V1_CONTROL.format(kills=1),
                "memory.failcnt": "0",
                "memory.memsw.failcnt": "0",
                "memory.max_usage_in_bytes": "67108864",
                "memory.limit_in_bytes": "67108864",
                "memory.memsw.max_usage_in_bytes": "67108864",
                "memory.memsw.limit_in_bytes": "67108864",
            },
            LIMIT_REACHED_V1,
        ),
    ],
)
def test_an_oom_kill_of_the_attempts_own_limit_names_the_limit_and_its_source(
    tmp_path: Path, version: int, files: dict[str, str], expected: str | None
) -> None:
    evidence = job_cgroup(tmp_path, version, files).memory_evidence()
    assert evidence == domain.MemoryEvidence(limit_kill=expected)


@pytest.mark.parametrize(
    ("version", "files"),
    [
        (2, {"memory.events": V2_EVENTS.format(max=0, oom=0, kills=1)}),
        (1, {"memory.oom_control": V1_CONTROL.format(kills=1), "memory.failcnt": "0\n"}),
        (
            1,
            {
                "memory.oom_control": V1_CONTROL.format(kills=1),
                "memory.failcnt": "0",
                "memory.max_usage_in_bytes": "1048576",
                "memory.limit_in_bytes": "67108864",
            },
        ),
    ],
)
def test_an_oom_kill_without_the_limit_reached_is_the_hosts(
    tmp_path: Path, version: int, files: dict[str, str]
) -> None:
    # The kernel counts in ``oom_kill`` the kills of any OOM killer, the host's too.
    evidence = job_cgroup(tmp_path, version, files).memory_evidence()
    assert evidence == domain.MemoryEvidence(host_oom_kill=True)
    unlimited = JobCgroup((tmp_path,), Hierarchy(version, tmp_path), tmp_path, None)  # type: ignore[arg-type]
    assert unlimited.memory_evidence() == domain.MemoryEvidence(host_oom_kill=True)


def test_an_attempt_without_memory_files_has_no_evidence(tmp_path: Path) -> None:
    assert job_cgroup(tmp_path, 2, {}).memory_evidence() is None
    assert job_cgroup(tmp_path, 1, {}).memory_evidence() is None
    # v1 before kernel 4.13 counts no kills: a limit reached (and perhaps reclaimed from)
    # is no evidence of one.
    old_kernel = {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "3"}
    assert job_cgroup(tmp_path, 1, old_kernel).memory_evidence() is None
    no_memory = JobCgroup((tmp_path,), None, None, None)
    assert no_memory.memory_evidence() is None


def test_a_job_its_cgroup_killed_fails_as_out_of_memory_not_the_platforms() -> None:
    why = "the job exceeded its memory limit of 1 GiB (spec.memory_gib_per_gpu 1 x 1 GPU)"
    memory = domain.MemoryEvidence(limit_kill=why)
    outcome = domain.decide_outcome(-9, None, "", memory=memory)
    assert outcome == domain.Outcome("failed", why, -9, "out_of_memory")
    # torchrun exits 1 when its worker is killed: the cgroup's word is the one kept.
    tail = "Root Cause (first observed failure):\n  rank      : 0\n  exitcode  : -9\n"
    assert domain.decide_outcome(1, None, tail, torchrun=True, memory=memory).reason == why
    # A job that recovered (a killed data-loader worker) and exited 0 succeeded.
    assert domain.decide_outcome(0, None, memory=memory).kind == "succeeded"
    stop = domain.StopRequest("revoked", "preempted")
    assert domain.decide_outcome(-9, stop, memory=memory).kind == "preempted"


def test_a_sigkill_its_cgroup_recorded_no_oom_kill_for_is_not_out_of_memory(
    tmp_path: Path,
) -> None:
    # An operator's kill -9, another process of the uid: the cgroup counts no OOM kill.
    cgroup = job_cgroup(tmp_path, 2, {"memory.events": V2_EVENTS.format(max=0, oom=0, kills=0)})
    outcome = domain.decide_outcome(-9, None, "", memory=cgroup.memory_evidence())
    assert outcome == domain.Outcome(
        "failed",
        "killed by SIGKILL, which the runner did not send; the job's cgroup recorded no "
        "out-of-memory kill",
        -9,
        "user_error",
    )
    # An out-of-memory error the job printed (CUDA's: no cgroup counts it) is still one.
    cuda = domain.decide_outcome(
        1, None, "torch.OutOfMemoryError: CUDA out of memory", memory=cgroup.memory_evidence()
    )
    assert cuda.failure_kind == "out_of_memory"


@pytest.mark.parametrize("exit_code", [-9, 1])
def test_an_oom_kill_by_the_host_is_never_the_platforms_nor_the_nodes(
    tmp_path: Path, exit_code: int
) -> None:
    # A tenant reaches the host's OOM killer at will, its own limit never reached: it
    # declares more memory than the node has (up to 16384 GiB per GPU), or allocates what
    # its cgroup does not count (pinned host memory). Blaming the node would give it free
    # retries billed to the platform and cordon a node other teams use; whether others
    # exhausted the node cannot be known, so it is the job's out of memory.
    cgroup = job_cgroup(tmp_path, 2, {"memory.events": V2_EVENTS.format(max=0, oom=0, kills=1)})
    outcome = domain.decide_outcome(exit_code, None, "", memory=cgroup.memory_evidence())
    assert (outcome.kind, outcome.failure_kind, outcome.node_fault) == (
        "failed",
        "out_of_memory",
        False,
    )
    assert "the node's kernel OOM killer killed a process of the job" in outcome.reason
    assert "not its own memory limit" in outcome.reason
    # Under torchrun the same, whatever the worker's exit.
    tail = "Root Cause (first observed failure):\n  rank      : 0\n  exitcode  : -9\n"
    torchrun = domain.decide_outcome(1, None, tail, torchrun=True, memory=cgroup.memory_evidence())
    assert (torchrun.failure_kind, torchrun.node_fault) == ("out_of_memory", False)


def test_a_sigkill_without_a_cgroup_to_ask_is_out_of_memory_said_as_a_guess() -> None:
    outcome = domain.decide_outcome(-9, None, "", memory=None)
    assert outcome == domain.Outcome(
        "failed",
        "killed by SIGKILL, likely out of memory: no cgroup to confirm",
        -9,
        "out_of_memory",
    )


def test_a_process_that_cannot_join_its_cgroup_never_runs(tmp_path: Path) -> None:
    """The join is the first thing before the program: failing, the spawn fails."""
    missing = JobCgroup((tmp_path / "gone",), None, None, None)
    marker = tmp_path / "ran"
    as_job = AsJob(JobUser(None, None), {}, cgroup=missing)
    with pytest.raises(subprocess.SubprocessError, match="preexec"):
        as_job.run([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], cwd=tmp_path, timeout=30)
    assert not marker.exists()


def test_a_runner_without_cgroups_says_so_once_and_runs_jobs_unlimited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert NodeCgroups.detect("node-a", as_root=False) is None
    mountinfo, cgroup = tmp_path / "mountinfo", tmp_path / "cgroup"
    mountinfo.write_text(f"39 31 0:36 / {tmp_path}/pids rw - cgroup cgroup rw,pids\n")
    cgroup.write_text("8:pids:/\n")
    assert (
        NodeCgroups.detect("node-a", mountinfo=mountinfo, proc_cgroup=cgroup, as_root=True) is None
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "the runner is not root" in warnings[0]
    assert "no memory cgroup controller" in warnings[1]
    assert all("run without memory and process limits" in w for w in warnings)


def test_the_cpu_limit_is_what_the_job_declares_else_the_nodes_default() -> None:
    declared = cpu_limit(4, 2, None, 64, 8)
    assert declared == CpuLimit(8.0, "spec.cpus_per_gpu 4 x 2 GPUs")
    assert declared.quota_us == 800_000
    assert declared.describe() == "8 CPUs (spec.cpus_per_gpu 4 x 2 GPUs)"
    assert cpu_limit(3, 1, 0, 64, 8) == CpuLimit(3.0, "spec.cpus_per_gpu 3 x 1 GPU")

    share = cpu_limit(0, 2, None, 2, 8)  # the node's CPUs over its GPUs: a quarter each
    assert share is not None and share.cpus == 0.5 and share.quota_us == 50_000
    assert share.source == (
        "spec.cpus_per_gpu is 0, so the node's CPUs divided by its GPUs, 0.25 x 2 GPUs"
    )
    setting = cpu_limit(0, 3, 1.5, 64, 8)
    assert setting is not None and setting.quota_us == 450_000
    assert "TRAINYARD_RUNNER_JOB_CPUS_PER_GPU, 1.5 x 3 GPUs" in setting.source
    assert cpu_limit(0, 2, 0, 64, 8) is None  # 0: no limit
    without_gpus = cpu_limit(0, 1, None, 16, 0)
    assert without_gpus is not None and without_gpus.cpus == 16
    assert CpuLimit(0.001, "x").quota_us == 1000  # the kernel's least quota


def test_an_attempts_cpu_quota_is_written_on_v1_and_v2(tmp_path: Path) -> None:
    v1 = NodeCgroups(
        {"memory": Hierarchy(1, tmp_path / "memory"), "cpu": Hierarchy(1, tmp_path / "cpu")},
        "node-a",
    )
    v1._set_up()
    assert v1.limits_cpu
    cgroup = v1.create("sb1", None, None, CpuLimit(2.5, "x"))
    folder = tmp_path / "cpu" / "trainyard" / "node-a" / "sb1"
    assert folder in cgroup.folders
    assert (folder / "cpu.cfs_period_us").read_text() == "100000"
    assert (folder / "cpu.cfs_quota_us").read_text() == "250000"
    unlimited = v1.create("sb2", None, None, None)
    assert not (unlimited.folders[1] / "cpu.cfs_quota_us").exists()

    own = tmp_path / "v2"
    own.mkdir()
    hierarchy = Hierarchy(2, own)
    v2 = NodeCgroups({"memory": hierarchy, "pids": hierarchy, "cpu": hierarchy}, "node-a")
    v2._set_up()
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    v2.create("sb1", None, None, CpuLimit(0.5, "x"))
    assert (own / "trainyard" / "node-a" / "sb1" / "cpu.max").read_text() == "50000 100000"


def test_a_missing_or_unwritable_cpu_controller_is_said_once_and_memory_still_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    mountinfo, cgroup = tmp_path / "mountinfo", tmp_path / "cgroup"
    (tmp_path / "memory").mkdir()
    mountinfo.write_text(f"35 31 0:32 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n")
    cgroup.write_text("4:memory:/\n")
    node = NodeCgroups.detect("node-a", mountinfo=mountinfo, proc_cgroup=cgroup, as_root=True)
    assert node is not None and not node.limits_cpu
    assert node.create("sb1", MemoryLimit(GIB, "x"), None, CpuLimit(1, "x")).folders == (
        tmp_path / "memory" / "trainyard" / "node-a" / "sb1",
    )

    (tmp_path / "cpu").write_text("")  # a file where the hierarchy should be: mkdir fails
    mountinfo.write_text(
        mountinfo.read_text() + f"32 31 0:29 / {tmp_path}/cpu rw - cgroup cgroup rw,cpu\n"
    )
    cgroup.write_text("4:memory:/\n1:cpu:/\n")
    node = NodeCgroups.detect("node-b", mountinfo=mountinfo, proc_cgroup=cgroup, as_root=True)
    assert node is not None and not node.limits_cpu
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert all(w.startswith("jobs run without a CPU quota: ") for w in warnings)
    assert "no cpu cgroup controller" in warnings[0]
    assert "its cgroups cannot be set up" in warnings[1]


def test_an_attempt_is_denied_the_device_files_of_the_nodes_other_gpus() -> None:
    assert gpu_device_denials((0, 1, 2, 3), [1, 3]) == ["c 195:0 rwm", "c 195:2 rwm"]
    # NVML's minors need not be the indices: GPU 0 is /dev/nvidia4 here.
    assert gpu_device_denials((4, 5, 6, 7), [0]) == ["c 195:5 rwm", "c 195:6 rwm", "c 195:7 rwm"]
    assert gpu_device_denials((0, 1), [0, 1]) == []
    assert gpu_device_denials((0, 1), []) == ["c 195:0 rwm", "c 195:1 rwm"]


def test_an_attempts_v1_devices_cgroup_gets_one_deny_rule_per_other_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple[Path, str]] = []
    real_write = cgroups._write

    def record(path: Path, value: str) -> None:  # the kernel takes one rule per write
        written.append((path, value))
        real_write(path, value)

    monkeypatch.setattr(cgroups, "_write", record)
    controllers = {
        "memory": Hierarchy(1, tmp_path / "memory"),
        "devices": Hierarchy(1, tmp_path / "devices"),
    }
    node = NodeCgroups(dict(controllers), "node-a", gpu_minors=(0, 1, 2))
    node._set_up()
    assert node.confines_gpus
    cgroup = node.create("sb1", None, None, None, [1])
    folder = tmp_path / "devices" / "trainyard" / "node-a" / "sb1"
    assert folder in cgroup.folders  # joined by every process of the attempt
    assert written == [
        (folder / "devices.deny", "c 195:0 rwm"),
        (folder / "devices.deny", "c 195:2 rwm"),
    ]
    # Virtual GPUs: no device files to confine, no devices cgroup made.
    virtual = NodeCgroups(dict(controllers), "node-b", gpu_minors=None)
    assert not virtual.confines_gpus
    assert virtual.hierarchies == [controllers["memory"]]


def test_a_gpu_node_without_the_v1_devices_controller_says_once_gpus_are_not_confined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    own = tmp_path / "runner.service"
    own.mkdir()
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    mountinfo, cgroup = tmp_path / "mountinfo", tmp_path / "cgroup"
    mountinfo.write_text(f"30 23 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n")
    cgroup.write_text("0::/runner.service\n")
    virtual = NodeCgroups.detect("node-a", mountinfo=mountinfo, proc_cgroup=cgroup, as_root=True)
    assert virtual is not None and caplog.records == []  # virtual GPUs: nothing to confine
    node = NodeCgroups.detect(
        "node-b", mountinfo=mountinfo, proc_cgroup=cgroup, as_root=True, gpu_minors=(0, 1)
    )
    assert node is not None and not node.confines_gpus and node.limits_cpu
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "GPU device files are not confined to each job's own GPUs: this host offers this "
        "process no devices cgroup controller (only the cgroup v1 devices controller is used; "
        "cgroup v2 needs an eBPF device program"
    )


def test_a_devices_allowlist_with_a_gpu_wildcard_is_said_once_and_not_relied_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In a container whose devices cgroup allows ``c 195:* rwm``, denying ``c 195:1`` would
    leave the wildcard whole: the runner does not claim a confinement it does not have."""
    caplog.set_level(logging.WARNING)
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "devices.list").write_text("c 1:3 rwm\nc 195:* rwm\n")
    controllers = {"memory": Hierarchy(1, tmp_path / "memory"), "devices": Hierarchy(1, devices)}
    node = NodeCgroups(dict(controllers), "node-a", gpu_minors=(0, 1))
    node._set_up()
    assert not node.confines_gpus
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "allows NVIDIA's devices by a wildcard (c 195:* rwm)" in warnings[0]

    # Allowing every device (a host's default), or single GPUs by name: deny rules hold.
    for listed in ("a *:* rwm\n", "c 1:3 rwm\nc 195:0 rwm\nc 195:1 rwm\n"):
        (devices / "devices.list").write_text(listed)
        node = NodeCgroups(dict(controllers), "node-a", gpu_minors=(0, 1))
        node._set_up()
        assert node.confines_gpus


@pytest.mark.parametrize("version", [1, 2])
def test_a_runner_under_a_cpu_quota_shares_out_and_grants_no_more_than_it(
    tmp_path: Path, version: int
) -> None:
    own = tmp_path / "outer" / "runner"
    own.mkdir(parents=True)
    node = NodeCgroups({"cpu": Hierarchy(version, own)}, "node-a")  # type: ignore[arg-type]
    if version == 1:
        (own / "cpu.cfs_quota_us").write_text("-1\n")
        (own / "cpu.cfs_period_us").write_text("100000\n")
        (own.parent / "cpu.cfs_quota_us").write_text("50000\n")  # an ancestor's: 1/2 CPU
        (own.parent / "cpu.cfs_period_us").write_text("100000\n")
    else:
        (own / "cpu.max").write_text("max 100000\n")
        (own.parent / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_limit(Hierarchy(version, own)) == 0.5  # type: ignore[arg-type]
    assert node.cpu_ceiling() == 0.5 and node.cpus() == 0.5
    capped = cpu_limit(4, 2, None, node.cpus(), 8, node.cpu_ceiling())
    assert capped == CpuLimit(
        0.5, "spec.cpus_per_gpu 4 x 2 GPUs, capped at the 0.5 CPUs of the runner's own cgroup"
    )
    within = cpu_limit(0, 2, 0.1, node.cpus(), 8, node.cpu_ceiling())
    assert within is not None and within.cpus == pytest.approx(0.2)
    assert within.quota_us == 20_000  # 0.1 x 2 is 0.2000...004: the float's last bit aside

    (own.parent / ("cpu.cfs_quota_us" if version == 1 else "cpu.max")).write_text(
        "-1\n" if version == 1 else "max 100000\n"
    )
    assert node.cpu_ceiling() is None and node.cpus() == node_cpus()


def test_two_runners_of_one_node_id_on_one_host_never_empty_each_others_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two local stacks on one host both name their node ``local-node-1`` and run under one
    own cgroup; each runner's folder is its node id and its first job uid (its host-wide
    claim), so the second to start does not remove the first's attempts (killing its jobs),
    while the same runner started again removes what its predecessor left."""
    removed: list[Path] = []
    monkeypatch.setattr(cgroups, "remove_cgroup", removed.append)
    mountinfo, cgroup = tmp_path / "mountinfo", tmp_path / "cgroup"
    (tmp_path / "memory").mkdir()
    mountinfo.write_text(f"35 31 0:32 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n")
    cgroup.write_text("4:memory:/\n")

    def started(folder: str) -> NodeCgroups:
        node = NodeCgroups.detect(folder, mountinfo=mountinfo, proc_cgroup=cgroup, as_root=True)
        assert node is not None
        return node

    first_folder = runner_folder("local-node-1", range(200_064, 200_096))
    second_folder = runner_folder("local-node-1", range(250_112, 250_144))
    running = started(first_folder).create("sb1", MemoryLimit(GIB, "x"), None, None).folders
    removed.clear()  # (an attempt's cgroup is made afresh: one left by that name goes first)
    started(second_folder)
    assert removed == [], "the second runner emptied the first's cgroups"
    started(first_folder)
    assert removed == list(running)
