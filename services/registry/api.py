"""The registry's HTTP app: health, readiness and the model read API.

- ``GET /v1/models/{team}/{name}/versions``: every version of a model, oldest first.
- ``GET /v1/models/{team}/{name}/versions/{version}``: one version with its full lineage.

Both answer 404 for an unknown model or version. These are operator endpoints for now: the
caller's team is not checked yet (per-team access comes with submission's tokens), so like
every route but the probes they require ``Authorization: Bearer <admin_token>``
(``shared.operator_auth``).
"""

from __future__ import annotations

import asyncpg
from litestar import Litestar, get
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
from pydantic import SecretStr

from services.registry import repository as repo
from services.registry.schemas import VersionDetail, VersionList, VersionSummary
from shared.http_tracing import tracing_middleware
from shared.operator_auth import admin_guard


def create_app(
    pool: asyncpg.Pool, admin_token: SecretStr, health_handlers: list[HTTPRouteHandler]
) -> Litestar:
    @get("/v1/models/{team:str}/{name:str}/versions")
    async def list_versions(team: FromPath[str], name: FromPath[str]) -> VersionList:
        async with pool.acquire() as conn:
            versions = await repo.versions_of_model(conn, team, name)
            if not versions and not await repo.model_exists(conn, team, name):
                raise NotFoundException(f"no model {name!r} in team {team!r}")
        return VersionList(
            team=team, model=name, versions=[VersionSummary.from_domain(v) for v in versions]
        )

    @get("/v1/models/{team:str}/{name:str}/versions/{version:int}")
    async def get_version(
        team: FromPath[str], name: FromPath[str], version: FromPath[int]
    ) -> VersionDetail:
        async with pool.acquire() as conn:
            found = await repo.model_version(conn, team, name, version)
        if found is None:
            raise NotFoundException(f"no version {version} of model {name!r} in team {team!r}")
        return VersionDetail.from_domain(found)

    return Litestar(
        route_handlers=[*health_handlers, list_versions, get_version],
        guards=[admin_guard(admin_token)],
        middleware=[tracing_middleware],
    )
