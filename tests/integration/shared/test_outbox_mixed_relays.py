"""A claiming outbox relay beside one from before the claims (the platform's ``0008``), as
in a rolling upgrade (docs/operations.md, "Upgrade"). The old relay read its rows ``FOR
UPDATE SKIP LOCKED`` in a transaction it held until they were published and marked. A new
relay's claim waits for those row locks (the update of its claim cannot take them), so it
publishes none of the old relay's rows again, but it waits as long as the old relay's round
lasts; past ``TRAINYARD_DATABASE_QUERY_TIMEOUT_SECONDS`` its claim is cancelled, a timeout the
relay takes for PostgreSQL not answering (it tries again)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.integration.shared.outbox_stream import cancel_event, stream_ids, unpublished
from trainyard_platform.shared.bus import POSTGRES_NOT_ANSWERING, Bus, infrastructure_fault
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.outbox import OutboxRelay, enqueue
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

OLD_RELAY_READ = (
    "SELECT seq, event_id, subject, body, headers FROM outbox "
    "WHERE published_at IS NULL AND parked_at IS NULL "
    "ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED"
)
"""The relay's read before the claims (its round's transaction held the rows' locks through
its publish, until it marked them published)."""


@pytest.fixture
async def old_relay(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A connection in the middle of an old relay's round: the unpublished rows read and
    locked, their publish under way."""
    async with pool.acquire() as conn:
        await conn.execute("BEGIN")
        try:
            assert len(await conn.fetch(OLD_RELAY_READ, 100)) == 2
            yield conn
        finally:
            if conn.is_in_transaction():
                await conn.execute("ROLLBACK")


async def _waits_on_a_lock(pool: asyncpg.Pool) -> None:
    """Until a session of this database waits for a lock (the new relay's claim)."""
    while not await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ):
        await asyncio.sleep(0.02)


@pytest.fixture
async def two_events(pool: asyncpg.Pool) -> list[str]:
    events = [cancel_event("j1"), cancel_event("j2")]
    async with pool.acquire() as conn, conn.transaction():
        await enqueue(conn, *events)
    return [e.id for e in events]


async def test_a_new_relay_waits_for_an_old_relays_round_and_publishes_none_of_its_rows_again(
    pool: asyncpg.Pool, bus: Bus, two_events: list[str], old_relay: asyncpg.Connection
) -> None:
    relaying = asyncio.create_task(OutboxRelay(pool, bus).relay_once())
    async with asyncio.timeout(30):
        await _waits_on_a_lock(pool)
    assert not relaying.done()
    # The old relay's publish is acknowledged: it marks its rows and commits.
    await old_relay.execute("UPDATE outbox SET published_at = now() WHERE published_at IS NULL")
    await old_relay.execute("COMMIT")
    assert await relaying == 0
    assert await stream_ids(bus) == []
    assert await unpublished(pool) == []


async def test_past_the_query_timeout_the_new_relays_claim_is_a_database_that_does_not_answer(
    database_url: str,
    pool: asyncpg.Pool,
    bus: Bus,
    two_events: list[str],
    old_relay: asyncpg.Connection,
) -> None:
    settings = DatabaseSettings(url=database_url, query_timeout_seconds=0.5)
    async with open_pool(settings, "t") as short:
        with pytest.raises(TimeoutError) as waited:
            await OutboxRelay(short, bus).relay_once()
    assert (infrastructure_fault(waited.value) or "").startswith(POSTGRES_NOT_ANSWERING)
    await old_relay.execute("ROLLBACK")  # its publish failed: the rows are anyone's again
    assert await OutboxRelay(pool, bus).relay_once() == 2
    assert await stream_ids(bus) == two_events
