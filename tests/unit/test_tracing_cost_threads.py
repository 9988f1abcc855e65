"""``bench.tracing_cost.ThreadCpu`` reads the CPU of the scheduler child's threads: the
event loop's (the process's first thread) apart from the others."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.tracing_cost import ThreadCpu

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")

# Named like the scheduler's command line, which is how ThreadCpu finds its process.
CHILD = """# trainyard_platform.services.scheduler
import threading, time, sys
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
worker = threading.Thread(target=spin, args=(0.3,))
worker.start()
worker.join()
print("ready", flush=True)
sys.stdin.readline()
"""


def test_the_threads_cpu_is_read_apart_from_the_event_loops() -> None:
    with ThreadCpu() as threads:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            time.sleep(4 * ThreadCpu.POLL_S)  # a reading after the worker ended
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=10)
    assert threads.other is not None and threads.main is not None
    assert threads.other >= 0.2  # the worker's 0.3 s, in clock ticks
    assert threads.main < threads.other


def test_no_scheduler_child_reads_as_none() -> None:
    with ThreadCpu() as threads:
        time.sleep(2 * ThreadCpu.POLL_S)
    assert threads.main is None and threads.other is None
