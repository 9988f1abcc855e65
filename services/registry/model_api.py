"""The model lifecycle over HTTP (docs/models.md): listing models, registering, deleting and
downloading versions, and aliases.

- ``GET /v1/models?team&project&after&limit&granted``: models, ordered by team and name,
  keyset-paged (``shared.paging``: ``next`` while more follow): the caller's team's (``team``: another team's that it granted to the
  caller's; operators: any team's, every team's without ``team``); ``granted=true``: the
  models other teams granted to the caller's team (``team`` narrows to one owner). Unknown
  or repeated parameters answer 422 naming them. Another team's ``project`` is null to a
  grantee and matches no ``project`` filter.
- ``GET /v1/models/{team}/{name}``: one model with its aliases, and its ``ETag``
  (``model_tag``; to a grantee, which may not write it, a tag of what it is shown).
- ``DELETE /v1/models/{team}/{name}`` (members): 409 naming its live versions while it has
  any; else the model is deleted (``models.delete_model``: its name is free, its versions'
  tombstones and their lineage stay) and the answer says how many tombstones it kept. It
  asks the store nothing, however many versions the model had: each version's deletion
  freed its objects, and the storage collector frees what a failed free left. Conditional as the
  version's delete, on ``model_tag``: with ``If-Match: <it>`` only the model as it was read
  (412 after a registration, a deletion of a version, an alias move, or a grant or revoke
  since: everything the deletion removes or changes).
- ``POST /v1/models/{team}/{name}/versions`` (members): register a committed checkpoint;
  answers the version as ``GET`` does, with its ``cost``. A checkpoint the store no longer
  holds (freed by retention since it was committed) is a 409 naming ``checkpoint_uri``, or
  ``job_id`` when that chose it (its latest).
- ``DELETE /v1/models/{team}/{name}/versions/{version}`` (members): 409 while an alias
  points at it; else frees its objects and says what it freed. Conditional
  (``shared.http_app.Preconditions``, with the model's row locked) on ``version_tag``, the
  ``ETag`` of ``GET .../versions/{version}``: with ``If-Match: <it>`` only the
  registration that was read is deleted (412 otherwise).
- ``GET .../versions/by-alias/{alias}``: the version an alias points at.
- ``GET .../versions/{version}/download``: a presigned URL of the version's one object,
  after its sha256 is verified (S3); on a local store, the ``.../content`` route instead.
- ``GET .../versions/{version}/content``: the bytes, verified before the first is sent.
- A registration, ``download`` and ``content`` each read the whole artifact: at most
  ``transfers.per_team`` of the caller's team run at once across the registry's replicas
  (429), ``transfers.most`` in all on this one (503), both with ``Retry-After``
  (``transfers``).
- ``GET .../aliases?limit&after`` (a page by name, ``next``), ``GET``, ``PUT`` and
  ``DELETE .../aliases/{alias}`` (writes: members), ``GET .../aliases/{alias}/moves``:
  aliases and their append-only history. ``GET`` of an alias answers its ``ETag``
  (``alias_tag``: of the model and the version it points at), and ``PUT`` and ``DELETE`` are
  conditional on it (``shared.http_app.Preconditions``, judged with the model's row
  locked): ``If-Match: <ETag>`` moves or deletes the alias only while it points where it
  was read (412 naming what changed when another member moved it since), ``If-None-Match:
  *`` makes a ``PUT`` only create the alias, ``If-Match: *`` only move an existing one; a
  ``DELETE`` of none is 404 whatever its conditions. The answer of a ``PUT`` carries the
  new ``ETag``.
- ``PUT``/``DELETE /v1/models/{team}/{name}/grants/{grantee_team}`` (admins of ``team``,
  operators): let another team read the model, or stop it; audited (``model_grants``).

Reads need any role of the team or of a team the model is granted to (``model_grants``),
writes ``member`` of the model's own team; operators reach every team. A model the caller
may not read answers 404 like one that does not exist. Every name in a path or body is
checked (``names``) before anything uses it: 422 naming the field. A read answer shows a
granted team the model, not the owner's work behind it (``grantee_view.shown``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from email.utils import formatdate
from functools import partial
from pathlib import Path
from typing import Annotated, Any, cast

import asyncpg
from litestar import Request, Response, delete, get, post, put
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.enums import MediaType
from litestar.exceptions import HTTPException, NotFoundException, PermissionDeniedException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, PathParameter, QueryParameter
from litestar.response import File

from trainyard_platform.services.registry import (
    artifacts,
    grantee_view,
    grants,
    model_cost,
    model_grants,
    models,
    names,
    not_found,
)
from trainyard_platform.services.registry import model_repository as models_repo
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry.artifacts import Digest
from trainyard_platform.services.registry.dataset_schemas import GrantChange
from trainyard_platform.services.registry.domain import ModelVersion, latest_checkpoint
from trainyard_platform.services.registry.grantee_view import shown
from trainyard_platform.services.registry.model_cost import CostedVersion
from trainyard_platform.services.registry.model_grants import ModelDetail
from trainyard_platform.services.registry.model_repository import ModelRow
from trainyard_platform.services.registry.schemas import (
    AliasChange,
    AliasHistory,
    AliasList,
    AliasMoveRead,
    AliasRead,
    AliasRequest,
    Download,
    Freed,
    ModelDeleted,
    ModelPage,
    ModelSummary,
    RegisterRequest,
)
from trainyard_platform.services.registry.transfers import Transfers
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.access import Teams, needs
from trainyard_platform.shared.http_app import (
    ETAG,
    Conditions,
    body_is_work,
    entity_tag,
    error_responses,
    head_answer,
    head_of_get,
    json_request_body,
    none_match,
    tagged,
)
from trainyard_platform.shared.http_errors import (
    Conflicting,
    FieldError,
    RequestInvalid,
    parse_body,
    read_json_body,
)
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.storage import ObjectNotFound, ObjectStore

Caller = NamedDependency[Principal]
TeamCheck = NamedDependency[Teams]
Version = Annotated[int, PathParameter(ge=1, le=2**31 - 1)]  # the column's integer
Clock = Callable[[], datetime]
BODY_MAX_BYTES = 64 * 1024
PAGE_MAX = 500
MODELS = names.by_name("GET /v1/models")
ALIASES = paging.Cursor("GET /v1/models/{team}/{name}/aliases", paging.text)
"""A page's position in one model's aliases (``of`` the model: ``of_model``)."""
MOVES = paging.Cursor("GET .../aliases/{alias}/moves", paging.integer)
"""A page's position in one alias's moves (``of`` the model and the alias: ``of_model``)."""
LIST_PARAMETERS = frozenset({"team", "after", "limit", "project", "granted"})

log = logging.getLogger(__name__)


class StorageUnavailable(Exception):
    """The registry runs without an object store (answered 503)."""


class NotOwned(Exception):
    """The version predates the registry's own copies: nothing to serve (answered 409)."""


