"""examples/consumer.py refuses bad options naming them, and says in one line (password
left out) why it cannot reach NATS: it used to print nats-py's tracebacks, every 2 s."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "consumer.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--name", "orders.export"], "--name"),
        (["--name", "two words"], "--name"),
        (["--name", "ok", "--max-events", "0"], "--max-events"),
        (["--name", "ok", "--max-events", "many"], "--max-events"),
    ],
)
def test_a_bad_option_is_refused_naming_it(args: list[str], option: str) -> None:
    done = _run("--url", "nats://127.0.0.1:9", *args)
    assert done.returncode == 2
    assert f"argument {option}:" in done.stderr and "Traceback" not in done.stderr


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://someone:hunter2secret@127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--url", url, "--name", "ok"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                break
        assert proc.stderr is not None
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith(f"NATS at nats://someone:***@127.0.0.1:{port}: ")
    assert "trying again" in first and "hunter2secret" not in first
