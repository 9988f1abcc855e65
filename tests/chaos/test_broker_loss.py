"""Broker data loss: the JetStream store is deleted under the running platform (NATS killed,
its store folder removed, NATS started empty) while jobs run and wait; every service makes
what it needs again (the scheduler the streams, everyone their durable consumer) and says
again what the lost stream held (the outboxes' retained rows; each runner its events about
an allocation once the allocation's grant is in the new stream again), and every job
converges with every invariant of the chaos suite holding.

The submission service and the scheduler are frozen (SIGSTOP) across the loss: the
submission has not read what the runners said about the jobs that ran meanwhile, and the
scheduler publishes its grants again only after the runners could have spoken. A runner's
report can reach the new stream before its grant (a grant handled, or a report retried,
across the loss), or a success before its start; said again, it is a duplicate the stream
drops. The submission's view keeps such a report and judges it once its grant or start has
come (``services.submission.early_reports``); before it did, a job stayed SCHEDULED or
RUNNING there while the scheduler had it SUCCEEDED."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import asyncpg
import nats
import pytest

from bench._chaos_load import CHECKPOINT_JOB, Load, Planned
from bench._chaos_platform import ChaosPlatform, PlatformConfig
from bench.chaos import settle

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

TEAM = "vision"


def _job(index: int, command: list[str]) -> Planned:
    spec = {
        "name": f"loss-{index}",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "command": command,
        "max_restarts": 8,
        "max_runtime_seconds": 300,
    }
    kind = "checkpoint" if command[0] == "python3" else "sleep"
    return Planned(f"loss-{index}-{time.time_ns()}", TEAM, kind, spec)


async def _stream_created(url: str) -> datetime:
    nc = await nats.connect(url)
    try:
        created = (await nc.jetstream().stream_info("TRAINYARD")).created
        assert created is not None
        return created
    finally:
        await nc.close()


async def _replays(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        return {
            schema: await conn.fetchval(f"SELECT replays FROM {schema}.outbox_stream")
            for schema in ("submission", "scheduler", "registry", "billing")
        }
    finally:
        await conn.close()


@pytest.mark.timeout(600)
def test_every_job_converges_after_the_jetstream_store_is_lost() -> None:
    data = Path(tempfile.mkdtemp(prefix="trainyard-broker-loss-"))
    stop = threading.Event()
    try:
        with ChaosPlatform(data, PlatformConfig(runners=2)) as platform:
            load = Load(
                platform.stack.submission_url, {TEAM: platform.stack.bootstrap_admin(TEAM, "a")}, 7
            )
            before = [_job(i, ["sleep", "2"]) for i in range(8)]
            before += [_job(8, ["python3", "-c", CHECKPOINT_JOB])]
            for planned in before:
                assert load.submit(planned, stop) is not None
            time.sleep(1)
            platform.stack.pause("submission")  # what runs now, it will hear of only later
            time.sleep(3)  # some ran, some run, some wait (4 GPUs)
            created = asyncio.run(_stream_created(platform.admin_nats_url))

            platform.stack.pause("scheduler")
            platform.lose_jetstream()
            time.sleep(3)  # the runners are up and about; nothing is granted again yet
            platform.stack.resume("scheduler")
            platform.stack.resume("submission")

            after = [_job(10 + i, ["sleep", "1"]) for i in range(3)]
            after += [_job(13, ["python3", "-c", CHECKPOINT_JOB])]
            for planned in after:
                assert load.submit(planned, stop) is not None
            report = settle(platform, load, [], [], 240.0, print)
            assert not report.failed, report.summary()
            assert report.facts["statuses"] == {"SUCCEEDED": len(before) + len(after)}
            assert asyncio.run(_stream_created(platform.admin_nats_url)) > created
            replays = asyncio.run(_replays(platform.stack.database_url))
            assert replays["submission"] == 1 and replays["scheduler"] == 1, replays
    finally:
        shutil.rmtree(data, ignore_errors=True)
