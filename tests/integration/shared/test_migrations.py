"""Every service's migrations apply to an empty database, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard_platform.shared.db import PLATFORM_MIGRATIONS, migrate, migration_files, open_pool
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

SERVICES = Path(__file__).parents[3] / "services"
SERVICE_NAMES = sorted(p.parent.name for p in SERVICES.glob("*/migrations"))


@pytest.mark.parametrize("service", SERVICE_NAMES)
async def test_migrations_apply_to_empty_database_once(service: str, database_url: str) -> None:
    folder = SERVICES / service / "migrations"
    async with open_pool(DatabaseSettings(url=database_url), service) as pool:
        applied = await migrate(pool, service, folder)
        assert applied == [
            *(f"platform/{p.name}" for p in migration_files(PLATFORM_MIGRATIONS)),
            *(f"service/{p.name}" for p in migration_files(folder)),
        ]
        assert applied[0] == "platform/0001_outbox_inbox.sql"
        assert await migrate(pool, service, folder) == []
        async with pool.acquire() as conn:
            tables = await conn.fetchval(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", service
            )
        assert tables >= 3  # schema_migrations, outbox, inbox, and the service's own
