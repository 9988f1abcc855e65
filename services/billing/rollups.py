"""``python -m trainyard_platform.services.billing.rollups``: recompute billing's cost rollups from its ledger.

The rollups are derived data (``services.billing.ledger``): this empties them and folds
every ledger entry in again, in one transaction that holds the rollups locked, so billing
may keep running (its appends wait for the rebuild) and a report reads either the old
rollups or the new ones, never a mix. Reads ``TRAINYARD_DATABASE_*`` only. Prints how many
entries were folded in; exit status 0, or 2 for a bad setting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from trainyard_platform.services.billing import ledger_repository as ledger
from trainyard_platform.services.billing.service import MIGRATIONS, NAME
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.runtime import settings_or_exit
from trainyard_platform.shared.settings import DatabaseSettings


async def rebuild(database: DatabaseSettings) -> int:
    """Rebuild the rollups of billing's schema in ``database``; the entries folded in."""
    async with open_pool(database, NAME, long_statements=True) as pool:
        await migrate(pool, NAME, MIGRATIONS)
        async with pool.acquire() as conn, conn.transaction():
            return await ledger.rebuild_rollups(conn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.services.billing.rollups",
        description="Recompute billing's hour, day and month cost rollups from its ledger "
        "(the database from TRAINYARD_DATABASE_URL).",
    )
    parser.parse_args(argv)
    folded = asyncio.run(rebuild(settings_or_exit(parser.prog, DatabaseSettings)))
    print(f"cost rollups rebuilt from {folded} ledger entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