STATUSES: dict[type[Exception], int] = {
    models.AliasInUse: 409,
    models.ModelInUse: 409,
    models.ParentInUse: 409,
    models.VersionGone: 409,
    artifacts.ArtifactMismatch: 409,
    artifacts.ArtifactCorrupt: 409,
    artifacts.SourceOutsideStore: 409,
    NotOwned: 409,
    StorageUnavailable: 503,
}
"""The status each of this module's errors answers (``service_app``'s ``statuses``)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def content_headers(version: ModelVersion, name: str) -> dict[str, str]:
    """The headers ``GET .../content`` and its ``HEAD`` both answer, all of the version
    (none of the copy ``content`` fetched and verified, whose file's path and time change
    on every request): its name, sha256, registration time, and ``ETag``, the strong tag of
    its bytes (their sha256: a version's artifact never changes), for ``If-None-Match``."""
    sha256 = version.artifact.sha256
    return {
        "Content-Disposition": f'attachment; filename="{name}-v{version.version}.pt"',
        "X-Trainyard-Sha256": sha256,
        "ETag": f'"{sha256}"',
        "Last-Modified": formatdate(version.registered_at.timestamp(), usegmt=True),
    }


def of_model(model_id: int, *more: str) -> str:
    """What names a list of one model's (``of`` of its cursor, ``shared.paging``): the
    model's id, never its name, which a model made again under a deleted one's takes over,
    and ``more`` (an alias); so a cursor of a deleted model pages nothing of the new one."""
    return "/".join(("model", str(model_id), *more))


def version_tag(version: ModelVersion) -> str:
    """The ETag of a model version: of the registration it is (its id; a version is never
    changed, only deleted)."""
    return entity_tag({"id": version.id})


async def free_after_commit(store: ObjectStore | None, version: ModelVersion) -> models.Freed:
    """Free the objects of ``version``, whose tombstone committed: what was freed. The
    deletion is done whatever happens here: a store that fails leaves its objects to the
    storage collector (logged at WARNING), and the answer says only what was freed, never
    an error for a deletion that committed."""
    if store is None:
        return models.Freed(0, 0)
    try:
        return await asyncio.to_thread(models.free_objects, store, version)
    except Exception as exc:
        log.warning(
            "model %s/%s: the objects of deleted version %d are left to the storage "
            "collector: freeing them failed (%s: %s)",
            version.team,
            version.model_name,
            version.version,
            type(exc).__name__,
            exc,
        )
        return models.Freed(0, 0)


def model_tag(model: ModelRow, grantees: Sequence[str]) -> str:
    """The ETag of a model: of its row (a model deleted and made again under its name is
    another) and of everything its deletion removes or changes: its versions (a
    registration and a deletion of a version each change it), its aliases and the teams
    it is granted to (``grantees``; a grant or a revoke changes it)."""
    return entity_tag(
        {
            "id": model.id,
            "latest_version": model.latest_version,
            "versions": model.versions,
            "aliases": model.aliases,
            "grants": sorted(grantees),
        }
    )


def alias_tag(model_id: int, version: int | None) -> str | None:
    """The ETag of an alias of model ``model_id`` pointing at ``version`` (None: there is no
    such alias). Of the model's id too: the alias of the same name and version of a model
    made again under a deleted one's name is another alias."""
    return None if version is None else entity_tag({"model": model_id, "version": version})


def model_routes(
    pool: asyncpg.Pool,
    store: ObjectStore | None,
    download_url_seconds: int,
    transfers: Transfers,
    clock: Clock = utc_now,
) -> list[HTTPRouteHandler]:
    """The routes of the module docstring over the registry's pool and object store; every
    artifact copy or read runs within ``transfers``, counted for the caller's team."""

    def transfer(principal: Principal) -> models.Transfer:
        return partial(transfers.run, principal.team)

    def storage() -> ObjectStore:
        if store is None:
            raise StorageUnavailable("the registry has no object store configured")
        return store

    def visible(principal: Principal, team: str, name: str) -> None:
        """For writes: the model's own team (or an operator), else 404."""
        names.check_model(team, name)
        if not principal.may_see_team(team):
            raise not_found.not_yours("model", team, name)

    readable = model_grants.readable_or_404

    async def live_version(
        conn: asyncpg.Connection, principal: Principal, team: str, name: str, number: int
    ) -> ModelVersion:
        found = await repo.model_version(conn, team, name, number)
        if found is None or found.deleted_at is not None:
            raise await not_found.version(conn, grants.reader_of(principal), team, name, number)
        return found

    async def no_model(
        conn: asyncpg.Connection, principal: Principal, team: str, name: str
    ) -> NotFoundException:
        return await not_found.model(conn, grants.reader_of(principal), team, name)

    async def no_alias(
        conn: asyncpg.Connection, principal: Principal, team: str, name: str, alias: str
    ) -> NotFoundException:
        return await not_found.alias(conn, grants.reader_of(principal), team, name, alias)

    @get(
        "/v1/models",
        summary="A team's models, or those other teams granted to it (operators: every team's)",
        responses=error_responses(422),
    )
    async def list_models(
        request: Request[Any, Any, Any],
        principal: Caller,
        team: Annotated[str | None, QueryParameter(max_length=100)] = None,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)] = 100,
        project: Annotated[str | None, QueryParameter(max_length=100)] = None,
        granted: Annotated[bool, QueryParameter()] = False,
    ) -> ModelPage:
        _known_parameters(request, LIST_PARAMETERS)
        if team is not None:
            names.check("team", team)
        if project is not None:
            names.check("model", project, "project")  # a project is named like a job
        cursor = MODELS.read(after)
        grantee = None
        if granted:
            # Models other teams granted to the caller's; ``team`` narrows to one owner.
            if principal.team is None:
                raise RequestInvalid.one(
                    "granted", "lists what other teams granted to yours: needs a team's token"
                )
            grantee = principal.team
        elif not principal.is_operator:
            if team is not None and team != principal.team:
                grantee = principal.team  # another team's: only what it granted to ours
            team = team or principal.team
        fetched: list[ModelRow] = []
        # Another team's project is its work, null to a grantee: it matches no project
        # filter, so it cannot be found by trying names either.
        if grantee is None or project is None:
            async with pool.acquire() as conn:
                fetched = await models_repo.list_models(
                    conn, team, cursor, limit + 1, project, grantee
                )
        rows, more = paging.split(fetched, limit)
        following = MODELS.write(rows[-1].team, rows[-1].name) if more else None
        reader = grants.reader_of(principal)
        return ModelPage(models=[shown(_summary(r), r.team, reader) for r in rows], next=following)

    @get(
        "/v1/models/{team:str}/{name:str}",
        response_headers=[ETAG],
        summary="A model with its aliases, and its ETag (for If-Match on DELETE)",
        responses=error_responses(404),
    )
    async def get_model(
        team: FromPath[str], name: FromPath[str], principal: Caller
    ) -> Response[ModelDetail]:
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await models_repo.model(conn, team, name)
            if found is None:
                raise await no_model(conn, principal, team, name)
            granted_to = await model_grants.grants_of(conn, found.id)
        detail = ModelDetail(**_summary(found).model_dump(), grants=granted_to)
        reader = grants.reader_of(principal)
        seen = shown(detail, team, reader)
        # A grantee may not write the model, and its grants are the owner's: its tag is of
        # what it is shown, never a hash of the grants (few team names, easily searched).
        tag = (
            model_tag(found, granted_to)
            if grantee_view.sees_all(team, reader)
            else entity_tag(seen)
        )
        return tagged(seen, tag)

    @delete(
        "/v1/models/{team:str}/{name:str}",
        summary="Delete a model with no live version, freeing its name (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        responses=error_responses(404, 409, 412),
    )
    async def delete_model(
        team: FromPath[str], name: FromPath[str], principal: Caller, conditions: Conditions
    ) -> ModelDeleted:
        """Delete the model once it has no live version (409 naming them); with ``If-Match:
        <ETag>`` only while it is as it was read; nothing changed on a 409 or a 412."""
        visible(principal, team, name)
        async with pool.acquire() as conn, conn.transaction():
            model_id = await models_repo.lock_existing_model(conn, team, name)
            current = await models_repo.model(conn, team, name)
            if model_id is None or current is None:
                raise await no_model(conn, principal, team, name)
            granted_to = await model_grants.grants_of(conn, model_id)
            conditions.check(f"model {team}/{name}", model_tag(current, granted_to))
            tombstones = await models.delete_model(
                conn, model_id, team, name, principal.actor, clock()
            )
            if audit.must_record(principal):
                await audit.record(
                    conn,
                    principal,
                    "delete model",
                    f"{team}/{name}",
                    {"model_id": model_id, "versions": tombstones},
                )
        return ModelDeleted(team=team, model=name, tombstones=tombstones)

    @post(
        "/v1/models/{team:str}/{name:str}/versions",
        summary="Register a committed checkpoint of a job as the model's next version",
        opt=needs(Role.MEMBER),
        status_code=201,
        operation_class=json_request_body(RegisterRequest),
        responses=error_responses(404, 409, 413, 415),
    )
    async def register_version(
        team: FromPath[str], name: FromPath[str], request: Request[Any, Any, Any], principal: Caller
    ) -> CostedVersion:
        names.check_model(team, name)
        raw = await read_json_body(request, BODY_MAX_BYTES, lambda path: path == "description")
        body = parse_body(RegisterRequest, raw)
        for i, tag in enumerate(body.tags):
            names.check("tag", tag, f"tags[{i}]")
        missing_job = NotFoundException(
            f"no started job {body.job_id!r} in team {team!r}: the registry learns a job when "
            "it starts, and registers only checkpoints a started job of the team committed"
        )
        if not principal.may_see_team(team):
            raise not_found.not_yours("model", team, name)
        async with pool.acquire() as conn:
            runs = await repo.runs_of_job(conn, body.job_id)
            if not runs or runs[0].spec.team != team:
                raise missing_job
            if body.checkpoint_uri is None:
                chosen = latest_checkpoint(await repo.checkpoints_of_job(conn, body.job_id))
            else:
                chosen = await models_repo.committed_checkpoint(
                    conn, body.job_id, body.checkpoint_uri
                )
            if chosen is None:
                raise await not_found.checkpoint(conn, body.job_id, body.checkpoint_uri)
            final = next((r for r in runs if r.allocation_id == chosen.allocation_id), None)
            if final is None:
                raise HTTPException(
                    status_code=409,
                    detail=f"job {body.job_id!r}: the start of allocation "
                    f"{chosen.allocation_id} that committed the checkpoint is not recorded yet",
                )
            metrics = {**await models_repo.final_metrics(conn, body.job_id), **body.metrics}
            what = models.Registration(
                team=team,
                model=name,
                project=final.spec.project,
                job_id=body.job_id,
                final=final,
                runs=runs,
                checkpoint=chosen.ref,
                metrics=metrics,
                origin="explicit",
                created_by=principal.actor,
                tags=tuple(dict.fromkeys(body.tags)),
                description=body.description,
            )
        # The copy (a whole artifact, with a place of the team's transfers taken through the
        # pool) runs holding no connection: as many requests at once as the pool has
        # connections, each holding one while its place waited for another, all waited for
        # one none gave back, and answered 503 when the pool's acquire timeout ended.
        try:
            copied = await models.copy_in(storage(), what, transfer(principal))
        except artifacts.CheckpointGone as exc:
            field = "job_id" if body.checkpoint_uri is None else "checkpoint_uri"
            raise Conflicting(
                f"job {body.job_id!r}: {exc}; register another of its committed checkpoints",
                field=field,
            ) from None
        # A copy its transaction did not record is deleted after it, holding no connection.
        unrecorded = models.Unrecorded(storage(), [copied])
        try:
            async with pool.acquire() as conn:
                async with conn.transaction():
                    with unrecorded.inside():
                        version = await models.record(conn, storage(), what, clock(), copied)
                        if audit.must_record(principal):
                            await audit.record(
                                conn,
                                principal,
                                "register model version",
                                f"{team}/{name}/{version.version}",
                                {
                                    **_of_version(
                                        await models_repo.model_id(conn, team, name), version
                                    ),
                                    "job_id": body.job_id,
                                    "checkpoint_uri": chosen.ref.uri,
                                },
                            )
                # The shape GET answers: what the new version cost to make (its job and
                # upstream).
                return await model_cost.costed(conn, version, [], grants.reader_of(principal))
        except Exception:
            await unrecorded.free()
            raise

    @delete(
        "/v1/models/{team:str}/{name:str}/versions/{version:int}",
        summary="Delete a version and free its objects (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        responses=error_responses(404, 409, 412),
    )
    async def delete_version(
        team: FromPath[str],
        name: FromPath[str],
        version: Version,
        principal: Caller,
        conditions: Conditions,
    ) -> Freed:
        visible(principal, team, name)
        async with pool.acquire() as conn, conn.transaction():
            model_id = await models_repo.lock_existing_model(conn, team, name)
            if model_id is None:
                raise await no_model(conn, principal, team, name)
            found = await live_version(conn, principal, team, name, version)
            conditions.check(f"version {version} of model {team}/{name}", version_tag(found))
            source = storage() if found.owned else None  # 503 before anything changes
            await models.delete_version(conn, model_id, found, principal.actor, clock())
            if audit.must_record(principal):
                await audit.record(
                    conn,
                    principal,
                    "delete model version",
                    f"{team}/{name}/{version}",
                    _of_version(model_id, found),
                )
        # After the tombstone committed: a failure here leaves unreferenced objects, which
        # the storage collector frees; never a live version without its objects.
        freed = await free_after_commit(source, found)
        return Freed(
            team=team, model=name, version=version, objects=freed.objects, bytes=freed.bytes
        )

    @get(
        "/v1/models/{team:str}/{name:str}/versions/by-alias/{alias:str}",
        responses=error_responses(404),
    )
    async def version_by_alias(
        team: FromPath[str], name: FromPath[str], alias: FromPath[str], principal: Caller
    ) -> CostedVersion:
        names.check_model(team, name)
        names.check("alias", alias)
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await models_repo.model(conn, team, name)
            if found is None or alias not in found.aliases:
                raise await no_alias(conn, principal, team, name, alias)
            version = await live_version(conn, principal, team, name, found.aliases[alias])
            pointing = await models_repo.aliases_of_version(conn, found.id, version.version)
            reader = grants.reader_of(principal)
            return shown(await model_cost.costed(conn, version, pointing, reader), team, reader)

    @get(
        "/v1/models/{team:str}/{name:str}/versions/{version:int}/download",
        summary="A short-lived URL of the version's artifact, after verifying its sha256",
        responses=error_responses(404, 409),
        opt=body_is_work(),
    )
    async def download(
        team: FromPath[str], name: FromPath[str], version: Version, principal: Caller
    ) -> Download:
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await live_version(conn, principal, team, name, version)
        key = _owned_key(found, grants.reader_of(principal))
        source = storage()
        url = await asyncio.to_thread(source.presign_get, key, download_url_seconds)
        if url is None:
            # No presigned URLs (a local folder): the bytes come through ``content``, which
            # verifies them as it serves them.
            path = f"/v1/models/{team}/{name}/versions/{version}/content"
            return Download(
                url=path,
                needs_token=True,
                expires_in_s=None,
                sha256=found.artifact.sha256,
                size_bytes=found.artifact.size_bytes,
            )
        verified = await transfers.run(principal.team, _fetch, source, key, found)
        artifacts.discard(verified)
        return Download(
            url=url,
            needs_token=False,
            expires_in_s=download_url_seconds,
            sha256=found.artifact.sha256,
            size_bytes=found.artifact.size_bytes,
        )

    @get(
        "/v1/models/{team:str}/{name:str}/versions/{version:int}/content",
        response_headers=[ETAG],
        summary="The version's artifact, verified against its sha256 before it is sent",
        responses=error_responses(404, 409),
        media_type="application/octet-stream",
        opt=body_is_work(),
    )
    async def content(
        team: FromPath[str],
        name: FromPath[str],
        version: Version,
        principal: Caller,
        request: Request[Any, Any, Any],
    ) -> File:
        """The artifact, with the headers its ``HEAD`` answers too (``content_headers``);
        when ``If-None-Match`` names its ``ETag``, those headers and no body, with nothing
        fetched (the app's edge makes it the 304)."""
        found, key = await servable(principal, team, name, version)
        headers = content_headers(found, name)
        if none_match(request.headers.getall("If-None-Match", []), headers["ETag"]):
            # Any Response serves (Litestar sends it as it is); ``File`` documents the 200.
            return cast(File, head_answer("application/octet-stream", headers))
        verified = await transfers.run(principal.team, _fetch, storage(), key, found)
        return File(
            verified,
            filename=f"{name}-v{version}.pt",
            media_type="application/octet-stream",
            headers=headers,
            background=BackgroundTask(artifacts.discard, verified),
        )

    async def servable(
        principal: Principal, team: str, name: str, version: int
    ) -> tuple[ModelVersion, str]:
        """What ``download`` and ``content`` check before any transfer (readable, live,
        the registry's own copy, a store): the version and its key."""
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await live_version(conn, principal, team, name, version)
        key = _owned_key(found, grants.reader_of(principal))
        storage()
        return found, key

    @head_of_get("/v1/models/{team:str}/{name:str}/versions/{version:int}/download")
    async def download_head(
        team: FromPath[str], name: FromPath[str], version: Version, principal: Caller
    ) -> Response[None]:
        """``download``'s status and type, with no artifact fetched nor URL made."""
        await servable(principal, team, name, version)
        return head_answer(MediaType.JSON)

    @head_of_get("/v1/models/{team:str}/{name:str}/versions/{version:int}/content")
    async def content_head(
        team: FromPath[str], name: FromPath[str], version: Version, principal: Caller
    ) -> Response[None]:
        """``content``'s status and headers, with no artifact fetched: all are the
        version's (``content_headers``), its length the artifact's registered size (the
        bytes ``content`` sends are verified to be those)."""
        found, _ = await servable(principal, team, name, version)
        return head_answer(
            "application/octet-stream",
            content_headers(found, name),
            content_length=found.artifact.size_bytes,
        )

    @get("/v1/models/{team:str}/{name:str}/aliases", responses=error_responses(404))
    async def list_aliases(
        team: FromPath[str],
        name: FromPath[str],
        principal: Caller,
        limit: Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
    ) -> AliasList:
        """A page of the model's aliases by name (``shared.paging``, ``next`` as the
        versions')."""
        names.check_model(team, name)
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await models_repo.model_id(conn, team, name)
            if found is None:
                raise await no_model(conn, principal, team, name)
            key = ALIASES.read(after, of=of_model(found))
            fetched = await models_repo.aliases_page(conn, found, limit + 1, key[0] if key else "")
        page, more = paging.split(fetched, limit)
        return AliasList(
            team=team,
            model=name,
            aliases=dict(page),
            next=ALIASES.write(page[-1][0], of=of_model(found)) if more else None,
        )

    @get(
        "/v1/models/{team:str}/{name:str}/aliases/{alias:str}",
        response_headers=[ETAG],
        summary="Where an alias points, with its ETag (for If-Match on PUT and DELETE)",
        responses=error_responses(404),
    )
    async def get_alias(
        team: FromPath[str], name: FromPath[str], alias: FromPath[str], principal: Caller
    ) -> Response[AliasRead]:
        names.check_model(team, name)
        names.check("alias", alias)
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await models_repo.model(conn, team, name)
            version = found.aliases.get(alias) if found is not None else None
            tag = alias_tag(found.id, version) if found is not None else None
            if version is None or tag is None:
                raise await no_alias(conn, principal, team, name, alias)
        return tagged(AliasRead(team=team, model=name, alias=alias, version=version), tag)

    @put(
        "/v1/models/{team:str}/{name:str}/aliases/{alias:str}",
        summary="Point an alias at a version, atomically and audited (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        operation_class=json_request_body(AliasRequest),
        responses=error_responses(404, 409, 412, 413, 415),
    )
    async def put_alias(
        team: FromPath[str],
        name: FromPath[str],
        alias: FromPath[str],
        request: Request[Any, Any, Any],
        principal: Caller,
        conditions: Conditions,
    ) -> Response[AliasChange]:
        """Point the alias at the body's version; with ``If-Match: <ETag>`` only while it
        points where it was read, with ``If-None-Match: *`` only when there is no such
        alias, with ``If-Match: *`` only when there is; nothing changed on a 412."""
        visible(principal, team, name)
        names.check("alias", alias)
        body = parse_body(
            AliasRequest, await read_json_body(request, BODY_MAX_BYTES, lambda _: False)
        )
        async with pool.acquire() as conn, conn.transaction():
            model_id = await models_repo.lock_existing_model(conn, team, name)
            if model_id is None:
                raise await no_model(conn, principal, team, name)
            current = await models_repo.model(conn, team, name)
            pointing = current.aliases.get(alias) if current is not None else None
            conditions.check(
                f"alias {alias!r} of model {team}/{name}", alias_tag(model_id, pointing)
            )
            target = await repo.model_version(conn, team, name, body.version)
            if target is None:
                raise await not_found.version(
                    conn, grants.reader_of(principal), team, name, body.version
                )
            previous = await models.move_alias(
                conn, model_id, alias, target, principal.actor, clock()
            )
            if audit.must_record(principal):
                await audit.record(
                    conn,
                    principal,
                    "move model alias",
                    f"{team}/{name}/{alias}",
                    {"model_id": model_id, "from": previous, "to": body.version},
                )
        change = AliasChange(
            team=team, model=name, alias=alias, version=body.version, previous=previous
        )
        return tagged(change, alias_tag(model_id, body.version) or "")

    @delete(
        "/v1/models/{team:str}/{name:str}/aliases/{alias:str}",
        summary="Delete an alias, audited (members)",
        opt=needs(Role.MEMBER),
        status_code=200,
        responses=error_responses(404, 412),
    )
    async def delete_alias(
        team: FromPath[str],
        name: FromPath[str],
        alias: FromPath[str],
        principal: Caller,
        conditions: Conditions,
    ) -> AliasChange:
        """Delete the alias (404 when there is none); with ``If-Match: <ETag>`` only while
        it points where it was read; nothing changed on a 412."""
        visible(principal, team, name)
        names.check("alias", alias)
        async with pool.acquire() as conn, conn.transaction():
            model_id = await models_repo.lock_existing_model(conn, team, name)
            if model_id is None:
                raise await no_model(conn, principal, team, name)
            current = await models_repo.model(conn, team, name)
            pointing = current.aliases.get(alias) if current is not None else None
            if pointing is None:
                raise await no_alias(conn, principal, team, name, alias)
            conditions.check(
                f"alias {alias!r} of model {team}/{name}", alias_tag(model_id, pointing)
            )
            previous = await models_repo.remove_alias(
                conn, model_id, alias, principal.actor, clock()
            )
            if previous is None:
                raise await no_alias(conn, principal, team, name, alias)
            if audit.must_record(principal):
                await audit.record(
                    conn,
                    principal,
                    "delete model alias",
                    f"{team}/{name}/{alias}",
                    {"model_id": model_id, "from": previous},
                )
        return AliasChange(team=team, model=name, alias=alias, version=None, previous=previous)

    @get(
        "/v1/models/{team:str}/{name:str}/aliases/{alias:str}/moves",
        summary="Every move of an alias: who moved it from which version to which, and when",
        responses=error_responses(404),
    )
    async def alias_history(
        team: FromPath[str],
        name: FromPath[str],
        alias: FromPath[str],
        principal: Caller,
        limit: Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
    ) -> AliasHistory:
        names.check_model(team, name)
        names.check("alias", alias)
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await models_repo.model(conn, team, name)
            if found is None:
                raise await no_alias(conn, principal, team, name, alias)
            key = MOVES.read(after, of=of_model(found.id, alias))
            fetched = await models_repo.alias_moves(
                conn, found.id, alias, limit + 1, key[0] if key else 0
            )
            # A page past the last move is empty; only an alias never moved is a 404.
            known = bool(fetched) or bool(
                key and await models_repo.alias_moves(conn, found.id, alias, 1)
            )
            if not known:
                raise await no_alias(conn, principal, team, name, alias)
        moves, more = paging.split(fetched, limit)
        history = AliasHistory(
            team=team,
            model=name,
            alias=alias,
            moves=[
                AliasMoveRead(
                    alias=m.alias,
                    from_version=m.from_version,
                    to_version=m.to_version,
                    actor=m.actor,
                    at=m.at,
                )
                for m in moves
            ],
            next=MOVES.write(moves[-1].id, of=of_model(found.id, alias)) if more else None,
        )
        return shown(history, team, grants.reader_of(principal))

    async def change_grant(
        team: str,
        name: str,
        grantee_team: str,
        principal: Principal,
        teams: Teams,
        *,
        granted: bool,
    ) -> GrantChange:
        """Grant ``grantee_team`` read access, or revoke it. A grant is stored only for a
        team that exists (``teams``: 422 naming ``grantee_team`` otherwise); a revoke stores
        nothing, so it asks nothing."""
        names.check_model(team, name)
        names.check("team", grantee_team, "grantee_team")
        if not principal.may_see_team(team):
            raise not_found.not_yours("model", team, name)
        if not principal.has(Role.ADMIN):
            raise PermissionDeniedException("granting needs the admin role of the model's team")
        if grantee_team == team:
            raise RequestInvalid.one("grantee_team", "a team always reads its own models")
        if granted:
            await teams.require(grantee_team, "grantee_team")
        async with pool.acquire() as conn, conn.transaction():
            model_id = await models_repo.lock_existing_model(conn, team, name)
            if model_id is None:
                raise await no_model(conn, principal, team, name)
            if granted:
                changed = await model_grants.grant(
                    conn, model_id, grantee_team, principal.actor, clock()
                )
            else:
                changed = await model_grants.revoke(conn, model_id, grantee_team)
            await audit.record(
                conn,
                principal,
                "grant model" if granted else "revoke model grant",
                f"{team}/{name}",
                {"model_id": model_id, "grantee_team": grantee_team, "changed": changed},
            )
        return GrantChange(
            team=team, name=name, grantee_team=grantee_team, granted=granted, changed=changed
        )

    @put(
        "/v1/models/{team:str}/{name:str}/grants/{grantee_team:str}",
        summary="Let another team read, download and fine-tune from the model (admins), audited",
        opt=needs(Role.ADMIN),
        status_code=200,
        responses=error_responses(404),
    )
    async def put_grant(
        team: FromPath[str],
        name: FromPath[str],
        grantee_team: FromPath[str],
        principal: Caller,
        teams: TeamCheck,
    ) -> GrantChange:
        return await change_grant(team, name, grantee_team, principal, teams, granted=True)

    @delete(
        "/v1/models/{team:str}/{name:str}/grants/{grantee_team:str}",
        summary="Stop another team reading the model (admins), audited",
        opt=needs(Role.ADMIN),
        status_code=200,
        responses=error_responses(404),
    )
    async def delete_grant(
        team: FromPath[str],
        name: FromPath[str],
        grantee_team: FromPath[str],
        principal: Caller,
        teams: TeamCheck,
    ) -> GrantChange:
        return await change_grant(team, name, grantee_team, principal, teams, granted=False)

    return [
        put_grant,
        delete_grant,
        list_models,
        get_model,
        delete_model,
        register_version,
        delete_version,
        version_by_alias,
        download,
        download_head,
        content,
        content_head,
        list_aliases,
        get_alias,
        put_alias,
        delete_alias,
        alias_history,
    ]


