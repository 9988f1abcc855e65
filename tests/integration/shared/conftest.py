"""Fixtures for the shared library's integration tests: a clean bus and a fresh schema."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.js.errors import NotFoundError

from shared.bus import Bus
from shared.db import migrate, open_pool
from shared.settings import DatabaseSettings, NatsSettings

EMPTY = Path(__file__).parent / "no-migrations"


@pytest.fixture
async def nats_settings(nats_url: str) -> NatsSettings:
    """Settings for a bus whose streams start empty (tests share one server)."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for stream in ("TRAINYARD", "TRAINYARD_DEADLETTER"):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(stream)
    await nc.close()
    return NatsSettings(url=nats_url, max_deliver=3, retry_delay_seconds=0.05, ack_wait_seconds=5)


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    async with Bus.connect(nats_settings, "test") as connected:
        yield connected


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on schema ``t`` of a fresh database, with the platform tables migrated."""
    async with open_pool(DatabaseSettings(url=database_url), "t") as p:
        await migrate(p, "t", EMPTY)
        yield p
