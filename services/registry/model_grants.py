"""Grants on models (docs/models.md, "Grants"): another team may read a model — see it and
its versions, download them, fine-tune from them — only with a grant from the model's team.

The same mechanism as dataset grants (``dataset_repository``, docs/datasets.md): one row per
(model, grantee team) in ``model_grants`` (migrations/0009), given and taken by the owning
team's admins or operators through ``PUT``/``DELETE .../grants/{grantee_team}``, answered as
``GrantChange`` and audited. Writes (registering, deleting, aliases, grants) stay the owning
team's.

Contract:
- ``readable(conn, reader, team, name)`` is the one read-permission rule of models: the
  owning team, a granted team, or an operator (``reader`` None).
- ``readable_or_404`` raises ``NotFoundException`` for a model the caller may not read,
  exactly as for one that does not exist, so existence does not leak.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg
from litestar.exceptions import NotFoundException

from services.registry import names
from services.registry.schemas import ModelSummary
from shared.identity import Principal


class ModelDetail(ModelSummary):
    """A model as ``GET /v1/models/{team}/{name}`` answers it."""

    grants: list[str] | None = None
    """The teams granted to read it; shown to its own team and operators (null otherwise)."""


def reader_of(principal: Principal) -> str | None:
    """The team whose rights apply (None: an operator, who reads every model)."""
    return None if principal.is_operator else principal.team


async def readable(conn: asyncpg.Connection, reader: str | None, team: str, name: str) -> bool:
    """Whether ``reader`` (a team; None: an operator) may read model ``team/name``."""
    if reader is None or reader == team:
        return True
    found = await conn.fetchval(
        """SELECT 1 FROM model_grants g JOIN models m ON m.id = g.model_id
           WHERE m.team = $1 AND m.name = $2 AND g.grantee_team = $3""",
        team,
        name,
        reader,
    )
    return found is not None


async def readable_or_404(
    conn: asyncpg.Connection, principal: Principal, team: str, name: str
) -> None:
    """Check the names (422 naming the field), then 404 unless the caller may read it."""
    names.check_model(team, name)
    if not await readable(conn, reader_of(principal), team, name):
        raise NotFoundException(f"no model {name!r} in team {team!r}")


async def grants_of(conn: asyncpg.Connection, model_id: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT grantee_team FROM model_grants WHERE model_id = $1 ORDER BY grantee_team",
        model_id,
    )
    return [r["grantee_team"] for r in rows]


async def grant(
    conn: asyncpg.Connection, model_id: int, grantee: str, actor: str, now: datetime
) -> bool:
    """Grant ``grantee`` read access; False when it had it already."""
    status = await conn.execute(
        """INSERT INTO model_grants (model_id, grantee_team, granted_by, granted_at)
           VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING""",
        model_id,
        grantee,
        actor,
        now,
    )
    return bool(status == "INSERT 0 1")


async def revoke(conn: asyncpg.Connection, model_id: int, grantee: str) -> bool:
    """Take ``grantee``'s read access away; False when it had none."""
    status = await conn.execute(
        "DELETE FROM model_grants WHERE model_id = $1 AND grantee_team = $2",
        model_id,
        grantee,
    )
    return bool(status == "DELETE 1")
