"""The job's disk limit before it starts (``launch.within_disk_limit``, ``disk_watch.Watch``):
what the steps before it write to its sandbox (git, its bundle, its checkpoint, the probe
of its interpreter) counts from the moment the sandbox exists; a process of the job's user
writing there past the limit is killed, and the job fails as ``user_error`` naming it."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from tests.fixtures.uids import job_uid_base
from trainyard_platform.services.runner import disk_watch, launch
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.sandbox import (
    JobUser,
    can_switch_users,
    create_sandbox,
    failure_kind,
    remove_sandbox,
)

MIB = 1024**2
LIMIT_GIB = 1.0 / 1024  # 1 MiB


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))


def test_the_watch_stops_what_writes_past_the_limit_and_says_why(tmp_path: Path) -> None:
    stopped = threading.Event()
    with disk_watch.Watch([tmp_path], MIB, 0.01, stopped.set) as watch:
        write(tmp_path / "code" / "big", 2 * MIB)
        assert stopped.wait(60), "stop is called once the folder is over the limit"
    why = watch.over()
    assert why is not None and why.endswith(
        "to its sandbox, over its disk limit of 0.00098 GiB (TRAINYARD_RUNNER_JOB_DISK_GIB)"
    )


def test_a_step_over_the_limit_fails_as_the_jobs_own_error_in_place_of_its_own_error(
    tmp_path: Path,
) -> None:
    box = create_sandbox(tmp_path / "sandboxes", "a1", JobUser(None, None))
    settings = Settings(job_disk_gib=LIMIT_GIB, job_disk_check_seconds=60)
    with (
        pytest.raises(launch.DiskLimitExceeded) as raised,
        launch.within_disk_limit(box, settings),
    ):
        # Written between two measurements: the one at the step's end sees it.
        write(box.code / "repository.pack", 2 * MIB)
        raise RuntimeError("git fetch was killed")
    assert failure_kind(raised.value) == "user_error"
    assert str(raised.value).startswith("before the job started, the job wrote 0.0")
    assert str(raised.value).endswith(
        "over its disk limit of 0.00098 GiB (TRAINYARD_RUNNER_JOB_DISK_GIB)"
    )


def test_a_step_within_the_limit_keeps_its_own_outcome(tmp_path: Path) -> None:
    box = create_sandbox(tmp_path / "sandboxes", "a1", JobUser(None, None))
    settings = Settings(job_disk_gib=LIMIT_GIB, job_disk_check_seconds=0.01)
    with launch.within_disk_limit(box, settings):
        write(box.code / "train.py", 1000)
    with (
        pytest.raises(RuntimeError, match="git fetch failed"),
        launch.within_disk_limit(box, settings),
    ):
        raise RuntimeError("git fetch failed")
    unlimited = Settings(job_disk_gib=0, job_disk_check_seconds=0.01)
    with launch.within_disk_limit(box, unlimited):
        write(box.code / "big", 2 * MIB)


WRITER = 'head -c 8388608 /dev/urandom > "$1"; exec sleep 300'
"""Writes past the limit (8 MiB), as a hostile repository would make git do, then runs on
without end: only the watch's kill ends it within the test's timeout, however slowly the
watch gets a core (a writer racing the watch to a file-size limit of its own lost the race
under load, ending by SIGXFSZ instead)."""


@pytest.mark.skipif(not can_switch_users(), reason="needs to run jobs as their own users")
def test_a_process_of_the_job_writing_without_end_before_it_starts_is_killed() -> None:
    # Before: git (or the probe) writing without end ran on, for up to its 10 minutes, while
    # nothing measured the sandbox: the node's disk filled, and every later job failed.
    uid = job_uid_base()
    parent = Path(tempfile.mkdtemp(prefix="trainyard-test-"))
    parent.chmod(0o711)  # the job's user passes through to its sandbox
    box = create_sandbox(parent / "sandboxes", "a1", JobUser(uid, uid))
    os.chown(box.tmp, uid, uid)
    settings = Settings(job_disk_gib=LIMIT_GIB, job_disk_check_seconds=0.01)
    try:
        with (
            pytest.raises(launch.DiskLimitExceeded),
            launch.within_disk_limit(box, settings),
        ):
            done = subprocess.run(
                ["/bin/sh", "-c", WRITER, "sh", str(box.tmp / "fill")],
                user=uid,
                group=uid,
                extra_groups=[],
                env={},
                timeout=120,
                check=False,
            )
            raise RuntimeError(f"the step failed: exit {done.returncode}")
        assert done.returncode == -9, "killed by the watch, not ended by itself"
    finally:
        remove_sandbox(box.root)
        os.rmdir(parent / "sandboxes")
        os.rmdir(parent)
