"""What the registry answers when a model, a version, an alias or a dataset asked for is not
there: a 404 that says what is there instead and what to do, so a typo or a deleted version
is not a dead end ("no model 'digit' in team 'vision': did you mean 'digits'?").

Contract:
- Each function returns the ``NotFoundException`` to raise; it reads, never writes.
- A hint is drawn only from what ``reader`` (a team; None: an operator) may read: the names
  of ``team``'s models or datasets it owns or was granted, and the versions and aliases of
  a model or dataset it may read. So a model or dataset the caller may not read answers
  exactly as one that does not exist (docs/models.md, "Who may do what"), hint included.
- ``model``/``dataset``: ``no model 'x' in team 't'``, then the closest readable name
  (``shared.suggest.closest``: a case twin, a typo) if one is close, and where to list them.
- ``version``/``dataset_version``: ``no version N of ...`` or ``version N of ... was
  deleted``, then the latest live version (or that there is none) and where to list them;
  the model's or dataset's own answer when that is what is missing.
- ``alias``: ``no alias 'a' of ...``, then the closest alias, or the model's aliases, or that
  it has none and how to make one.
- ``not_yours``: a change (registering, deleting, aliasing, granting) to a model or dataset
  of a team that is not the caller's: whose it is, the same words whether it exists or not
  (the caller may read it through a grant, or not at all), and no lookup.
- ``checkpoint``: a registration naming a checkpoint its job did not commit (or a job that
  committed none): the latest it committed, or that it committed none yet. Only for a job
  of the caller's team (the route checks that first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg
from litestar.exceptions import NotFoundException

from trainyard_platform.services.registry import grants
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry.domain import latest_checkpoint
from trainyard_platform.shared.suggest import closest

CANDIDATES = 1000
"""The most names a hint compares the asked one with (the first by name)."""
SHOWN_ALIASES = 10
"""The most aliases a message lists."""


async def model(
    conn: asyncpg.Connection, reader: str | None, team: str, name: str
) -> NotFoundException:
    """The 404 of a model ``reader`` may not read or that does not exist."""
    return await _named(conn, grants.MODELS, "model", reader, team, name)


async def dataset(
    conn: asyncpg.Connection, reader: str | None, team: str, name: str
) -> NotFoundException:
    """The 404 of a dataset ``reader`` may not read or that does not exist."""
    return await _named(conn, grants.DATASETS, "dataset", reader, team, name)


async def version(
    conn: asyncpg.Connection, reader: str | None, team: str, name: str, number: int
) -> NotFoundException:
    """The 404 of version ``number`` of model ``team/name`` (not there, or deleted)."""
    if not await grants.MODELS.readable(conn, reader, team, name):
        return await model(conn, reader, team, name)
    row = await conn.fetchrow(
        """SELECT (SELECT max(v.version) FROM model_versions v
                   WHERE v.model_id = m.id AND v.deleted_at IS NULL) AS live,
                  (SELECT v.deleted_at IS NOT NULL FROM model_versions v
                   WHERE v.model_id = m.id AND v.version = $3) AS deleted
           FROM models m WHERE m.team = $1 AND m.name = $2 AND m.deleted_at IS NULL""",
        team,
        name,
        number,
    )
    if row is None:
        return await model(conn, reader, team, name)
    what = f"model {name!r} in team {team!r}"
    head = (
        f"version {number} of {what} was deleted"
        if row["deleted"]
        else f"no version {number} of {what}"
    )
    latest = (
        "it has no live version"
        if row["live"] is None
        else f"its latest live version is {row['live']}"
    )
    return NotFoundException(f"{head}; {latest} (trainyard model show {team}/{name} lists them)")


async def dataset_version(
    conn: asyncpg.Connection, reader: str | None, team: str, name: str, number: int
) -> NotFoundException:
    """The 404 of version ``number`` of dataset ``team/name``."""
    if not await grants.DATASETS.readable(conn, reader, team, name):
        return await dataset(conn, reader, team, name)
    latest = await conn.fetchval(
        "SELECT latest_version FROM datasets WHERE team = $1 AND name = $2", team, name
    )
    if latest is None:
        return await dataset(conn, reader, team, name)
    return NotFoundException(
        f"no version {number} of dataset {name!r} in team {team!r}; its latest version is "
        f"{latest} (trainyard dataset show {team}/{name} lists them)"
    )


async def alias(
    conn: asyncpg.Connection, reader: str | None, team: str, name: str, wanted: str
) -> NotFoundException:
    """The 404 of alias ``wanted`` of model ``team/name``."""
    if not await grants.MODELS.readable(conn, reader, team, name):
        return await model(conn, reader, team, name)
    found = await conn.fetchval(
        "SELECT id FROM models WHERE team = $1 AND name = $2 AND deleted_at IS NULL", team, name
    )
    if found is None:
        return await model(conn, reader, team, name)
    aliases: list[str] = [
        r["alias"]
        for r in await conn.fetch(
            "SELECT alias FROM model_aliases WHERE model_id = $1 ORDER BY alias", found
        )
    ]
    head = f"no alias {wanted!r} of model {name!r} in team {team!r}"
    guess = closest(wanted, aliases)
    if guess is not None:
        return NotFoundException(f"{head}: did you mean {guess!r}?")
    if aliases:
        listed = ", ".join(aliases[:SHOWN_ALIASES]) + (
            ", ..." if len(aliases) > SHOWN_ALIASES else ""
        )
        return NotFoundException(f"{head}; its aliases are {listed}")
    return NotFoundException(
        f"{head}; it has no aliases (trainyard model alias set {team}/{name} {wanted} VERSION "
        "makes one)"
    )


def not_yours(kind: str, team: str, name: str) -> NotFoundException:
    """The 404 of a change to ``team``'s ``kind`` (model, dataset) ``name`` by a caller of
    another team: it says whose it is, existing or not."""
    return NotFoundException(
        f"no {kind} {name!r} in team {team!r} that your team may change: only team {team!r} "
        f"changes its {kind}s (a grant lets another team read them)"
    )


async def checkpoint(conn: asyncpg.Connection, job_id: str, uri: str | None) -> NotFoundException:
    """The 404 of registering job ``job_id``'s checkpoint ``uri`` (None: its latest) when the
    job committed no such checkpoint."""
    latest = latest_checkpoint(await repo.checkpoints_of_job(conn, job_id))
    if latest is None:
        return NotFoundException(
            f"job {job_id!r} has committed no checkpoint yet: a job's runner reports each "
            "checkpoint it commits, and only those can be registered"
        )
    return NotFoundException(
        f"job {job_id!r} has no committed checkpoint {uri!r}; the latest it committed is "
        f"{latest.ref.uri} (step {latest.ref.step}), the one registered when checkpoint_uri "
        "(trainyard model register --checkpoint) is left out"
    )


async def _named(
    conn: asyncpg.Connection,
    table: grants.GrantTable,
    kind: str,
    reader: str | None,
    team: str,
    name: str,
) -> NotFoundException:
    # The names of ``team``'s models (datasets) ``reader`` may read: all of them for its own
    # team or an operator, those granted to it otherwise. The asked name itself is among
    # them only when it is readable and so not missing.
    rows = await conn.fetch(
        f"""SELECT o.name FROM {table.owners} o
            WHERE o.team = $1 AND {table.live} AND ($2::text IS NULL OR o.team = $2
                  OR EXISTS (SELECT 1 FROM {table.grants} g
                             WHERE g.{table.key} = o.id AND g.grantee_team = $2))
            ORDER BY o.name LIMIT $3""",
        team,
        reader,
        CANDIDATES,
    )
    names: Sequence[str] = [r["name"] for r in rows if r["name"] != name]
    # Comparing with many names takes a while: off the event loop.
    guess = await asyncio.to_thread(closest, name, names) if names else None
    head = f"no {kind} {name!r} in team {team!r}"
    listing = f"trainyard {kind} ls lists the {kind}s you may read"
    if guess is not None:
        return NotFoundException(f"{head}: did you mean {guess!r}? ({listing})")
    return NotFoundException(f"{head} ({listing})")
