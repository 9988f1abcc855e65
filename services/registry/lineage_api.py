"""Lineage queries over HTTP (docs/lineage.md).

- ``GET /v1/lineage/models/{team}/{name}/versions/{version}/upstream``: everything the model
  version came from, transitively.
- ``GET /v1/lineage/datasets/{team}/{name}/versions/{version}/downstream``: everything made
  from the dataset version, transitively (what to retrain when the data turns out bad).

``?format=json`` (default) answers the graph (``lineage.Graph.as_json``);
``?format=openlineage`` answers ``{"events": [RunEvent, ...]}``. The starting node must be
readable by the caller (a model or dataset its team owns or was granted — ``model_grants``,
``dataset_repository.readable``; operators everything), else 404 like one that does not
exist; nodes of the graph it may not read are left out and counted in ``hidden`` (a granted
model or dataset version is shown, the other team's jobs and checkpoints are not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import asyncpg
from litestar import get
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, PathParameter, QueryParameter

from trainyard_platform.services.registry import dataset_repository as datasets
from trainyard_platform.services.registry import grants, lineage, model_grants, names, not_found
from trainyard_platform.services.registry import repository as repo
from trainyard_platform.shared.http_app import error_responses
from trainyard_platform.shared.identity import Principal

Caller = NamedDependency[Principal]
Version = Annotated[int, PathParameter(ge=1, le=2**31 - 1)]
Format = Annotated[Literal["json", "openlineage"], QueryParameter()]


def lineage_routes(pool: asyncpg.Pool) -> list[HTTPRouteHandler]:
    """The routes of the module docstring over the registry's pool."""

    async def answer(
        conn: asyncpg.Connection, graph: lineage.Graph, principal: Principal, fmt: str
    ) -> dict[str, Any]:
        reader = grants.reader_of(principal)

        async def may_read(kind: lineage.Kind, team: str, name: str) -> bool:
            if kind == "model_version":
                return await model_grants.readable(conn, reader, team, name)
            return await datasets.readable(conn, reader, team, name)

        shown = await graph.visible_to(reader, may_read)
        if fmt == "openlineage":
            return {"events": lineage.openlineage(shown)}
        return shown.as_json()

    @get(
        "/v1/lineage/models/{team:str}/{name:str}/versions/{version:int}/upstream",
        summary="Everything a model version came from, transitively",
        responses=error_responses(404),
    )
    async def model_upstream(
        team: FromPath[str],
        name: FromPath[str],
        version: Version,
        principal: Caller,
        format: Format = "json",
    ) -> dict[str, Any]:
        names.check_model(team, name)
        reader = grants.reader_of(principal)
        async with pool.acquire() as conn:
            found = await repo.model_version(conn, team, name, version)
            if found is None or not await model_grants.readable(conn, reader, team, name):
                raise await not_found.version(conn, reader, team, name, version)
            return await answer(conn, await lineage.upstream(conn, found), principal, format)

    @get(
        "/v1/lineage/datasets/{team:str}/{name:str}/versions/{version:int}/downstream",
        summary="Everything made from a dataset version, transitively (what to retrain)",
        responses=error_responses(404),
    )
    async def dataset_downstream(
        team: FromPath[str],
        name: FromPath[str],
        version: Version,
        principal: Caller,
        format: Format = "json",
    ) -> dict[str, Any]:
        names.check_model(team, name)
        reader = grants.reader_of(principal)
        async with pool.acquire() as conn:
            found = await datasets.version(conn, team, name, version)
            if found is None or not await datasets.readable(conn, reader, team, name):
                raise await not_found.dataset_version(conn, reader, team, name, version)
            return await answer(conn, await lineage.downstream(conn, found), principal, format)

    return [model_upstream, dataset_downstream]


__all__: Sequence[str] = ["lineage_routes"]
