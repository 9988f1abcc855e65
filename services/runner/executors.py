"""How a job's command is run: directly as a process, or inside a container.

An :class:`Executor` turns a :class:`LaunchRequest` (the job's own argv and what it runs
with) into the argv the runner spawns. :class:`ProcessExecutor` runs the job's command as
is; :class:`ContainerExecutor` wraps it in ``docker run`` / ``podman run``.

There is no container engine on the CI machines, so :class:`ContainerExecutor` is tested up
to the exact command it would run (tests/unit/runner/test_executors.py), not by running it.

What changes for a job in a container (the runner must provide for it in the request):

- its code is at ``/workspace/code`` (read-only, the working directory) and its scratch
  folder at ``/workspace/scratch`` (read-write); nothing else of the host is visible.
  ``command`` and ``env`` must use those paths and the image's interpreter (e.g.
  ``["python", "-m", "pkg.train"]``), not host paths: the control socket, the checkpoint
  staging folder, HOME and TMPDIR must live under the scratch folder and be named by their
  ``/workspace/scratch/...`` paths (a Unix socket works across a bind mount), and a
  ``file://`` object store on the host is not reachable;
- the job environments of :mod:`services.runner.environments` are host venvs: a container
  job brings its own packages in its image;
- stop it with :meth:`ContainerExecutor.stop_argv` (SIGTERM to the job through ``--init``,
  SIGKILL after the grace period) or :meth:`ContainerExecutor.kill_argv`: a SIGKILL to
  the ``docker run`` client (which it cannot forward) leaves the container running;
- GPUs are renumbered from 0 inside the container, so ``CUDA_VISIBLE_DEVICES`` is
  rewritten to ``0..n-1`` for its ``n`` devices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

Engine = Literal["docker", "podman"]

CODE_MOUNT = "/workspace/code"
SCRATCH_MOUNT = "/workspace/scratch"
CONTAINER_PREFIX = "trainyard-"

# Docker's own rule for container names.
_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_ENV_NAME_PATTERN = re.compile(r"^[^=\0]+$")


@dataclass(frozen=True)
class LaunchRequest:
    """One job process to start."""

    command: list[str]
    """The job's own argv, e.g. ``[python, "-m", "pkg.train", ...]``."""
    workdir: Path
    """The job's code; mounted read-only in a container."""
    scratch: Path
    """A writable folder for the job."""
    env: Mapping[str, str]
    gpu_indices: list[int]
    uid: int | None
    gid: int | None
    name: str
    """Unique per launch (e.g. the allocation id); names the container."""
    image: str | None
    """The container image; None runs the job as a process."""


class Executor(Protocol):
    def argv(self, launch: LaunchRequest) -> list[str]:
        """The argv the runner spawns for ``launch``."""
        ...


class ProcessExecutor:
    """The job runs as a child process of the runner: its command unchanged (the runner
    applies ``env``, ``workdir``, uid/gid and the control pipe when it spawns it)."""

    def argv(self, launch: LaunchRequest) -> list[str]:
        return list(launch.command)


def container_name(name: str) -> str:
    """``trainyard-<name>``; ValueError unless ``name`` is a valid container name."""
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"{name!r} is not a valid container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
    return f"{CONTAINER_PREFIX}{name}"


@dataclass(frozen=True)
class ContainerExecutor:
    """The job runs in a container of its image (``launch.image``), confined to its GPUs:

    - ``--rm``, ``--name trainyard-<name>`` (so it can be stopped by name);
    - GPUs: docker ``--gpus "device=0,2"`` (the quotes are part of the value: docker
      splits an unquoted ``device=0,2`` at the comma and exposes only the first GPU);
      podman one ``--device nvidia.com/gpu=<i>`` per GPU (CDI); nothing without GPUs.
      Indices are the host's ``nvidia-smi`` (PCI bus) order, the runner's own;
    - ``--user uid:gid`` when the launch has a uid;
    - ``--network host``: distributed training rendezvous (torch.distributed's TCPStore,
      NCCL's bootstrap and sockets) listens on and connects to the node's own addresses
      and ports, which a bridged network would hide behind NAT;
    - a read-only root filesystem with a ``/tmp`` tmpfs, ``--shm-size`` (PyTorch data
      loader workers and NCCL use /dev/shm; docker's default is 64 MB),
      ``--security-opt no-new-privileges``, ``--cap-drop ALL``, ``--pids-limit``;
    - the code read-only at ``/workspace/code`` (the working directory) and the scratch
      folder read-write at ``/workspace/scratch``;
    - every variable as ``-e K=V``, sorted by name (values are not secret: jobs carry no credentials);
    - ``--init``: a minimal init as PID 1 forwards signals to the job and reaps zombies.
    """

    engine: Engine = "docker"
    pids_limit: int = 4096
    shm_size: str = "8g"
    tmp_size: str = "8g"

    def argv(self, launch: LaunchRequest) -> list[str]:
        if not launch.image:
            raise ValueError("a container launch needs an image")
        if not launch.command:
            raise ValueError("a container launch needs a command")
        argv = [self.engine, "run", "--rm", "--name", container_name(launch.name)]
        argv += self._gpu_args(launch.gpu_indices)
        if launch.uid is not None:
            user = str(launch.uid) if launch.gid is None else f"{launch.uid}:{launch.gid}"
            argv += ["--user", user]
        argv += [
            "--network", "host",
            "--read-only",
            "--tmpfs", f"/tmp:rw,nosuid,nodev,size={self.tmp_size}",
            "--shm-size", self.shm_size,
            "--security-opt", "no-new-privileges",
            "--cap-drop", "ALL",
            "--pids-limit", str(self.pids_limit),
            "-v", f"{_mount_source(launch.workdir)}:{CODE_MOUNT}:ro",
            "-v", f"{_mount_source(launch.scratch)}:{SCRATCH_MOUNT}:rw",
            "-w", CODE_MOUNT,
        ]  # fmt: skip
        for key, value in sorted(self._env(launch).items()):
            if not _ENV_NAME_PATTERN.match(key):
                raise ValueError(f"invalid environment variable name {key!r}")
            argv += ["-e", f"{key}={value}"]
        argv += ["--init", launch.image, *launch.command]
        return argv

    def stop_argv(self, name: str, grace_seconds: float) -> list[str]:
        """SIGTERM to the job (through ``--init``), SIGKILL after ``grace_seconds``."""
        return [self.engine, "stop", "-t", str(max(0, round(grace_seconds))), container_name(name)]

    def kill_argv(self, name: str) -> list[str]:
        """SIGKILL now."""
        return [self.engine, "kill", container_name(name)]

    def _gpu_args(self, indices: list[int]) -> list[str]:
        if any(i < 0 for i in indices):
            raise ValueError(f"invalid GPU indices {indices}")
        if not indices:
            return []
        if self.engine == "podman":
            return [arg for i in indices for arg in ("--device", f"nvidia.com/gpu={i}")]
        return ["--gpus", f'"device={",".join(str(i) for i in indices)}"']

    @staticmethod
    def _env(launch: LaunchRequest) -> dict[str, str]:
        env = dict(launch.env)
        if launch.gpu_indices:  # renumbered from 0 inside the container
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(launch.gpu_indices)))
        return env


def _mount_source(path: Path) -> str:
    source = str(Path(path).absolute())
    if ":" in source or "," in source:
        raise ValueError(f"cannot mount {source!r}: ':' and ',' are not allowed in a mount path")
    return source
