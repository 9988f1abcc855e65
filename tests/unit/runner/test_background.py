"""A background task of the runner never fails unseen."""

from __future__ import annotations

import asyncio
import logging

import pytest

from trainyard_platform.services.runner import background


async def test_a_failed_task_is_logged_at_once_with_its_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise OSError(28, "No space left on device")

    async def waits() -> None:
        await asyncio.Event().wait()

    tasks: set[asyncio.Task[None]] = set()
    with caplog.at_level(logging.ERROR):
        failing = background.start(fails(), "the launch of allocation a-1", "job-1", tasks)
        cancelled = background.start(waits(), "the sampling", "job-2", tasks)
        await asyncio.wait([failing])
        cancelled.cancel()
        await asyncio.wait([cancelled])
        await asyncio.sleep(0)
    [record] = caplog.records
    assert record.getMessage().startswith("the launch of allocation a-1 of job job-1 failed")
    assert record.exc_info is not None and getattr(record, "job_id", None) == "job-1"
    assert not tasks
