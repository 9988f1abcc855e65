"""Retention: old inbox and published outbox rows go; recent and unpublished ones stay."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.retention import Pruned, Retention
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=8)


async def _seed(conn: asyncpg.Connection) -> None:
    await conn.executemany(
        "INSERT INTO inbox (consumer, event_id, applied_at) VALUES ('c', $1, $2)",
        [(f"old-{i}", OLD) for i in range(5)] + [("new", NOW)],
    )
    await conn.executemany(
        "INSERT INTO outbox (event_id, subject, body, created_at, published_at) "
        "VALUES ($1, 's', '', $2, $3)",
        [
            ("published-long-ago", OLD, OLD),
            ("published-now", OLD, NOW),
            ("never-published", OLD, None),
        ],
    )


async def test_prunes_what_is_older_than_the_horizon_in_batches(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await _seed(conn)

    pruned = await Retention(pool, horizon_hours=168, batch=2).prune_once(NOW - timedelta(days=7))

    assert pruned == Pruned(inbox=5, outbox=1)
    async with pool.acquire() as conn:
        assert [r["event_id"] for r in await conn.fetch("SELECT event_id FROM inbox")] == ["new"]
        left = await conn.fetch("SELECT event_id FROM outbox ORDER BY event_id")
    assert [r["event_id"] for r in left] == ["never-published", "published-now"]


async def test_the_event_stream_keeps_events_for_the_same_horizon(
    bus: Bus, nats_settings: NatsSettings
) -> None:
    await bus.ensure_streams()

    events = await bus.jetstream.stream_info(nats_settings.stream)
    dead = await bus.jetstream.stream_info(nats_settings.deadletter_stream)

    assert events.config.max_age == nats_settings.retention_hours * 3600
    # Dead letters wait for an operator, but not forever (NatsSettings.deadletter_max_*).
    assert dead.config.max_age == nats_settings.deadletter_max_age_days * 86400
    assert dead.config.max_msgs == nats_settings.deadletter_max_messages
