"""The digits example as the runner runs it: a child process with a control pipe.

Checks what the platform relies on: it learns (> 90% validation accuracy), it reports
over the pipe, SIGTERM makes it checkpoint and exit 75, and a resumed run ends with
exactly the weights of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from trainyard.sdk.checkpoints import restore_latest
from trainyard_platform.shared.control import (
    PREEMPTED_EXIT_CODE,
    CheckpointMessage,
    ControlMessage,
    JobRuntimeEnv,
    MetricsMessage,
    parse_control_line,
)
from trainyard_platform.shared.storage import LocalStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JOB_SPEC = json.loads((REPO / "examples" / "digits.job.json").read_text())
# Frequent checkpoints give the SIGTERM below something to wait for early in the run.
HYPERPARAMETERS = {**JOB_SPEC["hyperparameters"], "checkpoint_every": 20}


@dataclass
class Run:
    process: subprocess.Popen[bytes]
    messages: queue.Queue[ControlMessage | None] = field(default_factory=queue.Queue)

    def next_message(self, timeout_s: float = 120.0) -> ControlMessage | None:
        return self.messages.get(timeout=timeout_s)

    def all_messages(self) -> Iterator[ControlMessage]:
        while (message := self.next_message()) is not None:
            yield message


def start(checkpoint_dir: Path, attempt: int, cwd: Path) -> Run:
    """Start the example as the runner would: environment variables and a control socket."""
    socket_path = cwd / f"control-{checkpoint_dir.name}-{attempt}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_path))
    server.listen(1)
    runtime = JobRuntimeEnv(
        job_id="digits-test",
        allocation_id=f"alloc-{attempt}",
        attempt=attempt,
        seed=JOB_SPEC["seed"],
        hyperparameters=HYPERPARAMETERS,
        checkpoint_uri=checkpoint_dir.as_uri(),
        control_socket=str(socket_path),
        dataset=JOB_SPEC["dataset"],
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(runtime.to_env())
    process = subprocess.Popen(
        [sys.executable, JOB_SPEC["entrypoint"]],
        cwd=REPO / "examples",
        env=env,
        stdout=subprocess.DEVNULL,
    )
    run = Run(process)

    def read() -> None:
        connection, _ = server.accept()
        server.close()
        with connection, connection.makefile("rb") as lines:
            for line in lines:
                run.messages.put(parse_control_line(line))
        run.messages.put(None)

    threading.Thread(target=read, daemon=True).start()
    return run


def final_state(checkpoint_dir: Path) -> tuple[int, dict[str, object]]:
    restored = restore_latest(LocalStore(checkpoint_dir))
    assert restored is not None
    return restored


def assert_same_tensors(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same_tensors(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tensors(x, y)
    else:
        assert a == b


def test_preempted_and_resumed_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    # The uninterrupted reference run.
    straight = start(tmp_path / "straight", attempt=1, cwd=tmp_path)
    messages = list(straight.all_messages())
    assert straight.process.wait(timeout=120) == 0
    metrics = [m for m in messages if isinstance(m, MetricsMessage)]
    checkpoints = [m for m in messages if isinstance(m, CheckpointMessage)]
    assert metrics and checkpoints
    assert metrics[-1].metrics["val_accuracy"] > 0.9
    total_step, reference = final_state(tmp_path / "straight")
    assert checkpoints[-1].checkpoint.step == total_step == reference["step"]

    # Preempt a second run once its first checkpoint is safely stored.
    first = start(tmp_path / "resumed", attempt=1, cwd=tmp_path)
    while not isinstance(message := first.next_message(), CheckpointMessage):
        assert message is not None, "the job ended before its first checkpoint"
    first.process.send_signal(signal.SIGTERM)
    list(first.all_messages())
    assert first.process.wait(timeout=120) == PREEMPTED_EXIT_CODE
    stopped_step, stopped = final_state(tmp_path / "resumed")
    assert 0 < stopped_step < total_step
    assert "metrics" not in stopped

    # The next attempt resumes and ends exactly where the uninterrupted run did.
    second = start(tmp_path / "resumed", attempt=2, cwd=tmp_path)
    resumed_metrics = [m for m in second.all_messages() if isinstance(m, MetricsMessage)]
    assert second.process.wait(timeout=120) == 0
    assert min(m.step for m in resumed_metrics) > stopped_step
    step, resumed = final_state(tmp_path / "resumed")
    assert step == total_step
    assert_same_tensors(resumed["model"], reference["model"])
    assert_same_tensors(resumed["optimizer"], reference["optimizer"])
    assert resumed["metrics"] == reference["metrics"]
