"""Heartbeats leave the event stream when their TTL ends (``Nats-TTL``); every other event
stays the stream's retention. On a real NATS JetStream."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import nats
import pytest
from nats.js import api

from trainyard_platform.shared.bus import TTL_HEADER, Bus
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested, RunnerHeartbeat
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration


def heartbeat(node: str) -> Envelope[Payload]:
    beat = RunnerHeartbeat(
        node_id=node, hostname="h", gpu_flavor="cpu", gpu_count=1, sent_at=datetime.now(UTC)
    )
    return Envelope.wrap(beat, source="trainyard/runner", subject=node)


async def subjects_stored(bus: Bus, stream: str) -> list[str]:
    info = await bus.jetstream.stream_info(stream, subjects_filter=">")
    return sorted((info.state.subjects or {}).keys())


async def test_a_heartbeat_expires_and_the_job_events_stay(
    bus: Bus, nats_settings: NatsSettings
) -> None:
    info = await bus.jetstream.stream_info(nats_settings.stream)
    assert info.config.allow_msg_ttl is True
    assert info.config.max_age == nats_settings.retention_hours * 3600
    cancel = Envelope.wrap(
        JobCancelRequested(job_id="j1", team="t", user="u"),
        source="trainyard/submission",
        subject="j1",
    )
    await bus.publish(cancel)
    await bus.publish(heartbeat("n1"), {TTL_HEADER: "1s"})
    stored = await bus.jetstream.get_last_msg(nats_settings.stream, heartbeat("n1").nats_subject)
    assert (stored.headers or {}).get(TTL_HEADER) == "1s"
    # Poll until the TTL has removed the heartbeat (bounded: fails rather than hangs).
    async with asyncio.timeout(30):
        while heartbeat("n1").nats_subject in await subjects_stored(bus, nats_settings.stream):
            await asyncio.sleep(0.2)
    assert await subjects_stored(bus, nats_settings.stream) == [cancel.nats_subject]


async def test_a_stream_made_before_ttls_is_updated_to_allow_them(
    nats_settings: NatsSettings,
) -> None:
    nc = await nats.connect(nats_settings.url)
    try:
        await nc.jetstream().add_stream(
            api.StreamConfig(name=nats_settings.stream, subjects=["trainyard.>"])
        )
    finally:
        await nc.close()
    async with Bus.connect(nats_settings, "test") as bus:
        info = await bus.jetstream.stream_info(nats_settings.stream)
        assert info.config.allow_msg_ttl is True
        await bus.publish(heartbeat("n2"), {TTL_HEADER: "600s"})
