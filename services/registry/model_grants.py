"""Grants on models (docs/models.md, "Grants"): another team may read a model — see it and
its versions, download them, fine-tune from them — only with a grant from the model's team.

The same mechanism as dataset grants (``grants``: one ``GrantTable`` rule over both tables,
docs/datasets.md): one row per (model, grantee team) in ``model_grants`` (migrations/0009),
given and taken by the owning
team's admins or operators through ``PUT``/``DELETE .../grants/{grantee_team}``, answered as
``GrantChange`` and audited. Writes (registering, deleting, aliases, grants) stay the owning
team's.

Contract:
- ``readable(conn, reader, team, name)`` is the one read-permission rule of models: the
  owning team, a granted team, or an operator (``reader`` None); ``version_readable`` is
  the same rule for a version known by its id.
- ``readable_or_404`` raises ``NotFoundException`` for a model the caller may not read,
  exactly as for one that does not exist (``not_found.model``), so existence does not leak.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar

import asyncpg
from pydantic import Field

from trainyard_platform.services.registry import grants, names, not_found
from trainyard_platform.services.registry.schemas import GRANTEE_NULL, ModelSummary
from trainyard_platform.shared.identity import Principal


class ModelDetail(ModelSummary):
    """A model as ``GET /v1/models/{team}/{name}`` answers it."""

    OWNER_ONLY: ClassVar[frozenset[str]] = ModelSummary.OWNER_ONLY | {"grants"}

    grants: list[str] | None = Field(default=None, description=GRANTEE_NULL)
    """The teams granted to read it; shown to its own team and operators (null otherwise)."""


async def readable(conn: asyncpg.Connection, reader: str | None, team: str, name: str) -> bool:
    """Whether ``reader`` (a team; None: an operator) may read model ``team/name``."""
    return await grants.MODELS.readable(conn, reader, team, name)


async def version_readable(
    conn: asyncpg.Connection, reader: str, team: str, version_id: str
) -> bool:
    """Whether team ``reader`` may read the version of id ``version_id`` of a model of
    ``team``: by the model's id, not its name (which may name another model by now)."""
    if reader == team:
        return True
    found = await conn.fetchval(
        """SELECT 1 FROM model_grants g JOIN model_versions v ON v.model_id = g.model_id
           WHERE v.id = $1 AND g.grantee_team = $2""",
        uuid.UUID(version_id),
        reader,
    )
    return found is not None


async def readable_or_404(
    conn: asyncpg.Connection, principal: Principal, team: str, name: str
) -> None:
    """Check the names (422 naming the field), then 404 unless the caller may read it."""
    names.check_model(team, name)
    reader = grants.reader_of(principal)
    if not await readable(conn, reader, team, name):
        raise await not_found.model(conn, reader, team, name)


async def grants_of(conn: asyncpg.Connection, model_id: int) -> list[str]:
    return await grants.MODELS.grantees(conn, model_id)


async def grant(
    conn: asyncpg.Connection, model_id: int, grantee: str, actor: str, now: datetime
) -> bool:
    """Grant ``grantee`` read access; False when it had it already."""
    return await grants.MODELS.grant(conn, model_id, grantee, actor, now)


async def revoke(conn: asyncpg.Connection, model_id: int, grantee: str) -> bool:
    """Take ``grantee``'s read access away; False when it had none."""
    return await grants.MODELS.revoke(conn, model_id, grantee)
