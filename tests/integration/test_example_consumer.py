"""examples/consumer.py against a real NATS JetStream: another system's durable consumer
prints each published event once (a second copy of an event id is ignored), NaN arriving as
a string, and a restart with the same name goes on where it stopped."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import nats
import pytest

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested, JobProgress
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "consumer.py"


async def run_example(url: str, *args: str) -> tuple[list[dict[str, object]], str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--url",
        url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()], err.decode()


def cancel(job: str) -> Envelope[Payload]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job, team="t", user="u"),
        source="trainyard/submission",
        subject=job,
    )


async def test_the_example_consumer_prints_each_event_once(
    bus: Bus, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    first = cancel("j1")
    progress = Envelope.wrap(
        JobProgress(job_id="j2", allocation_id="a", step=1, metrics={"loss": float("nan")}),
        source="trainyard/runner",
        subject="j2",
    )
    await bus.publish(first)
    # The same event again without Nats-Msg-Id (as a relay's retry after the duplicate
    # window would be stored): only the consumer's own deduplication catches it.
    nc = await nats.connect(nats_settings.url)
    try:
        await nc.jetstream().publish(first.nats_subject, first.to_json())
    finally:
        await nc.close()
    await bus.publish(progress)
    # A runner's event under the id of submission's: another event (an id is unique only
    # within its source), not a repeat to drop.
    squat = Envelope.wrap(
        JobProgress(job_id="j4", allocation_id="a", step=1, metrics={}),
        source="trainyard/runner",
        subject="j4",
        event_id=first.id,
    )
    nc = await nats.connect(nats_settings.url)
    try:
        await nc.jetstream().publish(squat.nats_subject, squat.to_json())
    finally:
        await nc.close()

    # Two runner nodes' reports under one id: every node says the source trainyard/runner,
    # so the node they name keeps them apart (docs/events.md).
    on_n1, on_n2 = (
        Envelope.wrap(
            JobProgress(job_id="j5", allocation_id="a5", step=1, metrics={}, node_id=node),
            source="trainyard/runner",
            subject="j5",
            event_id="report-5",
        )
        for node in ("n1", "n2")
    )
    nc = await nats.connect(nats_settings.url)
    try:
        for report in (on_n1, on_n2):
            await nc.jetstream().publish(report.nats_subject, report.to_json())
    finally:
        await nc.close()

    seen = tmp_path / "seen"
    args = ["--name", "external-system", "--seen", str(seen)]
    printed, err = await run_example(nats_settings.url, *args, "--max-events", "5")
    assert [(e["id"], e["type"]) for e in printed] == [
        (first.id, first.type),
        (progress.id, progress.type),
        (squat.id, squat.type),
        (on_n1.id, on_n1.type),
        (on_n2.id, on_n2.type),
    ]
    assert f"duplicate {first.id} ignored" in err
    assert printed[1]["data"] == {
        **json.loads(progress.to_json())["data"],
        "metrics": {"loss": "NaN"},
    }

    # Restarted under the same name: it resumes after what it acknowledged.
    later = cancel("j3")
    await bus.publish(later)
    printed, _ = await run_example(nats_settings.url, *args, "--max-events", "1")
    assert [e["id"] for e in printed] == [later.id]
    assert [line.split("\t") for line in seen.read_text().splitlines()] == [
        [first.source, first.id],
        [progress.source, progress.id],
        [squat.source, squat.id],
        ["trainyard/runner/n1", "report-5"],
        ["trainyard/runner/n2", "report-5"],
        [later.source, later.id],
    ]