def _summary(row: ModelRow) -> ModelSummary:
    return ModelSummary(
        team=row.team,
        name=row.name,
        project=row.project,
        latest_version=row.latest_version,
        versions=row.versions,
        aliases=row.aliases,
        created_at=row.created_at,
    )


def _known_parameters(request: Request[Any, Any, Any], known: frozenset[str]) -> None:
    """422 naming every query parameter not in ``known``, or given more than once."""
    errors = []
    for key in sorted(set(request.query_params.keys())):
        if key not in known:
            listed = ", ".join(sorted(known))
            errors.append(FieldError(field=key, message=f"unknown query parameter ({listed})"))
        elif len(request.query_params.getall(key)) > 1:
            errors.append(FieldError(field=key, message="given more than once"))
    if errors:
        raise RequestInvalid(errors)


def _of_version(model_id: int | None, version: ModelVersion) -> dict[str, Any]:
    """What an audit entry of a version's write names besides ``team/name/number``: the
    model's id and the version's, which a model made again under a deleted one's name (and
    its own version 1) never shares."""
    return {"model_id": model_id, "version_id": version.id}


def _owned_key(version: ModelVersion, reader: str | None) -> str:
    """The registry's own key of the version's artifact, else ``NotOwned`` (409), naming the
    job's checkpoint only to those who see the owner's work (``grantee_view.sees_all``)."""
    if version.artifact_key is None:
        where = f" {version.artifact.uri}" if grantee_view.sees_all(version.team, reader) else ""
        raise NotOwned(
            f"version {version.version} of {version.team}/{version.model_name} was registered "
            f"before the registry kept its own copies; its artifact is the job's checkpoint"
            f"{where}: its team can register that checkpoint again to make it downloadable"
        )
    return version.artifact_key


def _fetch(store: ObjectStore, key: str, version: ModelVersion) -> Path:
    expected = Digest(version.artifact.size_bytes, version.artifact.sha256)
    try:
        return artifacts.fetch_verified(store, key, expected)
    except ObjectNotFound:
        raise artifacts.ArtifactCorrupt(
            f"the artifact of version {version.version} of {version.team}/"
            f"{version.model_name} is missing from the object store; it cannot be served"
        ) from None


__all__: Sequence[str] = ["STATUSES", "model_routes"]
