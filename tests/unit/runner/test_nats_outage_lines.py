"""While NATS is away the runner says so once when it goes and once when it is back, not
once a heartbeat or a retry."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.publishing import journal, publish_until_sent
from trainyard_platform.shared.bus import nats_dependency
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobProgress


class AwayBus:
    """A bus whose first ``failures`` publishes fail as NATS being away."""

    def __init__(self, failures: int, then: asyncio.Event | None = None) -> None:
        self.failures = failures
        self.then = then
        self.sent = 0
        self.nats_away = nats_dependency()

    async def publish(self, envelope: Envelope[Payload], headers: Any = None) -> None:
        if self.failures:
            self.failures -= 1
            raise nats.errors.NoServersError()
        self.sent += 1
        if self.then is not None:
            self.then.set()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_heartbeats_say_an_outage_in_one_line_and_its_end_in_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each heartbeat that failed while NATS was away logged "heartbeat not published", one
    # line every 12 s for as long as the outage lasted.
    drained = asyncio.Event()
    bus = AwayBus(failures=6, then=drained)
    settings = SimpleNamespace(
        gpu_flavor="cpu",
        topology="",
        address="",
        heartbeat_ttl_seconds=600,
        heartbeat_interval_seconds=0.01,
    )
    agent = SimpleNamespace(
        node_id="node-a",
        settings=settings,
        gpus=SimpleNamespace(count=0, names=()),
        running_allocations=list,
        drained=drained,
        _bus=bus,
    )
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(NodeAgent.heartbeats(agent), timeout=30)  # type: ignore[arg-type]
    said = lines(caplog)
    assert len(said) == 2, said
    assert "NATS (TRAINYARD_NATS_URL) unavailable" in said[0]
    assert "answers again" in said[1] and "(6 failures)" in said[1]


async def test_a_retried_publish_says_an_outage_once(caplog: pytest.LogCaptureFixture) -> None:
    bus = AwayBus(failures=3)
    envelope = Envelope.wrap(
        JobProgress(job_id="j", allocation_id="a", step=1, metrics={"loss": 1.0}),
        source="trainyard/runner",
        subject="j",
    )
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(
            publish_until_sent(bus, envelope, None, record=False, after_grant=False),  # type: ignore[arg-type]
            timeout=30,
        )
    said = lines(caplog)
    assert bus.sent == 1
    assert len(said) == 2, said
    assert "unavailable" in said[0] and "answers again" in said[1]


async def test_an_event_waiting_for_its_grant_says_nothing_of_a_lost_stream_while_nats_is_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each job's event waiting while NATS was away logged "... waits until its grant is in
    # the event stream again (the stream was lost and made again)": NATS being away had the
    # stream's identity unknown, which was taken for a stream made again.
    bus = AwayBus(failures=0)
    created = datetime(2026, 1, 1, tzinfo=UTC)
    away = 3

    async def stream_created() -> datetime:
        nonlocal away
        if away:
            away -= 1
            raise nats.errors.NoServersError()
        return created

    bus.stream_created = stream_created  # type: ignore[attr-defined]
    journal(bus).granted_in["a"] = created  # type: ignore[arg-type]
    envelope = Envelope.wrap(
        JobProgress(job_id="j", allocation_id="a", step=1, metrics={"loss": 1.0}),
        source="trainyard/runner",
        subject="j",
    )
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(
            publish_until_sent(bus, envelope, None, record=False),  # type: ignore[arg-type]
            timeout=30,
        )
    said = lines(caplog)
    assert bus.sent == 1
    assert len(said) == 2, said
    assert "unavailable" in said[0] and "answers again" in said[1]
