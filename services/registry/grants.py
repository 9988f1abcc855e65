"""Grants: the one read-permission mechanism of the registry's team-owned things — models
(``model_grants``, migrations/0009) and datasets (``dataset_grants``, migrations/0007).

Each kind keeps its own table of the same shape — one row per (owned thing, grantee team):
``<key>``, ``grantee_team``, ``granted_by``, ``granted_at`` — and answers by the same rule
through one ``GrantTable``:

- ``reader_of(principal)``: whose rights a read applies, the caller's team (None for an
  operator), for models, datasets and lineage alike.
- ``readable(conn, reader, team, name)``: the owning team, a granted team, or an operator
  (``reader`` None) may read ``team/name``.
- ``grantees(conn, owner_id)``: the teams granted, by name.
- ``grant``/``revoke``: add or remove one row; False when nothing changed.

The table and column names are this module's constants (``MODELS``, ``DATASETS``), never
anything a caller sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from trainyard_platform.shared.identity import Principal


def reader_of(principal: Principal) -> str | None:
    """The team whose rights apply to ``principal``'s reads (None: an operator, who reads
    every team's)."""
    return None if principal.is_operator else principal.team


@dataclass(frozen=True)
class GrantTable:
    grants: str
    """The grant table (``model_grants``)."""
    owners: str
    """The table of the owned things, with ``id``, ``team`` and ``name`` (``models``)."""
    key: str
    """The grant table's reference to ``owners.id`` (``model_id``)."""
    live: str = "TRUE"
    """What an owned thing that still exists is, as SQL on ``o``, its row (a deleted model's
    row stays for its versions' tombstones, but it is read by no one by its name)."""

    async def readable(
        self, conn: asyncpg.Connection, reader: str | None, team: str, name: str
    ) -> bool:
        """Whether ``reader`` (a team; None: an operator) may read ``team/name``."""
        if reader is None or reader == team:
            return True
        found = await conn.fetchval(
            f"""SELECT 1 FROM {self.grants} g JOIN {self.owners} o ON o.id = g.{self.key}
                WHERE o.team = $1 AND o.name = $2 AND g.grantee_team = $3 AND {self.live}""",
            team,
            name,
            reader,
        )
        return found is not None

    async def grantees(self, conn: asyncpg.Connection, owner_id: int) -> list[str]:
        rows = await conn.fetch(
            f"SELECT grantee_team FROM {self.grants} WHERE {self.key} = $1 ORDER BY grantee_team",
            owner_id,
        )
        return [r["grantee_team"] for r in rows]

    async def grant(
        self, conn: asyncpg.Connection, owner_id: int, grantee: str, actor: str, now: datetime
    ) -> bool:
        """Grant ``grantee`` read access; False when it had it already."""
        status = await conn.execute(
            f"""INSERT INTO {self.grants} ({self.key}, grantee_team, granted_by, granted_at)
                VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING""",
            owner_id,
            grantee,
            actor,
            now,
        )
        return bool(status == "INSERT 0 1")

    async def revoke(self, conn: asyncpg.Connection, owner_id: int, grantee: str) -> bool:
        """Take ``grantee``'s read access away; False when it had none."""
        status = await conn.execute(
            f"DELETE FROM {self.grants} WHERE {self.key} = $1 AND grantee_team = $2",
            owner_id,
            grantee,
        )
        return bool(status == "DELETE 1")


MODELS = GrantTable(
    grants="model_grants", owners="models", key="model_id", live="o.deleted_at IS NULL"
)
DATASETS = GrantTable(grants="dataset_grants", owners="datasets", key="dataset_id")

__all__: Sequence[str] = ["DATASETS", "MODELS", "GrantTable"]
