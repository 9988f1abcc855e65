"""Registering, deleting and aliasing model versions: the rules both the event handler and
the HTTP API go through.

Contract:
- A version is registered in two steps. ``copy_in`` copies the committed checkpoint
  server-side to the registry's own key ``registry/<team>/<model>/<version id>/checkpoint.pt``
  and checks the copy's size and sha256 against what the job committed
  (``artifacts.copy_verified``); it takes minutes for a large model, so it runs holding no
  connection of the registry's pool and no transaction (the HTTP route before it opens
  its transaction, the event handler in its ``prepare`` step, ``shared.inbox``). Each call
  copies to a new key, so it is safe to repeat. ``record`` then, on the caller's connection
  and transaction, numbers the version under the model's row lock, stores it and puts
  ``model.registered`` in the outbox; it refuses (``ValueError``) a copy made for another
  team, model or checkpoint. The copies of a transaction that raised (rolled back, so
  no version holds them) are deleted after it, holding no connection (``Unrecorded``); a
  copy never recorded otherwise (the job was registered meanwhile, a commit that failed
  and may have committed) is an unreferenced object the storage collector frees after its
  grace period.
- ``delete_version`` refuses (``AliasInUse``) while any alias points at the version; else
  the version becomes a tombstone (its number is never reused) in the caller's
  transaction, and ``free_objects`` — called after that commits — removes its objects and
  says what it freed. A version registered before the registry kept copies owns no object:
  nothing is freed (its artifact is the job's checkpoint).
- ``delete_model`` refuses (``ModelInUse``, naming them) while the model has live versions;
  else it marks the model deleted in the caller's transaction: its name is free for a new
  model, its tombstones and their lineage stay (docs/models.md, "Deleting a model"). It
  has nothing to free: its versions' deletions did, and the storage collector frees what a
  failed free left (a deleted version's key is referenced by no live version).
- ``move_alias`` points an alias at a live version of the model under the model's row
  lock, appending the move (who, from, to, when) to ``model_alias_moves``. A model has at
  most ``MAX_ALIASES`` aliases: every model listing and detail carries all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.registry import artifacts, domain, names
from trainyard_platform.services.registry import model_repository as models_repo
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry.domain import ModelVersion, Origin, Run
from trainyard_platform.shared import outbox
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import CheckpointRef
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.storage import ObjectStore

MAX_ALIASES = 100
"""The most aliases a model may have (100; a new one past it is refused, moving or deleting
one still works): the model's detail and each model of ``GET /v1/models`` carry all of them
in one body (``GET .../aliases`` pages them)."""

log = logging.getLogger(__name__)

SOURCE = "trainyard/registry"
Transfer = Callable[..., Awaitable[Any]]
"""Runs a blocking ``fn(*args)`` off the event loop and answers its result."""
ARTIFACT_FILE = "checkpoint.pt"


class AliasInUse(Exception):
    """The version cannot be deleted: aliases point at it (answered 409)."""


class ParentInUse(Exception):
    """The version cannot be deleted: a live version was fine-tuned from it, or a job that
    has not ended (waiting to start or running) fine-tunes from it (answered 409)."""


class ModelInUse(Exception):
    """The model cannot be deleted: it has live versions (answered 409)."""


SHOWN_VERSIONS = 10
"""The most live versions a refusal to delete a model names."""
SHOWN_CHILDREN = 10
"""The most versions and jobs made from a version that a refusal to delete it names."""


class VersionGone(Exception):
    """The version was deleted; an alias cannot point at it (answered 409)."""


@dataclass(frozen=True)
class Registration:
    """What a new version is made of, besides its number (given under the lock)."""

    team: str
    model: str
    project: str
    job_id: str
    final: Run
    runs: list[Run]
    checkpoint: CheckpointRef
    metrics: dict[str, float]
    origin: Origin
    created_by: str
    tags: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Freed:
    objects: int
    bytes: int


@dataclass(frozen=True)
class Copy:
    """A committed checkpoint copied and verified to a new version's own key (``copy_in``),
    for a version of ``team``/``model``."""

    version_id: str
    key: str
    team: str
    model: str
    checkpoint: CheckpointRef

    def fits(self, what: Registration) -> bool:
        """Whether this copy is the one ``what`` needs: its checkpoint, at its model's key."""
        return (self.team, self.model, self.checkpoint) == (what.team, what.model, what.checkpoint)


