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


async def _audit(conn: asyncpg.Connection, target: str, at: datetime) -> None:
    await conn.execute(
        "INSERT INTO audit_log (at, actor, role, action, target) VALUES ($1, 'ops', 'operator', "
        "'put queue', $2)",
        at,
        target,
    )


async def test_audit_entries_older_than_their_retention_go_in_batches(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        for i in range(5):
            await _audit(conn, f"old-{i}", NOW - timedelta(days=401))
        await _audit(conn, "within", NOW - timedelta(days=399))
        await _audit(conn, "today", NOW)

    kept = await Retention(pool, horizon_hours=168, batch=2).prune_once(NOW)
    pruned = await Retention(pool, horizon_hours=168, batch=2, audit_days=400).prune_once(NOW)

    # 0 (the default) keeps the audit log forever.
    assert kept == Pruned(inbox=0, outbox=0, audit=0)
    assert pruned == Pruned(inbox=0, outbox=0, audit=5)
    async with pool.acquire() as conn:
        left = await conn.fetch("SELECT target FROM audit_log ORDER BY id")
    assert [r["target"] for r in left] == ["within", "today"]


async def test_the_audit_log_refuses_any_other_delete(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await _audit(conn, "last-month", NOW - timedelta(days=29))
        await _audit(conn, "last-year", NOW - timedelta(days=365))
        # No cutoff named: refused, however old the entry.
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM audit_log WHERE target = 'last-year'")
        # A cutoff that spares the entry: refused.
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            async with conn.transaction():
                await conn.execute(
                    "SELECT set_config('trainyard.audit_prune_before', $1, true)",
                    (NOW - timedelta(days=400)).isoformat(),
                )
                await conn.execute("DELETE FROM audit_log WHERE target = 'last-year'")
        # Whatever the cutoff, an entry of the last 30 days stays.
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            async with conn.transaction():
                await conn.execute(
                    "SELECT set_config('trainyard.audit_prune_before', $1, true)",
                    NOW.isoformat(),
                )
                await conn.execute("DELETE FROM audit_log")
        for statement in ("UPDATE audit_log SET actor = 'x'", "TRUNCATE audit_log"):
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute(statement)
        assert await conn.fetchval("SELECT count(*) FROM audit_log") == 2
    with pytest.raises(ValueError, match="audit_days"):
        Retention(pool, horizon_hours=168, audit_days=29)


async def test_audit_retention_counts_by_the_databases_clock(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's clock a minute ahead of the database's (the table's trigger counts 30
    days by the database's): an entry 30 days old less 30 s by the database is no candidate
    of a 30-day retention, so the batch holding it is not refused whole."""

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: object = None) -> Ahead:  # type: ignore[override]
            return super().now(UTC) + timedelta(minutes=1)

    monkeypatch.setattr("trainyard_platform.shared.retention.datetime", Ahead)
    async with pool.acquire() as conn:
        await _audit(conn, "old", NOW - timedelta(days=40))
        await conn.execute(
            "INSERT INTO audit_log (at, actor, role, action, target) VALUES "
            "(now() - interval '30 days' + interval '30 seconds', 'ops', 'operator', "
            "'put queue', 'young')"
        )

    pruned = await Retention(pool, horizon_hours=168, audit_days=30).prune_once(NOW)

    assert pruned.audit == 1
    left = await pool.fetch("SELECT target FROM audit_log ORDER BY id")
    assert [r["target"] for r in left] == ["young"]
