"""Lines the runner logs about a job carry its job id: the grant's span is routed by node,
so a line made while a job was granted, supervised or revoked had none (shared.logs took
job ids only from job-routed events' spans)."""

from __future__ import annotations

import asyncio
import json
import logging

from trainyard_platform.services.runner.handlers import dispatcher
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import AllocationRevoked
from trainyard_platform.shared.logs import JsonFormatter, job_scope

JOB = "1ab12276-8c03-4adc-b1c9-fd50448a013c"


def job_id_of(record: logging.LogRecord) -> str | None:
    return json.loads(JsonFormatter("runner").format(record)).get("job_id")


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str | None] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(job_id_of(record))


def record() -> logging.LogRecord:
    return logging.LogRecord("runner", logging.INFO, __file__, 1, "working", (), None)


async def test_the_scope_holds_in_tasks_and_threads_started_in_it_and_ends_with_it() -> None:
    with job_scope(JOB):
        task = asyncio.create_task(asyncio.sleep(0.01))
        inside = job_id_of(record())
        in_thread = await asyncio.to_thread(lambda: job_id_of(record()))

        async def later() -> str | None:
            await asyncio.sleep(0.01)
            return job_id_of(record())

        spawned = asyncio.create_task(later())
    await task
    assert (inside, in_thread, await spawned) == (JOB, JOB, JOB)
    assert job_id_of(record()) is None


class Agent:
    node_id = "node-7"

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    async def on_revoked(self, revoked: AllocationRevoked) -> None:
        log = logging.getLogger("test.runner")
        log.info("stopping")

        async def supervise() -> None:
            await asyncio.sleep(0.01)
            log.info("stopped")

        self.tasks.append(asyncio.create_task(supervise()))


async def test_a_revocation_and_the_work_it_starts_log_the_job_id() -> None:
    agent, lines = Agent(), Collect()
    logging.getLogger("test.runner").addHandler(lines)
    logging.getLogger("test.runner").setLevel(logging.INFO)
    revoked = AllocationRevoked(
        allocation_id="a", job_id=JOB, node_id="node-7", epoch=1, reason="cancelled"
    )
    envelope = Envelope.wrap(revoked, source="trainyard/scheduler", subject="node-7")
    await dispatcher(agent)(envelope)  # type: ignore[arg-type]
    logging.getLogger("test.runner").info("the consumer goes on")
    await asyncio.gather(*agent.tasks)
    logging.getLogger("test.runner").removeHandler(lines)
    assert lines.lines == [JOB, None, JOB]