async def copy_in(store: ObjectStore, what: Registration, transfer: Transfer | None = None) -> Copy:
    """Copy ``what``'s checkpoint to a new version's own key and verify it (module
    docstring); raises ``artifacts.SourceOutsideStore``, ``artifacts.ArtifactMismatch`` or
    ``artifacts.CheckpointGone`` when it cannot be registered. ``transfer`` runs the
    copy (``transfers.Transfers.run`` for a caller's team, which may refuse it); without
    one, ``asyncio.to_thread``. Call it holding no connection of the registry's pool and no
    transaction: it takes as long as the artifact is large, and a ``transfer`` takes its
    place through that pool (``shared.slots``)."""
    version_id = str(uuid.uuid4())
    key = names.artifact_key(what.team, what.model, version_id, ARTIFACT_FILE)
    source = artifacts.source_key(store, what.checkpoint.uri, what.job_id)
    expected = artifacts.Digest(what.checkpoint.size_bytes, what.checkpoint.sha256)
    await (transfer or asyncio.to_thread)(artifacts.copy_verified, store, source, key, expected)
    return Copy(version_id, key, what.team, what.model, what.checkpoint)


async def record(
    conn: asyncpg.Connection, store: ObjectStore, what: Registration, now: datetime, copied: Copy
) -> ModelVersion:
    """Number, store and announce the version ``copied`` holds, on the caller's connection
    and transaction (module docstring). It deletes nothing when it fails: the caller frees
    the copy after its transaction (``Unrecorded``). ``ValueError`` (nothing done) when
    ``copied`` was not made for ``what``."""
    if not copied.fits(what):
        raise ValueError(
            f"the copy {copied.key} is not of {what.team}/{what.model}'s checkpoint "
            f"{what.checkpoint.uri}"
        )
    version_id, key = copied.version_id, copied.key
    model_id, latest = await repo.lock_model(conn, what.team, what.model, now, what.project)
    version = ModelVersion(
        id=version_id,
        team=what.team,
        model_name=what.model,
        version=domain.next_version(latest),
        job_id=what.job_id,
        allocation_id=what.final.allocation_id,
        artifact=what.checkpoint.model_copy(update={"uri": store.uri_for(key)}),
        metrics=what.metrics,
        lineage=domain.build_lineage(what.final, what.runs),
        registered_at=now,
        origin=what.origin,
        source_uri=what.checkpoint.uri,
        artifact_key=key,
        tags=what.tags,
        description=what.description,
        created_by=what.created_by,
    )
    await repo.insert_version(conn, model_id, version)
    registered: Payload = version.to_event()
    await outbox.enqueue(conn, Envelope.wrap(registered, source=SOURCE, subject=what.job_id))
    log.info(
        "registered %s/%s v%d from job %s (%s, copied to %s)",
        version.team,
        version.model_name,
        version.version,
        version.job_id,
        what.checkpoint.uri,
        key,
    )
    return version


class Unrecorded:
    """The copies a transaction was to record, freed if that transaction raised.

    ``inside()`` wraps the transaction's body: an exception raised there rolls the
    transaction back, so no version holds the copies. ``free()``, awaited after the
    connection went back to the pool, then deletes them (one thread for all; a failure to
    delete is logged, the storage collector frees what it left). It deletes nothing when the
    body did not raise: the transaction committed, or its commit failed and may have
    committed, so a version may hold them."""

    def __init__(self, store: ObjectStore | None, copies: Iterable[Copy]) -> None:
        """``store``: where the copies are (None: no store, so no copies)."""
        self._store = store
        self._keys = [c.key for c in copies]
        self._rolled_back = False

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._rolled_back = True
            raise

    async def free(self) -> None:
        """Delete the copies if the body raised (see the class). Call it holding no
        connection of the registry's pool."""
        if not self._rolled_back or not self._keys or self._store is None:
            return
        keys, self._keys = self._keys, []
        try:
            await asyncio.to_thread(_delete_all, self._store, keys)
        except Exception as exc:
            log.warning(
                "unrecorded copies %s not deleted (the collector frees them): %s", keys, exc
            )


def _delete_all(store: ObjectStore, keys: list[str]) -> None:
    for key in keys:
        store.delete(key)


