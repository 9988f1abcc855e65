"""Background tasks of the runner whose failure is never lost.

Contract: ``start(coro, name, job_id, tasks)`` runs ``coro`` as a task named ``name``, kept
in ``tasks`` until it is done. Should it end with an exception, that is logged at once at
ERROR, with its traceback and the job's id (``job_id``, also in the record's ``job_id``
field), and retrieved. Nobody awaits these tasks (a job's launch, its supervision, its GPU
sampling): without this their error surfaced, if ever, as asyncio's "Task exception was
never retrieved" when the task was collected, naming no job. A cancelled task is no
failure and logs nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


def start(
    coro: Coroutine[Any, Any, None],
    name: str,
    job_id: str,
    tasks: set[asyncio.Task[None]] | None = None,
) -> asyncio.Task[None]:
    """Run ``coro`` in a task that logs its failure (see the module)."""
    task = asyncio.create_task(coro, name=name)
    if tasks is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def said(done: asyncio.Task[None]) -> None:
        if done.cancelled():
            return
        exc = done.exception()
        if exc is not None:
            log.error(
                "%s of job %s failed: %s",
                name,
                job_id,
                exc,
                exc_info=exc,
                extra={"job_id": job_id},
            )

    task.add_done_callback(said)
    return task
