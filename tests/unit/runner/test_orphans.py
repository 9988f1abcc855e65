"""``orphans.kill_orphans`` kills a job's marked children and leaves the exit status of every
process the runner started itself to the code waiting for it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainyard_platform.services.runner import orphans

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def exited(pid: int, deadline_s: float = 30.0) -> None:
    """Wait until ``pid`` is a zombie (exited, not reaped)."""
    give_up = time.monotonic() + deadline_s
    while not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].startswith(" Z"):
        assert time.monotonic() < give_up, f"{pid} did not exit"
        time.sleep(0.01)


@pytest.mark.parametrize("own_session", [True, False])
def test_a_child_that_exited_is_left_to_its_waiter(own_session: bool) -> None:
    """A job's main process (a session of its own) or a helper (the runner's session) that
    exited is not reaped by the sweep: its waiter would get no exit status (subprocess
    then reports 0, asyncio 255)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "raise SystemExit(3)"],
        env={**os.environ, "TRAINYARD_ALLOCATION_ID": "alloc-1"},
        start_new_session=own_session,
    )
    exited(process.pid)
    assert orphans.kill_orphans("alloc-1") == 0
    assert process.wait(timeout=30) == 3


def test_a_child_holding_the_jobs_allocation_id_is_killed_and_reaped() -> None:
    mine = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, "TRAINYARD_ALLOCATION_ID": "alloc-1"},
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, "TRAINYARD_ALLOCATION_ID": "alloc-2"},
    )
    try:
        give_up = time.monotonic() + 30
        while not orphans.carries(mine.pid, frozenset({orphans.marker("alloc-1")})):
            assert time.monotonic() < give_up, "the child did not start"
            time.sleep(0.01)  # its environment is readable once it has run its program
        assert orphans.kill_orphans("alloc-1") == 1
        assert not Path(f"/proc/{mine.pid}").exists()  # reaped, no zombie left
        assert other.poll() is None
    finally:
        for process in (mine, other):
            process.kill()
            process.wait()


def test_become_subreaper_says_whether_it_took_effect() -> None:
    # A separate interpreter: the attribute would stay with the test process.
    code = (
        "from trainyard_platform.services.runner import orphans; print(orphans.become_subreaper())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "True"