async def delete_version(
    conn: asyncpg.Connection, model_id: int, version: ModelVersion, actor: str, now: datetime
) -> bool:
    """Tombstone ``version`` (the model's row locked by the caller); ``AliasInUse`` while an
    alias points at it, ``ParentInUse`` (naming them) while a live version was fine-tuned
    from it or a job that has not ended (admitted and waiting, or running) fine-tunes from
    it (a lineage edge needs its artifact). False when it was deleted already."""
    pointing = await models_repo.aliases_of_version(conn, model_id, version.version)
    if pointing:
        quoted = [repr(a) for a in pointing]
        which = (
            f"alias {quoted[0]} points at; move or delete it first"
            if len(quoted) == 1
            else f"aliases {', '.join(quoted[:-1])} and {quoted[-1]} point at; move or delete "
            "them first"
        )
        raise AliasInUse(
            f"version {version.version} of {version.team}/{version.model_name} is what {which}"
        )
    # A lineage edge needs it: a live version made by a job that fine-tuned from it, or a
    # job fine-tuning from it that has not ended, from its admission on (waiting or running,
    # ``job_inputs``).
    rows = await conn.fetch(
        """SELECT m.team || '/' || m.name || ' v' || v.version AS what FROM job_parents p
           JOIN model_versions v ON v.job_id = p.job_id AND v.deleted_at IS NULL
           JOIN models m ON m.id = v.model_id
           WHERE p.parent_version_id = $1
           UNION ALL
           SELECT CASE WHEN t.status = 'running' THEN 'running job ' || p.job_id
                       ELSE 'waiting job ' || p.job_id || ' (admitted, not started)' END
           FROM job_parents p LEFT JOIN tracked_jobs t ON t.job_id = p.job_id
           WHERE p.parent_version_id = $1 AND p.ended_at IS NULL
           LIMIT $2""",
        uuid.UUID(version.id),
        SHOWN_CHILDREN + 1,
    )
    if rows:
        children = [r["what"] for r in rows[:SHOWN_CHILDREN]]
        if len(rows) > SHOWN_CHILDREN:
            children.append("more")
        listed = (
            children[0] if len(children) == 1 else f"{', '.join(children[:-1])} and {children[-1]}"
        )
        raise ParentInUse(
            f"version {version.version} of {version.team}/{version.model_name} is the parent "
            f"of {listed} (fine-tuned from it); delete the versions made from it, and wait for "
            "the jobs to end (or cancel them), first"
        )
    return await models_repo.mark_deleted(conn, model_id, version.version, actor, now)


async def delete_model(
    conn: asyncpg.Connection, model_id: int, team: str, name: str, actor: str, now: datetime
) -> int:
    """Delete model ``team/name`` (its row locked by the caller): ``ModelInUse`` naming its
    live versions while it has any; else its aliases (none can point at a deleted version;
    removed as moves, should one) and grants go, the row is marked deleted (``deleted_at``,
    ``deleted_by``) so its name is free, and the versions' tombstones stay, with every
    lineage edge to them. Returns how many tombstones it has. Nothing of the store is left
    to do: each version's deletion freed its objects, and what a failed free left is no
    live version's, which the storage collector frees."""
    live = [
        int(r["version"])
        for r in await conn.fetch(
            "SELECT version FROM model_versions WHERE model_id = $1 AND deleted_at IS NULL "
            "ORDER BY version",
            model_id,
        )
    ]
    if live:
        shown = ", ".join(str(v) for v in live[:SHOWN_VERSIONS])
        more = f" and {len(live) - SHOWN_VERSIONS} more" if len(live) > SHOWN_VERSIONS else ""
        word = "version" if len(live) == 1 else "versions"
        raise ModelInUse(
            f"model {team}/{name} has {len(live)} live {word} ({shown}{more}): delete "
            f"{'it' if len(live) == 1 else 'them'} first (trainyard model rm {team}/{name} "
            "VERSION), then the model"
        )
    for alias in await models_repo.aliases(conn, model_id):
        await models_repo.remove_alias(conn, model_id, alias, actor, now)
    await conn.execute("DELETE FROM model_grants WHERE model_id = $1", model_id)
    await conn.execute(
        "UPDATE models SET deleted_at = $2, deleted_by = $3 WHERE id = $1 AND deleted_at IS NULL",
        model_id,
        now,
        actor,
    )
    return int(
        await conn.fetchval("SELECT count(*) FROM model_versions WHERE model_id = $1", model_id)
    )


def free_objects(store: ObjectStore, version: ModelVersion) -> Freed:
    """Remove the objects ``version`` owns (blocking; after its tombstone committed)."""
    if version.artifact_key is None:
        return Freed(0, 0)
    folder = version.artifact_key.rpartition("/")[0] + "/"
    objects = 0
    freed_bytes = 0
    for key in store.list(folder):
        store.delete(key)
        objects += 1
        if key == version.artifact_key:
            freed_bytes += version.artifact.size_bytes
    return Freed(objects, freed_bytes)


async def move_alias(
    conn: asyncpg.Connection,
    model_id: int,
    alias: str,
    target: ModelVersion,
    actor: str,
    now: datetime,
) -> int | None:
    """Point ``alias`` at ``target`` (the model's row locked by the caller); the version it
    pointed at before. ``VersionGone`` when ``target`` is deleted; ``RequestInvalid`` on
    ``alias`` for a new alias of a model that has ``MAX_ALIASES`` already."""
    if target.deleted_at is not None:
        raise VersionGone(
            f"version {target.version} of {target.team}/{target.model_name} was deleted"
        )
    aliases = await models_repo.aliases(conn, model_id)
    if alias not in aliases and len(aliases) >= MAX_ALIASES:
        raise RequestInvalid.one(
            "alias",
            f"model {target.team}/{target.model_name} has {len(aliases)} aliases, the most a "
            f"model may have is {MAX_ALIASES}: move or delete one of them",
        )
    return await models_repo.set_alias(conn, model_id, alias, target.version, actor, now)
