"""A job attempt on a node with real GPUs can open only its own GPUs' device files: the
kernel's cgroup v1 devices controller denies the others (EPERM). No GPU is needed: device
files of NVIDIA's major number made here stand in for ``/dev/nvidia*``; opening one the
cgroup allows fails with ENXIO instead (no driver behind it), the kernel's word that the
cgroup let it through."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.runner.conftest import writable_cgroups
from trainyard_platform.services.runner.cgroups import NVIDIA_MAJOR, NodeCgroups
from trainyard_platform.services.runner.sandbox import AsJob, JobUser


def _devices_writable() -> bool:
    return writable_cgroups("memory", "devices") is not None


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not _devices_writable(),
        reason="GPU device files are confined only by a root runner on a host with writable "
        "memory and cgroup v1 devices controllers",
    ),
]

OPEN_EACH = """
import errno, json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        seen[path] = "opened"
    except OSError as exc:
        seen[path] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""


def test_an_attempt_allocated_gpu_0_cannot_open_gpu_1s_device_file(tmp_path: Path) -> None:
    gpu0, gpu1 = tmp_path / "nvidia0", tmp_path / "nvidia1"
    os.mknod(gpu0, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 0))
    os.mknod(gpu1, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 1))
    node = NodeCgroups.detect(f"node-{uuid.uuid4().hex[:8]}", gpu_minors=(0, 1))
    assert node is not None and node.confines_gpus
    cgroup = node.create("sb-devices", None, None, None, [0])
    try:
        done = AsJob(JobUser(None, None), {}, cgroup=cgroup).run(
            [sys.executable, "-c", OPEN_EACH, str(gpu0), str(gpu1)], cwd=tmp_path, timeout=30
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen[str(gpu1)] == "EPERM"  # not its GPU: the cgroup denies it
        assert seen[str(gpu0)] == "ENXIO"  # its GPU: allowed, but no driver answers here

        # The runner itself (outside the attempt's cgroup) is not confined.
        with pytest.raises(OSError) as outside:
            os.open(gpu1, os.O_RDWR)
        assert outside.value.errno != errno.EPERM
    finally:
        cgroup.remove()
        node.close()
