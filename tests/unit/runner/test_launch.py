"""What a job is started with: its command, its environment, and whether it can run here."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainyard_platform.services.runner import checkpoints, disk_watch, launch
from trainyard_platform.services.runner.cgroups import CpuLimit, JobCgroup
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.environments import JobEnvironment
from trainyard_platform.services.runner.gpus import GpuInventory, virtual_inventory
from trainyard_platform.services.runner.sandbox import (
    JobUser,
    Sandbox,
    counts_against_node,
    failure_kind,
)
from trainyard_platform.shared.control import JobRuntimeEnv
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    GangMember,
    JobSpec,
)
from trainyard_platform.shared.storage import LocalStore

GRANT = AllocationGranted(
    allocation_id="alloc-1",
    job_id="job-1",
    node_id="node-a",
    gpu_indices=[0, 2],
    epoch=5,
    attempt=2,
    granted_at=datetime(2025, 1, 1, tzinfo=UTC),
    spec=JobSpec(
        name="digits",
        team="vision",
        user="alice",
        entrypoint="examples.digits_cnn",
        args=["--fast", "x y"],
        gpus=2,
        gpu_flavor="h200",
        hyperparameters={"lr": 0.01, "epochs": 3},
        seed=7,
        max_runtime_seconds=60,
        dataset="digits@v2",
    ),
)
ONE_GPU = GRANT.model_copy(update={"gpu_indices": [1]})
BOX = Sandbox(Path("/sandboxes/alloc-1"), JobUser(200_001, 200_001))
RANKS = BOX.rank_output
JOB_ENV = JobEnvironment(
    python="/envs/abc/bin/python",
    bin_dir=Path("/envs/abc/bin"),
    key="abc",
    packages=["tabulate==0.9.0"],
    cached=True,
    seconds=0.0,
)
H200 = GpuInventory(("H200",) * 4, "nvml", "12.4")
RUNNER_ENV = {
    "PATH": "/runner/bin:/usr/bin",
    "HOME": "/root",
    "TRAINYARD_RUNNER_NODE_ID": "node-a",
    "TRAINYARD_NATS_URL": "nats://secret:4222",
    "TRAINYARD_DATABASE_URL": "postgresql://user:password@db/x",
    "TRAINYARD_STORAGE_S3_SECRET_KEY": "sk",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "NCCL_SOCKET_IFNAME": "eth0",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}


def env_for(
    grant: AllocationGranted = GRANT, gpus: GpuInventory = H200, **overrides: object
) -> dict[str, str]:
    kwargs: dict[str, object] = {
        "passthrough": ["NCCL_SOCKET_IFNAME", "TRAINYARD_NATS_URL"],
        "gpus": gpus,
        "trace_headers": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        "base": RUNNER_ENV,
    }
    kwargs.update(overrides)
    return launch.job_env_vars(grant, BOX, JOB_ENV, **kwargs)  # type: ignore[arg-type]


def spec_with(**update: object) -> AllocationGranted:
    return ONE_GPU.model_copy(update={"spec": GRANT.spec.model_copy(update=update)})


def test_a_module_a_script_or_a_command_runs_with_its_args() -> None:
    python = "/envs/abc/bin/python"
    assert launch.job_argv(python, ONE_GPU, 29500, RANKS) == [
        python,
        "-m",
        "examples.digits_cnn",
        "--fast",
        "x y",
    ]
    script = spec_with(entrypoint="src/train.py")
    assert launch.job_argv(python, script, 29500, RANKS) == [
        python,
        "src/train.py",
        "--fast",
        "x y",
    ]
    command = spec_with(entrypoint="", command=["bash", "run.sh"])
    assert launch.job_argv(python, command, 29500, RANKS) == ["bash", "run.sh", "--fast", "x y"]
    assert launch.ranks(ONE_GPU) == ()  # one process: its output is kept as it is


def test_several_gpus_on_one_node_start_under_torchrun_standalone() -> None:
    argv = launch.job_argv("/py", GRANT, 29500, RANKS)
    assert argv[:5] == ["/py", "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    # Each process as torchrun would start it (python -u), its output to its rank's pipe.
    assert argv[5:] == [
        "--no-python",
        *launch.rank_argv(RANKS, ["/py", "-u", "-m", "examples.digits_cnn", "--fast", "x y"]),
    ]
    assert launch.ranks(GRANT) == (0, 1)
    script = GRANT.model_copy(update={"spec": GRANT.spec.model_copy(update={"entrypoint": "t.py"})})
    assert launch.job_argv("/py", script, 29500, RANKS)[5:] == [
        "--no-python",
        *launch.rank_argv(RANKS, ["/py", "-u", "t.py", "--fast", "x y"]),
    ]
    command = GRANT.model_copy(
        update={"spec": GRANT.spec.model_copy(update={"entrypoint": "", "command": ["./run.sh"]})}
    )
    assert launch.job_argv("/py", command, 29500, RANKS)[5:] == [
        "--no-python",
        *launch.rank_argv(RANKS, ["./run.sh", "--fast", "x y"]),
    ]


def test_a_gang_meets_at_rank_zeros_node_with_this_nodes_rank() -> None:
    gang = [
        GangMember(node_id="a", allocation_id="alloc-0", address="10.0.0.1", gpus=1, first_rank=0),
        GangMember(node_id="b", allocation_id="alloc-1", address="10.0.0.2", gpus=1, first_rank=1),
    ]
    grant = ONE_GPU.model_copy(update={"gang": gang})
    port = launch.rendezvous_port("job-1", 2)
    assert launch.rendezvous_port("job-1", 2) == port != launch.rendezvous_port("job-1", 3)
    assert launch.job_argv("/py", grant, port, RANKS) == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        "--nnodes=2",
        "--node_rank=1",
        "--master_addr=10.0.0.1",
        f"--master_port={port}",
        "--no-python",
        *launch.rank_argv(RANKS, ["/py", "-u", "-m", "examples.digits_cnn", "--fast", "x y"]),
    ]
    assert launch.ranks(grant) == (1,)  # its gang member's first rank on
    two_each = [m.model_copy(update={"gpus": 2, "first_rank": 2 * i}) for i, m in enumerate(gang)]
    assert launch.ranks(GRANT.model_copy(update={"gang": two_each})) == (2, 3)


def test_the_job_reads_its_context_back_from_its_environment() -> None:
    runtime = JobRuntimeEnv.from_env(env_for())
    assert runtime == JobRuntimeEnv(
        job_id="job-1",
        allocation_id="alloc-1",
        attempt=2,
        seed=7,
        hyperparameters={"lr": 0.01, "epochs": 3},
        checkpoint_uri=Path("/sandboxes/alloc-1/checkpoints").as_uri(),
        control_socket="/sandboxes/alloc-1/control.sock",
        dataset="digits@v2",
        gpu_indices=[0, 2],
    )


def test_the_job_environment_is_built_from_nothing_and_holds_no_credential() -> None:
    env = env_for()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PATH"].startswith("/envs/abc/bin:") and "/runner/bin" not in env["PATH"]
    assert env["HOME"] == "/sandboxes/alloc-1/home"
    assert env["TMPDIR"] == "/sandboxes/alloc-1/tmp"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0", "the operator let it through"
    assert env["TRACEPARENT"].startswith("00-111")
    platform_vars = {k for k in env if k.startswith("TRAINYARD_")}
    assert all(not k.startswith(("TRAINYARD_STORAGE", "TRAINYARD_NATS")) for k in platform_vars)
    assert "AWS_SECRET_ACCESS_KEY" not in env
    for value in env.values():
        assert "secret" not in value and "password" not in value and value != "sk"


def test_on_virtual_gpus_the_job_sees_no_cuda_device_and_no_trace_when_none() -> None:
    env = env_for(gpus=virtual_inventory(4), trace_headers={})
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "TRACEPARENT" not in env


@pytest.mark.parametrize(
    ("update", "reason", "kind"),
    [
        ({"entrypoint": "a b"}, "spec.entrypoint: 'a b' is neither a dotted module", "user_error"),
        ({"entrypoint": "../escape.py"}, "neither a dotted module", "user_error"),
        ({"entrypoint": "/abs/train.py"}, "neither a dotted module", "user_error"),
        ({"entrypoint": ""}, "spec.entrypoint: the spec names neither", "user_error"),
        ({"command": ["x"]}, "spec.command: the spec names both", "user_error"),
        ({"image": "pytorch/pytorch:2.5"}, "no container executor", "platform_error"),
    ],
)
def test_grants_that_can_never_run_here_say_why(
    update: dict[str, object], reason: str, kind: str
) -> None:
    # Before: every one was a platform_error, which the scheduler now retries: a spec at
    # fault would fail the same way on every retry. A node without an executor is the
    # platform's (another node may have one).
    assert launch.cannot_run(GRANT, H200) is None
    problem = launch.cannot_run(spec_with(**update), H200)
    assert problem is not None and reason in str(problem)
    assert failure_kind(problem) == kind
    # What the job asked for, an image included, is never held against the node.
    assert not counts_against_node(problem)


def test_grants_for_gpus_this_node_lacks_say_why() -> None:
    problem = launch.cannot_run(GRANT, virtual_inventory(2))
    assert problem is not None and "do not exist" in str(problem)
    assert failure_kind(problem) == "platform_error"
    assert counts_against_node(problem)  # the node's own GPUs


def test_job_logs_live_under_the_work_dir_whatever_the_ids(tmp_path: Path) -> None:
    assert launch.job_log_path(tmp_path, "job-1", "alloc-1") == tmp_path / "jobs/job-1/alloc-1.log"
    hostile = launch.job_log_path(tmp_path, "../..", "../../x")
    assert hostile.parent.parent == tmp_path / "jobs"


def _under_quota(cpus: float) -> Sandbox:
    cgroup = JobCgroup((), None, None, None, CpuLimit(cpus, "test"))
    return dataclasses.replace(BOX, cgroup=cgroup)


@pytest.mark.parametrize(
    ("cpus", "grant", "threads"),
    [(4.0, "one", "4"), (1.5, "one", "1"), (0.5, "one", "1"), (6.0, "two", "3"), (3.0, "two", "1")],
)
def test_a_job_under_a_cpu_quota_gets_as_many_threads_per_process_as_it_has_cpus(
    cpus: float, grant: str, threads: str
) -> None:
    granted = ONE_GPU if grant == "one" else GRANT
    assert len(granted.gpu_indices) == (1 if grant == "one" else 2)
    env = launch.job_env_vars(
        granted,
        _under_quota(cpus),
        JOB_ENV,
        passthrough=[],
        gpus=H200,
        trace_headers={},
        base=RUNNER_ENV,
    )
    assert env["OMP_NUM_THREADS"] == threads


def test_no_quota_sets_no_thread_count_and_the_operators_own_wins() -> None:
    assert "OMP_NUM_THREADS" not in env_for()  # no cgroup, no quota
    env = launch.job_env_vars(
        ONE_GPU,
        _under_quota(4.0),
        JOB_ENV,
        passthrough=["OMP_NUM_THREADS"],
        gpus=H200,
        trace_headers={},
        base={**RUNNER_ENV, "OMP_NUM_THREADS": "7"},
    )
    assert env["OMP_NUM_THREADS"] == "7"


def _spawn_error(argv: list[str], cwd: Path) -> OSError:
    try:
        subprocess.run(argv, cwd=cwd, env={"PATH": "/usr/bin:/bin"}, check=False)
    except OSError as exc:
        return exc
    raise AssertionError(f"{argv} started")


def test_a_program_of_the_jobs_own_code_that_cannot_run_is_the_jobs_input(tmp_path: Path) -> None:
    # Before: "could not start: [Errno 13] Permission denied: './train.sh'" was a
    # platform_error, retried on other nodes (where the same code fails the same way), each
    # failure counting towards that node's cordon.
    (tmp_path / "train.sh").write_text("#!/bin/sh\necho hi\n")  # not executable
    (tmp_path / "bad.sh").write_text("#!/no/such/interpreter\n")
    (tmp_path / "bad.sh").chmod(0o755)
    for program, why in (
        ("./train.sh", "Permission denied"),
        ("scripts/missing.sh", "No such file"),
        ("./bad.sh", "No such file"),
    ):
        spec = GRANT.spec.model_copy(update={"entrypoint": "", "command": [program, "--x"]})
        error = _spawn_error([program, "--x"], tmp_path)
        problem = launch.spawn_problem(spec, [program, "--x"], error)
        assert problem is not None and failure_kind(problem) == "user_error", program
        assert str(problem).startswith(f"spec.command: {program!r} cannot be run: "), problem
        assert why in str(problem)


def test_a_program_the_node_may_lack_stays_the_platforms_but_never_counts(
    tmp_path: Path,
) -> None:
    # A bare name is looked up on the node's PATH, an absolute path is the node's: a node
    # without it is not the job's fault, so it stays a platform_error (retried). Before:
    # spawn_problem said nothing of it (None), the agent reported "could not start: ..."
    # as the node's own failure, and a tenant's command naming no program cordoned every
    # node it was retried on. Now it names the field and is never held against the node.
    for argv in (["no-such-program"], ["/no/such/program"]):
        spec = GRANT.spec.model_copy(update={"entrypoint": "", "command": argv})
        problem = launch.spawn_problem(spec, argv, _spawn_error(argv, tmp_path))
        assert problem is not None and failure_kind(problem) == "platform_error", argv
        assert not counts_against_node(problem), argv
        assert str(problem).startswith(f"spec.command: {argv[0]!r} cannot be run on this node: ")
    # The job's interpreter (an entrypoint), or a spawn that failed otherwise, is the node's.
    argv = ["/envs/gone/bin/python", "-m", "examples.digits_cnn"]
    assert launch.spawn_problem(GRANT.spec, argv, _spawn_error(argv, tmp_path)) is None
    assert launch.spawn_problem(GRANT.spec, argv, RuntimeError("preexec")) is None


def test_a_checkpoint_over_the_jobs_disk_limit_fails_it_up_front_as_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job resumed from a checkpoint larger than its disk allowance
    (``TRAINYARD_RUNNER_JOB_DISK_GIB``) downloaded it whole into its sandbox before it ran,
    filling the disk. Its grant says its size: the job fails before the download, as
    ``user_error`` naming both sizes, and it never counts against the node."""
    store = LocalStore(tmp_path / "store")
    staging = tmp_path / "staging"
    data = b"w" * 4096
    folder = staging / "step-00000007"
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(data)
    manifest = {
        "step": 7,
        "object": "step-00000007/checkpoint.pt",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    job_store = LocalStore(tmp_path / "store" / checkpoints.job_prefix(GRANT.job_id))
    committed = checkpoints.commit_staged(staging, 7, job_store, attempt=1)
    grant = GRANT.model_copy(update={"resume": committed})
    box = tmp_path / "box"
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")
    small = Settings(job_disk_gib=1000 / disk_watch.GIB)  # 1000 bytes
    with pytest.raises(launch.JobInputError) as refused:
        launch.resume_from(grant, small, store, box)
    said = str(refused.value)
    assert "step 7" in said and "4096 bytes" in said and "TRAINYARD_RUNNER_JOB_DISK_GIB" in said
    assert failure_kind(refused.value) == "user_error"
    assert not counts_against_node(refused.value)
    assert not box.exists() or list(box.rglob("*.pt")) == []
    # Within the limit (or with none: 0) it is staged as ever.
    for roomy in (Settings(job_disk_gib=1.0), Settings(job_disk_gib=0)):
        ref = launch.resume_from(grant, roomy, store, box)
        assert ref is not None and ref.step == 7


def _committed(store: LocalStore, tmp_path: Path, step: int, data: bytes) -> CheckpointRef:
    staging = tmp_path / "staging"
    folder = staging / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(data)
    manifest = {
        "step": step,
        "object": f"step-{step:08d}/checkpoint.pt",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    job_store = LocalStore(store.root / checkpoints.job_prefix(GRANT.job_id))
    return checkpoints.commit_staged(staging, step, job_store, attempt=1)


def test_the_job_resumes_only_from_the_checkpoint_its_grant_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner took the newest complete folder under the job's prefix: another node's
    forged one, newer, with a manifest to match, was restored. Now the grant's checkpoint is
    (and none without one), whatever else the job's prefix holds."""
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")
    store = LocalStore(tmp_path / "store")
    committed = _committed(store, tmp_path, 7, b"mine")
    job_store = LocalStore(store.root / checkpoints.job_prefix(GRANT.job_id))
    forged = b"not the job's"
    job_store.put_bytes("step-00000900-a0009/checkpoint.pt", forged)
    job_store.put_bytes(
        "step-00000900-a0009/manifest.json",
        json.dumps(
            {
                "step": 900,
                "object": "step-00000900-a0009/checkpoint.pt",
                "size_bytes": len(forged),
                "sha256": hashlib.sha256(forged).hexdigest(),
            }
        ).encode(),
    )
    box = tmp_path / "box"
    grant = GRANT.model_copy(update={"resume": committed})
    assert launch.resume_from(grant, Settings(), store, box) == committed
    assert [p.parent.name for p in box.rglob("*.pt")] == ["step-00000007"]
    assert launch.resume_from(GRANT, Settings(), store, tmp_path / "fresh") is None
    assert not (tmp_path / "fresh").exists() or list((tmp_path / "fresh").rglob("*")) == []


def test_a_refused_checkpoint_fails_the_job_before_it_runs_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grant's checkpoint overwritten in the store (any node can write any key): the
    job fails as ``user_error`` (another attempt would be refused alike), the reason naming
    the step and the mismatch, never held against the node, and nothing else restored."""
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")
    store = LocalStore(tmp_path / "store")
    committed = _committed(store, tmp_path, 7, b"mine")
    job_store = LocalStore(store.root / checkpoints.job_prefix(GRANT.job_id))
    job_store.put_bytes("step-00000007-a0001/checkpoint.pt", b"evil")
    box = tmp_path / "box"
    with pytest.raises(launch.CheckpointRefused) as refused:
        launch.resume_from(GRANT.model_copy(update={"resume": committed}), Settings(), store, box)
    said = str(refused.value)
    assert said.startswith("checkpoint: ") and "step 7" in said and committed.sha256 in said
    assert failure_kind(refused.value) == "user_error"
    assert not counts_against_node(refused.value)
    assert not box.exists() or list(box.rglob("*.pt")) == []


@pytest.mark.parametrize(
    ("network", "nodes", "user", "available", "own"),
    [
        ("loopback", 1, JobUser(200_001, 200_001), True, True),
        ("host", 1, JobUser(200_001, 200_001), True, False),  # the operator's choice
        ("loopback", 2, JobUser(200_001, 200_001), True, False),  # ranks on other nodes
        ("loopback", 1, JobUser(None, None), True, False),  # a runner that is not root
        ("loopback", 1, JobUser(200_001, 200_001), False, False),  # no namespace here
    ],
)
def test_a_job_on_one_node_runs_in_a_network_of_its_own_where_one_can_be_made(
    monkeypatch: pytest.MonkeyPatch,
    network: str,
    nodes: int,
    user: JobUser,
    available: bool,
    own: bool,
) -> None:
    monkeypatch.setattr(launch.netns, "available", lambda: available)
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")
    gang = [
        GangMember(node_id=f"n{i}", allocation_id=f"a{i}", address="10.0.0.1", gpus=1, first_rank=i)
        for i in range(nodes)
    ]
    grant = ONE_GPU.model_copy(update={"gang": gang if nodes > 1 else []})
    settings = Settings(job_network=network)  # type: ignore[arg-type]
    assert launch.own_network(grant, settings, user) is own
