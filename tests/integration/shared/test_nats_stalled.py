"""A NATS that keeps the connection but passes nothing (a stalled network path: the TCP
proxy of ``tests.fixtures.tcp_proxy`` frozen): publishing fails within its timeout as an
outage, and closing the bus (every service's stop) ends, without an error, however the
drain goes; once NATS passes bytes again a new bus works."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.fixtures.tcp_proxy import TcpProxy
from trainyard_platform.shared.bus import Bus, infrastructure_fault
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

SUBJECTS = [nats_subject(JobCancelRequested)]


@pytest.fixture
async def proxy(nats_settings: NatsSettings) -> AsyncIterator[TcpProxy]:
    target = urlsplit(nats_settings.url)
    assert target.hostname is not None and target.port is not None
    async with TcpProxy(target.hostname, target.port) as started:
        yield started


def _event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def test_a_stalled_nats_fails_publishes_and_lets_the_bus_close(
    nats_settings: NatsSettings, proxy: TcpProxy
) -> None:
    settings = nats_settings.model_copy(
        update={"url": proxy.url_for(nats_settings.url), "publish_timeout_seconds": 1.0}
    )
    seen: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        seen.append(envelope.subject)

    try:
        # A guard, not a timing assertion: the close raised FlushTimeoutError before.
        async with asyncio.timeout(60), Bus.connect(settings, "stalled-test") as bus:
            stop = asyncio.Event()
            consumer = asyncio.create_task(bus.consume("stalled", SUBJECTS, handle, stop))
            await bus.publish(_event("j1"))
            async with asyncio.timeout(10):
                while seen != ["j1"]:
                    await asyncio.sleep(0.05)
            proxy.freeze()
            with pytest.raises(TimeoutError) as timed_out:
                await bus.publish(_event("j2"))
            assert infrastructure_fault(timed_out.value) is not None
            stop.set()
            await consumer
    finally:
        proxy.restore()

    async with Bus.connect(settings, "stalled-test") as bus:  # and NATS works again
        assert await bus.ping()


async def test_the_bus_closes_without_an_error_while_nats_is_away(
    nats_settings: NatsSettings, proxy: TcpProxy
) -> None:
    """SIGTERM during a NATS outage: the client's ``close`` drained the socket of its last
    try to reconnect, which NATS had reset, and raised ``ConnectionResetError`` out of the
    stop (seen on a local stack with NATS killed: the submission service exited with status
    1 and a traceback) when a publish was left in the client's buffer (its outbox relay
    tried one). Here NATS is cut off, each connection ended with a TCP reset."""
    settings = nats_settings.model_copy(
        update={"url": proxy.url_for(nats_settings.url), "publish_timeout_seconds": 1.0}
    )
    try:
        async with asyncio.timeout(60), Bus.connect(settings, "away-test") as bus:
            assert await bus.ping()
            tried = proxy.accepted
            await proxy.cut(reset=True)
            while not bus.nats.is_reconnecting:
                await asyncio.sleep(0.05)
            with pytest.raises(Exception) as failed:  # buffered by the client, unanswered
                await bus.publish(_event("j1"))
            assert infrastructure_fault(failed.value) is not None
            while proxy.accepted < tried + 2:  # the client tries again every 2 s
                await asyncio.sleep(0.05)
    finally:
        proxy.restore()


async def test_nats_back_is_logged_in_one_line(
    nats_settings: NatsSettings, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """A service logged NATS going (``NATS (TRAINYARD_NATS_URL): <reason>; the client keeps
    trying``) but nothing when it came back: an operator could not tell from the log whether
    the outage was over."""
    settings = nats_settings.model_copy(update={"url": proxy.url_for(nats_settings.url)})
    caplog.set_level(logging.WARNING)
    async with asyncio.timeout(60), Bus.connect(settings, "back-test") as bus:
        tried = proxy.accepted
        await proxy.cut()
        while proxy.accepted < tried + 1:  # the client tried again, and was refused
            await asyncio.sleep(0.05)
        proxy.restore()
        while not bus.nats.is_connected:
            await asyncio.sleep(0.05)
        assert await bus.ping()
    back = [m for m in caplog.messages if m.startswith("NATS (TRAINYARD_NATS_URL) answers again")]
    assert len(back) == 1, caplog.messages


async def test_nats_away_at_the_start_is_told_answering_once_connected(
    nats_settings: NatsSettings, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """The client waits for NATS at the start, each failed try told to its error logger, but
    no callback says it connected at last: the outage's line had no end, and
    ``trainyard_dependency_away`` stayed 1 for the life of the process."""
    settings = nats_settings.model_copy(update={"url": proxy.url_for(nats_settings.url)})
    caplog.set_level(logging.WARNING)
    await proxy.cut()
    try:
        async with asyncio.timeout(60):
            connecting = asyncio.create_task(Bus.connect(settings, "late-test").__aenter__())
            while not any("unavailable" in m for m in caplog.messages):
                await asyncio.sleep(0.05)
            proxy.restore()
            bus = await connecting
            await bus.nats.flush(timeout=10)  # a round trip through the restored proxy
            await bus.nats.close()
    finally:
        proxy.restore()
    said = [m for m in caplog.messages if m.startswith("NATS (TRAINYARD_NATS_URL)")]
    assert said[0].startswith("NATS (TRAINYARD_NATS_URL) unavailable: ")
    assert said[-1].startswith("NATS (TRAINYARD_NATS_URL) answers again after "), said
