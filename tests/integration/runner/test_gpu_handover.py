"""A GPU never runs two jobs of one node at once, and a grant seen again brings the runner's
events about it again (found by the chaos suite, ``bench.chaos``).

- A runner that comes back (paused past its node timeout, or restarted with a stale grant
  waiting) may still run a job whose allocation the scheduler ended when a newer grant for
  the same GPUs arrives: the older job is stopped (fenced) and the new one starts only once
  its process has exited. A grant older than the job on its GPUs is ended unrun.
- A grant of an allocation the node already ran, delivered again (as a stream made again
  after NATS lost its store holds every grant again), is ignored, and the runner publishes
  again what it said about that allocation, after the grant.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.runner.conftest import (
    EventLog,
    StartRunner,
    grant,
    launched,
    publish,
)
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointSaved,
    JobPreempted,
    JobStarted,
    JobSucceeded,
)

pytestmark = pytest.mark.integration


async def test_a_newer_grant_for_busy_gpus_stops_the_older_job_first(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches
) -> None:
    await start_runner(settings)
    old = grant(settings.node_id, ["wait", str(launches)], gpu_indices=[0])
    await publish(bus, old, settings.node_id)
    await events.first(JobStarted, old.job_id)

    new = grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[0])
    new = new.model_copy(update={"epoch": old.epoch + 1})
    await publish(bus, new, settings.node_id)

    stopped = await events.first(JobPreempted, old.job_id)
    started = await events.first(JobStarted, new.job_id)
    await events.first(JobSucceeded, new.job_id)
    assert stopped.reason == "fenced"
    assert stopped.finished_at <= started.started_at  # never both on GPU 0

    older = grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[1])
    older = older.model_copy(update={"epoch": new.epoch + 5})
    await publish(bus, older, settings.node_id)
    await events.first(JobStarted, older.job_id)
    stale = grant(settings.node_id, ["succeed", str(launches)], gpu_indices=[1])
    stale = stale.model_copy(update={"epoch": new.epoch + 2})
    await publish(bus, stale, settings.node_id)
    ended = await events.first(JobPreempted, stale.job_id)
    assert ended.reason == "fenced"
    assert not events.of(JobStarted, stale.job_id)
    assert stale.allocation_id not in launched(launches)


async def test_a_grant_seen_again_brings_its_events_again_after_it(
    settings: Settings, start_runner: StartRunner, bus: Bus, events: EventLog, launches
) -> None:
    await start_runner(settings)
    allocation = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, allocation, settings.node_id)
    await events.first(JobSucceeded, allocation.job_id)
    said = [
        r.envelope.id
        for r in events.records(allocation.job_id)
        if isinstance(r.envelope.data, JobStarted | CheckpointSaved | JobSucceeded)
    ]

    # NATS loses the stream; it is made again, and the scheduler publishes its grant again.
    await bus.jetstream.delete_stream(bus.settings.stream)
    await bus.ensure_streams()
    await publish(bus, allocation, settings.node_id)

    async def in_new_stream() -> list[str]:
        info = await bus.jetstream.stream_info(bus.settings.stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            envelope = parse_envelope((await bus.jetstream.get_msg(bus.settings.stream, seq)).data)
            if envelope.subject == allocation.job_id or envelope.type == AllocationGranted.TYPE:
                found.append(envelope.id)
        return found

    async with asyncio.timeout(30):
        while len(found := await in_new_stream()) < 1 + len(said):
            await asyncio.sleep(0.1)
    assert found[1:] == said  # after the grant, in their order, with their ids
    assert launched(launches) == [allocation.allocation_id]  # not run twice
