"""What a job sends on its control socket costs the runner bounded memory, however many
reports it sends: the job decides their number, and the runner's memory is every job's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from trainyard_platform.services.runner.domain import JobIdentity
from trainyard_platform.services.runner.supervisor import JobRun
from trainyard_platform.shared.control import CheckpointMessage, CheckpointRef, MetricsMessage


class _Events:
    parent = None

    def __init__(self) -> None:
        self.emitted = 0

    def emit(self, envelope: Any) -> None:
        self.emitted += 1


def _held(run: JobRun) -> int:
    """Items in the run's collections: what grows with the job's reports, if anything."""
    total = 0
    for value in vars(run).values():
        if isinstance(value, list | dict | set):
            total += len(value)
    return total


def _run(tmp_path: Path) -> JobRun:
    job = JobIdentity("job-1", "alloc-1", "node-1", 1, 1)
    return JobRun(
        job,
        events=_Events(),  # type: ignore[arg-type]
        ledger=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        checkpoint_store=None,  # type: ignore[arg-type]
        sandbox=None,  # type: ignore[arg-type]
        log_path=tmp_path / "alloc-1.log",
        trace_headers={},
        progress_interval_s=60.0,
        log_tail_lines=10,
        metrics_points_per_second=1.0,
    )


def test_metric_reports_hold_no_memory_per_report(tmp_path: Path) -> None:
    """Reports past the pace (left out of the series) still count in the job's figures,
    but as a running sum: the run holds as much after 20,000 reports as after 100."""

    async def main() -> tuple[int, int]:
        run = _run(tmp_path)
        for step in range(100):
            run._on_metrics(MetricsMessage(step=step, metrics={"data_wait_fraction": 0.5}))
        after_few = _held(run)
        for step in range(100, 20_000):
            run._on_metrics(MetricsMessage(step=step, metrics={"data_wait_fraction": 0.5}))
        after_many = _held(run)
        for handle in (run._flush_timer, run._batch_timer):
            if handle is not None:
                handle.cancel()
        return after_few, after_many

    few, many = asyncio.run(main())
    assert many == few


def test_checkpoint_messages_during_an_upload_hold_bounded_memory(tmp_path: Path) -> None:
    """A job announcing checkpoints while one uploads (an hours-long upload, a store
    retried with back-off) has at most ``MAX_WAITING_CHECKPOINTS`` of them remembered, the
    newest always among them: it is the one uploaded next."""

    async def main() -> tuple[int, int, int]:
        run = _run(tmp_path)
        for step in range(100):
            run._on_checkpoint(_checkpoint(step))
        after_few = _held(run)
        for step in range(100, 20_000):
            run._on_checkpoint(_checkpoint(step))
        after_many = _held(run)
        newest = max(run._staged_steps)
        assert run._uploader is not None
        run._uploader.cancel()
        return after_few, after_many, newest

    few, many, newest = asyncio.run(main())
    assert many == few
    assert newest == 19_999


def _checkpoint(step: int) -> CheckpointMessage:
    return CheckpointMessage(
        checkpoint=CheckpointRef(
            uri=f"file:///staging/step-{step:08d}/checkpoint.pt",
            manifest_uri=f"file:///staging/step-{step:08d}/manifest.json",
            step=step,
            size_bytes=1,
            sha256="0" * 64,
        )
    )
