"""Datasets over HTTP (docs/datasets.md): immutable versions per team, and grants.

- ``POST /v1/datasets/{team}/{name}/versions`` (members of ``team``): a new version, never
  an update; the dataset is created with its first version.
- ``GET /v1/datasets?limit&after``: the datasets the caller's team may read (its own and
  those granted to it; operators: every one), keyset-paged by team and name
  (``shared.paging``: ``next`` while more follow).
- ``GET /v1/datasets/{team}/{name}?limit&after``: one dataset with a page of its versions,
  oldest first (``shared.paging``: at most ``limit``, 1 to ``PAGE_MAX``, default 100;
  ``next`` while more follow) and, for its own team and operators, its grants.
- ``GET /v1/datasets/{team}/{name}/versions/{version}``: one version (submission's admission
  asks this with the submitting user's token).
- ``PUT``/``DELETE /v1/datasets/{team}/{name}/grants/{grantee_team}`` (admins of ``team``,
  operators): let another team read every version, or stop it; audited.

A dataset the caller's team may not read answers 404 exactly like one that does not exist,
so names cannot be probed. Every name in a path is checked (``names``) first: 422 naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
from litestar import Request, delete, get, post, put
from litestar.di import NamedDependency
from litestar.exceptions import PermissionDeniedException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, PathParameter, QueryParameter

from trainyard_platform.services.registry import dataset_repository as datasets
from trainyard_platform.services.registry import grants, names, not_found
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry.dataset_schemas import (
    DatasetDetail,
    DatasetPage,
    DatasetSummary,
    DatasetVersionRead,
    DatasetVersionRequest,
    GrantChange,
)
from trainyard_platform.services.registry.grantee_view import shown
from trainyard_platform.shared import audit, paging
from trainyard_platform.shared.access import Teams, needs
from trainyard_platform.shared.http_app import error_responses, json_request_body
from trainyard_platform.shared.http_errors import RequestInvalid, parse_body, read_json_body
from trainyard_platform.shared.identity import Principal, Role

Caller = NamedDependency[Principal]
TeamCheck = NamedDependency[Teams]
Version = Annotated[int, PathParameter(ge=1, le=2**31 - 1)]
Clock = Callable[[], datetime]
BODY_MAX_BYTES = 64 * 1024
PAGE_MAX = 500
DATASETS = names.by_name("GET /v1/datasets")
VERSIONS = paging.Cursor("GET /v1/datasets/{team}/{name}", paging.integer)
"""A page's position in one dataset's versions (``of`` the dataset: ``team/name``)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def dataset_routes(pool: asyncpg.Pool, clock: Clock = utc_now) -> list[HTTPRouteHandler]:
    """The routes of the module docstring over the registry's pool."""

    async def readable(
        conn: asyncpg.Connection, principal: Principal, team: str, name: str
    ) -> datasets.Dataset:
        reader = grants.reader_of(principal)
        found = await datasets.dataset(conn, team, name)
        if found is None or not await datasets.readable(conn, reader, team, name):
            raise await not_found.dataset(conn, reader, team, name)
        return found

    @post(
        "/v1/datasets/{team:str}/{name:str}/versions",
        summary="Register a new, immutable version of a dataset (members of its team)",
        opt=needs(Role.MEMBER),
        status_code=201,
        operation_class=json_request_body(DatasetVersionRequest),
        responses=error_responses(404, 409, 413, 415),
    )
    async def add_version(
        team: FromPath[str],
        name: FromPath[str],
        request: Request[Any, Any, Any],
        principal: Caller,
        teams: TeamCheck,
    ) -> DatasetVersionRead:
        names.check_model(team, name)
        body = parse_body(
            DatasetVersionRequest,
            await read_json_body(request, BODY_MAX_BYTES, lambda _: False),
        )
        if not principal.may_see_team(team):
            raise not_found.not_yours("dataset", team, name)
        if principal.is_operator:  # a user's own team exists; an operator's may not
            await teams.require(team, "team")
        async with pool.acquire() as conn, conn.transaction():
            if body.producing_job_id is not None:
                runs = await repo.runs_of_job(conn, body.producing_job_id)
                if not runs or runs[0].spec.team != team:
                    raise RequestInvalid.one(
                        "producing_job_id", f"no started job of team {team!r} has this id"
                    )
            version = await datasets.add_version(
                conn,
                team,
                name,
                uri=body.uri,
                sha256=body.sha256,
                size_bytes=body.size_bytes,
                schema=body.data_schema,
                feature_version=body.feature_version,
                producing_job_id=body.producing_job_id,
                actor=principal.actor,
                now=clock(),
            )
            if audit.must_record(principal):
                await audit.record(
                    conn,
                    principal,
                    "register dataset version",
                    version.reference,
                    {"uri": body.uri, "sha256": body.sha256},
                )
        return DatasetVersionRead.of(version)

    @get("/v1/datasets", summary="The datasets the caller's team may read")
    async def list_datasets(
        principal: Caller,
        limit: Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
    ) -> DatasetPage:
        cursor = DATASETS.read(after)
        async with pool.acquire() as conn:
            fetched = await datasets.readable_datasets(
                conn, grants.reader_of(principal), limit + 1, cursor
            )
        rows, more = paging.split(fetched, limit)
        return DatasetPage(
            datasets=[
                DatasetSummary(
                    team=r.team,
                    name=r.name,
                    latest_version=r.latest_version,
                    created_at=r.created_at,
                )
                for r in rows
            ],
            next=DATASETS.write(rows[-1].team, rows[-1].name) if more else None,
        )

    @get("/v1/datasets/{team:str}/{name:str}", responses=error_responses(404))
    async def get_dataset(
        team: FromPath[str],
        name: FromPath[str],
        principal: Caller,
        limit: Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
    ) -> DatasetDetail:
        names.check_model(team, name)
        key = VERSIONS.read(after, of=f"{team}/{name}")
        async with pool.acquire() as conn:
            found = await readable(conn, principal, team, name)
            fetched = await datasets.versions(conn, team, name, limit + 1, key[0] if key else 0)
        versions, more = paging.split(fetched, limit)
        detail = DatasetDetail(
            team=team,
            name=name,
            latest_version=found.latest_version,
            created_at=found.created_at,
            versions=[DatasetVersionRead.of(v) for v in versions],
            grants=found.grants,
            next=VERSIONS.write(versions[-1].version, of=f"{team}/{name}") if more else None,
        )
        return shown(detail, team, grants.reader_of(principal))

    @get(
        "/v1/datasets/{team:str}/{name:str}/versions/{version:int}",
        responses=error_responses(404),
    )
    async def get_version(
        team: FromPath[str], name: FromPath[str], version: Version, principal: Caller
    ) -> DatasetVersionRead:
        names.check_model(team, name)
        async with pool.acquire() as conn:
            await readable(conn, principal, team, name)
            found = await datasets.version(conn, team, name, version)
            if found is None:
                reader = grants.reader_of(principal)
                raise await not_found.dataset_version(conn, reader, team, name, version)
        return shown(DatasetVersionRead.of(found), team, grants.reader_of(principal))

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
            raise not_found.not_yours("dataset", team, name)
        if not principal.has(Role.ADMIN):
            raise PermissionDeniedException("granting needs the admin role of the dataset's team")
        if grantee_team == team:
            raise RequestInvalid.one("grantee_team", "a team always reads its own datasets")
        if granted:
            await teams.require(grantee_team, "grantee_team")
        async with pool.acquire() as conn, conn.transaction():
            found = await datasets.dataset(conn, team, name)
            if found is None:
                raise await not_found.dataset(conn, grants.reader_of(principal), team, name)
            if granted:
                changed = await datasets.grant(
                    conn, found.id, grantee_team, principal.actor, clock()
                )
            else:
                changed = await datasets.revoke(conn, found.id, grantee_team)
            await audit.record(
                conn,
                principal,
                "grant dataset" if granted else "revoke dataset grant",
                f"{team}/{name}",
                {"grantee_team": grantee_team, "changed": changed},
            )
        return GrantChange(
            team=team, name=name, grantee_team=grantee_team, granted=granted, changed=changed
        )

    @put(
        "/v1/datasets/{team:str}/{name:str}/grants/{grantee_team:str}",
        summary="Let another team read every version of the dataset (admins), audited",
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
        "/v1/datasets/{team:str}/{name:str}/grants/{grantee_team:str}",
        summary="Stop another team reading the dataset (admins), audited",
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

    return [add_version, list_datasets, get_dataset, get_version, put_grant, delete_grant]


__all__: Sequence[str] = ["dataset_routes"]
