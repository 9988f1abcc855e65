"""What a job sends on its control socket costs the runner bounded memory, however many
reports it sends: the job decides their number, and the runner's memory is every job's."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from typing import Any

import pytest

from trainyard_platform.services.runner import domain
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


def _run(tmp_path: Path, usage: Any = None) -> JobRun:
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
        usage=usage,
        gpu_indices=[0],
        usage_interval_s=0.0,
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


class _Usage:
    """GPU samples from ``values``, then the end of the sampling."""

    def __init__(self, values: list[float]) -> None:
        self._values = iter(values)

    def sample(self, indices: Any) -> dict[str, float]:
        value = next(self._values, None)
        if value is None:
            raise _SamplingOver
        return {"gpu_utilization": value, "gpu_memory_used_bytes": 1.0}


class _SamplingOver(Exception):
    pass


def test_gpu_samples_hold_no_memory_per_sample_and_keep_the_same_mean(tmp_path: Path) -> None:
    """The runner samples a job's GPUs every few seconds for as long as it runs: a week
    is over 100,000 samples. Before: each was kept in a list only to take their mean at the
    end. Now a running sum: the run holds as much after 5,000 samples as after 100, and the
    end's ``gpu_utilization_mean`` is what the mean of the list was, to the last bit."""
    rng = random.Random(7)
    samples = [rng.uniform(0.0, 100.0) for _ in range(5_000)]

    async def main(count: int) -> JobRun:
        run = _run(tmp_path, usage=_Usage(samples[:count]))
        with contextlib.suppress(_SamplingOver):
            await run._sample_usage()
        return run

    few = asyncio.run(main(100))
    many = asyncio.run(main(len(samples)))
    assert _held(many) == _held(few)
    ended = domain.end_metrics({}, many._utilization, many._data_waits, 60.0, 1)
    assert ended["gpu_utilization_mean"] == sum(samples) / len(samples)


@pytest.mark.parametrize(
    "values",
    [[random.Random(seed).uniform(0.0, 100.0) for _ in range(100_000)] for seed in (1, 2)]
    + [
        [1e16, 1.0, -1e16, 3.5] * 1000,
        [0.1] * 10_000,
        [random.Random(3).uniform(-1e12, 1e12) for _ in range(10_000)],
        [5.0],
        [-0.0],
    ],
)
def test_a_running_mean_is_the_mean_of_its_values_to_the_last_bit(values: list[float]) -> None:
    mean = domain.RunningMean.of(values)
    assert mean.count == len(values)
    assert mean.mean == sum(values) / len(values)
    assert domain.RunningMean().mean is None
