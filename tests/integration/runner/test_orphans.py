"""A runner that is not root (jobs without a uid or a cgroup of their own) kills what a job
left running in a session of its own when the job ends, and only that job's; a restarted
runner kills what the jobs its predecessor lost left."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.runner.conftest import EventLog, StartRunner, grant, publish, upload_bundle
from trainyard_platform.services.runner import agent, domain, orphans, sandbox
from trainyard_platform.services.runner.cgroups import NodeCgroups
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.ledger import Ledger, safe_file_name
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import JobSucceeded
from trainyard_platform.shared.storage import open_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads processes from /proc"),
]

ESCAPING_JOB = textwrap.dedent(
    """
    # Double-forks a sleeping child into a session of its own, writes its pid to
    # <folder>/<name>.pid and, once it is there, ends (after <hold> exists, if given).
    import os, sys, time
    from pathlib import Path

    folder, name = Path(sys.argv[1]), sys.argv[2]
    hold = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(quiet, fd)
            (folder / f"{name}.tmp").write_text(str(os.getpid()))
            os.rename(folder / f"{name}.tmp", folder / f"{name}.pid")
            time.sleep(600)
        os._exit(0)
    os.waitpid(child, 0)
    while not (folder / f"{name}.pid").exists():
        time.sleep(0.01)
    while hold is not None and not hold.exists():
        time.sleep(0.02)
    """
)
DEADLINE_S = 30.0


@pytest.fixture
def runner_not_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the jobs as a runner that is not root does: as its own user, with no cgroup.
    The test process stops being a subreaper after (later tests' orphans go to init)."""
    monkeypatch.setattr(sandbox, "can_switch_users", lambda: False)
    monkeypatch.setattr(agent, "can_switch_users", lambda: False)
    monkeypatch.setattr(NodeCgroups, "detect", staticmethod(lambda *args, **kwargs: None))
    yield
    ctypes.CDLL(None, use_errno=True).prctl(orphans.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def gone(pid: int) -> bool:
    """Whether ``pid`` is gone, reaped too (no zombie left)."""
    return not Path(f"/proc/{pid}").exists()


def written_pid(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None


async def until_gone(pid: int) -> bool:
    """Whether ``pid`` is gone within ``DEADLINE_S``."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + DEADLINE_S
    while not gone(pid):
        if loop.time() >= give_up:
            return False
        await asyncio.sleep(0.05)
    return True


async def pid_in(path: Path) -> int:
    async with asyncio.timeout(DEADLINE_S):
        while (pid := written_pid(path)) is None:
            await asyncio.sleep(0.05)
    return pid


@pytest.mark.usefixtures("runner_not_root")
async def test_a_child_in_a_session_of_its_own_dies_with_its_job_and_not_with_another(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
    launches: Path,
) -> None:
    """Two jobs each double-fork a sleeping child into a session of its own (out of their
    process group, which is all a runner without a uid per job found of them: the child
    ran on after its job, for good). The first job's child is gone once the first job
    ended, while the second's, still running, is left alone; it goes when its job ends."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "escaping"
    code_folder.mkdir()
    (code_folder / "escaping.py").write_text(ESCAPING_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    release = launches / "release"
    first = grant(
        settings.node_id,
        [str(launches), "first"],
        entrypoint="escaping.py",
        code=code,
        gpu_indices=[0],
    )
    second = grant(
        settings.node_id,
        [str(launches), "second", str(release)],
        entrypoint="escaping.py",
        code=code,
        gpu_indices=[1],
    )
    pids: list[int] = []
    try:
        await publish(bus, second, settings.node_id)
        pids.append(await pid_in(launches / "second.pid"))
        await publish(bus, first, settings.node_id)
        pids.append(await pid_in(launches / "first.pid"))

        await events.first(JobSucceeded, first.job_id)
        assert await until_gone(pids[1]), "the first job's child outlived it"
        assert running(pids[0]), "the second job's child was killed with the first job"

        release.touch()
        await events.first(JobSucceeded, second.job_id)
        assert await until_gone(pids[0]), "the second job's child outlived it"
    finally:
        for pid in pids:
            if running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def sleeper(allocation_id: str) -> subprocess.Popen[bytes]:
    """A process in a session of its own with ``allocation_id`` in its environment."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, "TRAINYARD_ALLOCATION_ID": allocation_id},
        start_new_session=True,
    )


@pytest.mark.usefixtures("runner_not_root")
async def test_a_restarted_runner_kills_what_a_lost_job_left_outside_its_group(
    settings: Settings, start_runner: StartRunner
) -> None:
    """A runner died while its job ran: the job's child in a session of its own was
    re-parented to init and found by no later runner, which killed only the recorded
    process groups. The next runner kills it before it accepts work, by the allocation id
    in its environment."""
    ledger = Ledger(settings.work_dir / "ledger" / safe_file_name(settings.node_id))
    lost = domain.JobIdentity("job-lost", "alloc-lost", settings.node_id, 2, 1)
    ledger.launched(lost, {})
    left, other = sleeper("alloc-lost"), sleeper("alloc-other")
    try:
        await start_runner(settings)  # recovered (and killed) before it returns
        assert await asyncio.to_thread(left.wait, DEADLINE_S) == -signal.SIGKILL
        assert other.poll() is None, "a process of an allocation not in the ledger was killed"
    finally:
        for process in (left, other):
            process.kill()
            process.wait()
