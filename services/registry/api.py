"""The registry's HTTP app: health, readiness and the model API.

- ``GET /v1/models/{team}/{name}/versions?limit&after``: the live versions of a model,
  oldest first, a page at a time (``shared.paging``: at most ``limit``, 1 to
  ``VERSIONS_PAGE_MAX``, default 100; ``next`` while more follow, passed as ``after``).
- ``GET /v1/models/{team}/{name}/versions/{version}``: one version with its full lineage,
  its registration details, the aliases pointing at it and what it cost to make
  (``model_cost``; 404 once deleted).

- The model lifecycle (listing, registering, aliases, downloads, deletion): ``model_api``.
- Datasets, their immutable versions and grants: ``dataset_api``.
- Lineage queries (upstream of a model version, downstream of a dataset version, as JSON
  or OpenLineage run events): ``lineage_api``.
- A job's reproducibility record and the verdict on a reproduction: ``reproduction_api``.
- ``GET /v1/audit``: the audit log (operators).
- Experiment tracking (metrics, experiments, runs, tags, notes): ``tracking_api``.

Any user of ``team`` (viewer and up) reads that team's models and lineage, and the models
other teams granted to it (``model_grants``); operators read every team's. A model the
caller may not read answers 404, exactly like a model that does not exist, so names cannot
be probed. Authentication is the shared guard (``shared.access``). Every read answer goes
through ``grantee_view.shown``: a team a model or dataset is granted to sees it without the
owner's work (job, lineage, people, checkpoints: null).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import asyncpg
from litestar import Litestar, Response, get
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, PathParameter, QueryParameter
from litestar.types import Guard

from trainyard_platform.services.registry import grants, model_cost, model_grants, not_found
from trainyard_platform.services.registry import model_repository as models_repo
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.services.registry.dataset_api import dataset_routes
from trainyard_platform.services.registry.grantee_view import shown
from trainyard_platform.services.registry.lineage_api import lineage_routes
from trainyard_platform.services.registry.model_api import (
    STATUSES,
    model_routes,
    of_model,
    version_tag,
)
from trainyard_platform.services.registry.model_cost import CostedVersion
from trainyard_platform.services.registry.reproduction_api import reproduction_routes
from trainyard_platform.services.registry.schemas import VersionList, VersionSummary
from trainyard_platform.services.registry.tracking_api import tracking_routes
from trainyard_platform.services.registry.transfers import (
    DEFAULT_MAX_TRANSFERS,
    DEFAULT_MAX_TRANSFERS_PER_TEAM,
    Transfers,
)
from trainyard_platform.shared import paging
from trainyard_platform.shared.audit import audit_route
from trainyard_platform.shared.http_app import ETAG, error_responses, service_app, tagged
from trainyard_platform.shared.identity import Principal
from trainyard_platform.shared.slots import Slots
from trainyard_platform.shared.storage import ObjectStore

Caller = NamedDependency[Principal]
VERSIONS_PAGE_MAX = 500
VERSIONS = paging.Cursor("GET /v1/models/{team}/{name}/versions", paging.integer)
"""A page's position in one model's versions (``of`` the model: ``of_model``, its id)."""


def create_app(
    pool: asyncpg.Pool,
    guard: Guard,
    health_handlers: list[HTTPRouteHandler],
    cors_origins: Sequence[str] = (),
    *,
    store: ObjectStore | None = None,
    download_url_seconds: int = 300,
    max_transfers: int = DEFAULT_MAX_TRANSFERS,
    max_transfers_per_team: int = DEFAULT_MAX_TRANSFERS_PER_TEAM,
) -> Litestar:
    """The app over ``pool`` and ``store`` (where checkpoints are and the registry's copies
    go; without one, registering, deleting and downloading versions answer 503); at most
    ``max_transfers`` artifact transfers at once, ``max_transfers_per_team`` of a team across
    every replica (``transfers``)."""
    transfer_places = Slots(pool, "registry.transfers")
    # Every place the app keeps is closed when it stops (``on_shutdown``): a place held
    # then is given back, and no renewer runs on until the process exits.
    comparing = Slots(pool, "registry.comparisons")
    transfers = Transfers(max_transfers, max_transfers_per_team, transfer_places)

    @get("/v1/models/{team:str}/{name:str}/versions", responses=error_responses(404))
    async def list_versions(
        team: FromPath[str],
        name: FromPath[str],
        principal: Caller,
        limit: Annotated[int, QueryParameter(ge=1, le=VERSIONS_PAGE_MAX)] = 100,
        after: Annotated[str | None, QueryParameter(description="the next of a page")] = None,
    ) -> VersionList:
        async with pool.acquire() as conn:
            await model_grants.readable_or_404(conn, principal, team, name)
            model_id = await models_repo.model_id(conn, team, name)
            if model_id is None:
                raise await not_found.model(conn, grants.reader_of(principal), team, name)
            key = VERSIONS.read(after, of=of_model(model_id))
            fetched = await repo.versions_of_model(conn, model_id, limit + 1, key[0] if key else 0)
        versions, more = paging.split(fetched, limit)
        page = VersionList(
            team=team,
            model=name,
            versions=[VersionSummary.from_domain(v) for v in versions],
            next=VERSIONS.write(versions[-1].version, of=of_model(model_id)) if more else None,
        )
        return shown(page, team, grants.reader_of(principal))

    @get(
        "/v1/models/{team:str}/{name:str}/versions/{version:int}",
        response_headers=[ETAG],
        responses=error_responses(404),
    )
    async def get_version(
        team: FromPath[str],
        name: FromPath[str],
        version: Annotated[int, PathParameter(ge=1, le=2**31 - 1)],  # the column's integer
        principal: Caller,
    ) -> Response[CostedVersion]:
        """The version, with its ``ETag`` (for ``If-Match`` on its ``DELETE``)."""
        async with pool.acquire() as conn:
            await model_grants.readable_or_404(conn, principal, team, name)
            found = await repo.model_version(conn, team, name, version)
            if found is None or found.deleted_at is not None:
                reader = grants.reader_of(principal)
                raise await not_found.version(conn, reader, team, name, version)
            model_id = await models_repo.model_id(conn, team, name)
            assert model_id is not None  # the version's model
            pointing = await models_repo.aliases_of_version(conn, model_id, version)
            reader = grants.reader_of(principal)
            costed = shown(await model_cost.costed(conn, found, pointing, reader), team, reader)
        return tagged(costed, version_tag(found))

    return service_app(
        "registry",
        [
            *health_handlers,
            list_versions,
            get_version,
            *model_routes(pool, store, download_url_seconds, transfers),
            *dataset_routes(pool),
            *lineage_routes(pool),
            *reproduction_routes(pool),
            *tracking_routes(pool, comparing),
            audit_route(pool, "registry"),
        ],
        guard,
        statuses=STATUSES,
        cors_origins=cors_origins,
        on_shutdown=[transfers.close, transfer_places.close, comparing.close],
    )
