"""Fixtures for the shared library's integration tests: a clean bus and a fresh schema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.settings import DatabaseSettings

EMPTY = Path(__file__).parent / "no-migrations"


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on schema ``t`` of a fresh database, with the platform tables migrated."""
    async with open_pool(DatabaseSettings(url=database_url), "t") as p:
        await migrate(p, "t", EMPTY)
        yield p
