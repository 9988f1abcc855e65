"""Executors: the exact argv each would spawn. No container engine on CI, so the container
executor is checked up to the command it would run."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard_platform.services.runner.executors import (
    ContainerExecutor,
    Executor,
    LaunchRequest,
    ProcessExecutor,
    container_name,
)


def launch(**changes: object) -> LaunchRequest:
    fields: dict[str, object] = {
        "command": ["python", "-m", "pkg.train", "--epochs", "3"],
        "workdir": Path("/srv/jobs/j1/code"),
        "scratch": Path("/srv/jobs/j1/scratch"),
        "env": {"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "0,2", "A": "x y=z"},
        "gpu_indices": [0, 2],
        "uid": 1500,
        "gid": 1500,
        "name": "alloc-7",
        "image": "registry.example/train:1.0",
    }
    fields.update(changes)
    return LaunchRequest(**fields)  # type: ignore[arg-type]


COMMON = [
    "--network", "host",
    "--read-only",
    "--tmpfs", "/tmp:rw,nosuid,nodev,size=8g",
    "--shm-size", "8g",
    "--security-opt", "no-new-privileges",
    "--cap-drop", "ALL",
    "--pids-limit", "4096",
    "-v", "/srv/jobs/j1/code:/workspace/code:ro",
    "-v", "/srv/jobs/j1/scratch:/workspace/scratch:rw",
    "-w", "/workspace/code",
]  # fmt: skip


def test_the_process_executor_runs_the_command_unchanged() -> None:
    executor: Executor = ProcessExecutor()
    request = launch(image=None)
    argv = executor.argv(request)
    assert argv == ["python", "-m", "pkg.train", "--epochs", "3"]
    assert argv is not request.command


def test_docker_run_for_two_gpus() -> None:
    executor: Executor = ContainerExecutor("docker")
    assert executor.argv(launch()) == [
        "docker", "run", "--rm", "--name", "trainyard-alloc-7",
        "--gpus", '"device=0,2"',
        "--user", "1500:1500",
        *COMMON,
        "-e", "A=x y=z",
        "-e", "CUDA_VISIBLE_DEVICES=0,1",  # renumbered inside the container
        "-e", "PYTHONUNBUFFERED=1",
        "--init", "registry.example/train:1.0",
        "python", "-m", "pkg.train", "--epochs", "3",
    ]  # fmt: skip


def test_podman_uses_cdi_devices() -> None:
    argv = ContainerExecutor("podman").argv(launch(gpu_indices=[1, 3]))
    assert argv[:9] == [
        "podman", "run", "--rm", "--name", "trainyard-alloc-7",
        "--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3",
    ]  # fmt: skip
    assert "--gpus" not in argv
    assert "CUDA_VISIBLE_DEVICES=0,1" in argv


def test_no_gpus_no_gpu_flags_and_the_env_as_given() -> None:
    argv = ContainerExecutor().argv(
        launch(gpu_indices=[], env={"CUDA_VISIBLE_DEVICES": ""}, uid=None, gid=None)
    )
    assert argv == [
        "docker", "run", "--rm", "--name", "trainyard-alloc-7",
        *COMMON,
        "-e", "CUDA_VISIBLE_DEVICES=",
        "--init", "registry.example/train:1.0",
        "python", "-m", "pkg.train", "--epochs", "3",
    ]  # fmt: skip
    assert "--user" not in argv


def test_user_without_group_and_single_gpu() -> None:
    argv = ContainerExecutor().argv(launch(gpu_indices=[5], gid=None))
    assert argv[5:9] == ["--gpus", '"device=5"', "--user", "1500"]
    assert "CUDA_VISIBLE_DEVICES=0" in argv


def test_settings_change_the_limits() -> None:
    argv = ContainerExecutor(pids_limit=100, shm_size="1g", tmp_size="2g").argv(launch())
    assert argv[argv.index("--pids-limit") + 1] == "100"
    assert argv[argv.index("--shm-size") + 1] == "1g"
    assert "/tmp:rw,nosuid,nodev,size=2g" in argv


def test_relative_paths_are_mounted_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ContainerExecutor().argv(launch(workdir=Path("code"), scratch=Path("scratch")))
    assert f"{tmp_path}/code:/workspace/code:ro" in argv
    assert f"{tmp_path}/scratch:/workspace/scratch:rw" in argv


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"image": None}, "needs an image"),
        ({"command": []}, "needs a command"),
        ({"name": "../x"}, "not a valid container name"),
        ({"name": ""}, "not a valid container name"),
        ({"gpu_indices": [-1]}, "invalid GPU indices"),
        ({"env": {"A=B": "1"}}, "invalid environment variable name"),
        ({"workdir": Path("/srv/a:b")}, "cannot mount"),
    ],
)
def test_invalid_launches_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ContainerExecutor().argv(launch(**changes))


def test_stop_and_kill() -> None:
    docker = ContainerExecutor()
    assert docker.stop_argv("alloc-7", 30) == ["docker", "stop", "-t", "30", "trainyard-alloc-7"]
    assert docker.stop_argv("alloc-7", 2.6) == ["docker", "stop", "-t", "3", "trainyard-alloc-7"]
    assert docker.kill_argv("alloc-7") == ["docker", "kill", "trainyard-alloc-7"]
    podman = ContainerExecutor("podman")
    assert podman.stop_argv("a", 0) == ["podman", "stop", "-t", "0", "trainyard-a"]
    assert container_name("0f3c.a_b-c") == "trainyard-0f3c.a_b-c"
