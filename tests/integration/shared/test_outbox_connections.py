"""The outbox relay holds no pooled connection while it waits for NATS: a relay publishing
to a stalled NATS (the TCP proxy of ``tests.fixtures.tcp_proxy`` frozen) left a pool of
one connection unable to serve anything else (an HTTP request, an event handler) for as
long as the publish could take. And a relay that waits for NATS keeps its guarantees: the
rows it read are published by no other relay meanwhile (nor rows after them, which would
overtake them), and a relay that never comes back (killed in the middle of a round) holds
them only until its claim runs out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.fixtures.tcp_proxy import TcpProxy
from tests.integration.shared.outbox_stream import cancel_event, stream_ids, unpublished
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.outbox import OutboxRelay, enqueue
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

pytestmark = pytest.mark.integration

EMPTY = Path(__file__).parent / "no-migrations"


class _Publishing(Bus):
    """A bus that tells when a publish has started (and the relay waits on NATS)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.started = asyncio.Event()

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        self.started.set()
        await super().publish_many(messages)


@pytest.fixture
async def proxy(nats_settings: NatsSettings) -> AsyncIterator[TcpProxy]:
    target = urlsplit(nats_settings.url)
    assert target.hostname is not None and target.port is not None
    async with TcpProxy(target.hostname, target.port) as started:
        yield started


@pytest.fixture
async def stalling_bus(
    nats_settings: NatsSettings, proxy: TcpProxy, bus: Bus
) -> AsyncIterator[_Publishing]:
    """A bus through the proxy (freeze it to stall NATS), with a publish timeout long enough
    that the relay is still waiting while the test looks."""
    settings = nats_settings.model_copy(
        update={"url": proxy.url_for(nats_settings.url), "publish_timeout_seconds": 60.0}
    )
    async with Bus.connect(settings, "stalling") as connected:
        yield _Publishing(connected.nats, connected.settings)


@pytest.fixture
async def one_connection(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of one connection (``TRAINYARD_DATABASE_POOL_MAX_SIZE=1``), platform tables
    migrated."""
    settings = DatabaseSettings(
        url=database_url, pool_min_size=1, pool_max_size=1, acquire_timeout_seconds=5.0
    )
    async with open_pool(settings, "t") as pool:
        await migrate(pool, "t", EMPTY)
        yield pool


async def test_the_pool_serves_others_while_the_relay_waits_for_a_stalled_nats(
    one_connection: asyncpg.Pool, stalling_bus: _Publishing, proxy: TcpProxy, bus: Bus
) -> None:
    pool = one_connection
    events = [cancel_event("j1"), cancel_event("j2")]
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events)

    proxy.freeze()
    try:
        relaying = asyncio.create_task(OutboxRelay(pool, stalling_bus).relay_once())
        async with asyncio.timeout(30):  # a guard, not a timing assertion
            await stalling_bus.started.wait()
        # The relay waits for NATS's acknowledgement now; the pool's one connection is free.
        async with pool.acquire(timeout=5.0) as conn:
            assert await conn.fetchval("SELECT count(*) FROM outbox") == 2
        assert not relaying.done()
    finally:
        proxy.restore()
    assert await relaying == 2
    assert await stream_ids(bus) == [e.id for e in events]
    assert await unpublished(pool) == []


async def test_a_second_relay_neither_takes_nor_overtakes_the_rows_of_one_waiting(
    pool: asyncpg.Pool, stalling_bus: _Publishing, proxy: TcpProxy, bus: Bus
) -> None:
    first = [cancel_event("j1"), cancel_event("j2")]
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *first)

    proxy.freeze()
    try:
        waiting = asyncio.create_task(OutboxRelay(pool, stalling_bus, batch=2).relay_once())
        async with asyncio.timeout(30):
            await stalling_bus.started.wait()
        later = cancel_event("j3")
        async with pool.acquire() as conn, conn.transaction():
            await enqueue(conn, later)
        # Another replica's relay: the first two are claimed, and the third may not go first.
        assert await OutboxRelay(pool, bus).relay_once() == 0
        assert await stream_ids(bus) == []
    finally:
        proxy.restore()
    assert await waiting == 2
    assert await OutboxRelay(pool, bus).relay_once() == 1
    assert await stream_ids(bus) == [e.id for e in [*first, later]]
    assert await unpublished(pool) == []


async def test_the_rows_of_a_relay_gone_for_good_are_published_once_its_claim_ran_out(
    pool: asyncpg.Pool, stalling_bus: _Publishing, proxy: TcpProxy, bus: Bus
) -> None:
    events = [cancel_event("j1"), cancel_event("j2")]
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events)

    proxy.freeze()
    try:
        gone = asyncio.create_task(OutboxRelay(pool, stalling_bus).relay_once())
        async with asyncio.timeout(30):
            await stalling_bus.started.wait()
        # Its process hangs: the claim runs out (made to, rather than waited for).
        await pool.execute("UPDATE outbox SET claimed_until = now() - interval '1 second'")
        assert await OutboxRelay(pool, bus).relay_once() == 2
        assert await stream_ids(bus) == [e.id for e in events]
        assert await unpublished(pool) == []
    finally:
        proxy.restore()
    # It comes back after all: its publish is a duplicate JetStream drops.
    assert await gone == 2
    assert await stream_ids(bus) == [e.id for e in events]


async def test_relays_of_three_replicas_at_once_keep_the_order_and_publish_each_once(
    pool: asyncpg.Pool, bus: Bus, database_url: str
) -> None:
    """Three replicas' relays running together while events are committed one after
    another: with rows locked through the publish, a second relay skipped the rows a
    first one held and published the ones after them first."""
    settings = DatabaseSettings(url=database_url)
    async with open_pool(settings, "t") as second, open_pool(settings, "t") as third:
        stop = asyncio.Event()
        relays = [
            asyncio.create_task(OutboxRelay(p, bus, batch=7, idle_poll_s=0.01).run(stop))
            for p in (pool, second, third)
        ]
        events = [cancel_event(f"j{i}") for i in range(120)]
        try:
            for i in range(0, len(events), 3):
                async with pool.acquire() as conn, conn.transaction():
                    await enqueue(conn, *events[i : i + 3])
            async with asyncio.timeout(60):  # a guard, not a timing assertion
                while await unpublished(pool):
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*relays)
    assert await stream_ids(bus) == [e.id for e in events]
