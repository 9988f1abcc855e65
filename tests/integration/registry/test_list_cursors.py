"""Every paged list route of the registry pages with one cursor (``shared.paging``): a page
has a ``next`` only when more rows follow, and a cursor the route did not give (forged,
another format, too long) is the same 422 everywhere, naming ``after`` and why.

The models and datasets lists had a cursor of their own, ``team/name`` as plain text, and
answered a ``next`` for every full page, the last one too, whose next page was empty. The
audit log (every service's, ``shared.audit``) answered its newest ``limit`` entries and no
cursor at all: older ones only by giving an id as ``before``.
"""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration.registry.modelkit import (
    OPERATOR,
    VISION,
    app_as,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_datasets import add
from trainyard_platform.shared import audit
from trainyard_platform.shared.storage import ObjectStore

ROUTES = [
    # (path, the rows' field, how many rows it has, its name in the error)
    ("/v1/models", "models", 2, "GET /v1/models"),
    ("/v1/datasets", "datasets", 2, "GET /v1/datasets"),
    ("/v1/models/vision/alpha/versions", "versions", 2, "GET /v1/models/{team}/{name}/versions"),
    ("/v1/datasets/vision/d1", "versions", 2, "GET /v1/datasets/{team}/{name}"),
    ("/v1/models/vision/alpha/aliases", "aliases", 2, "GET /v1/models/{team}/{name}/aliases"),
    ("/v1/models/vision/alpha/aliases/prod/moves", "moves", 2, "GET .../aliases/{alias}/moves"),
]
NOT_CURSORS = ["vision/alpha", "ml/x", "Mg", "bm90IGEgY3Vyc29y", "x" * 600]
"""The old models and datasets form (``team/name``), base64 of no cursor, too long."""


@pytest.fixture
async def filled(pool: asyncpg.Pool, store: ObjectStore) -> None:
    """Two of each: models, versions of ``alpha``, aliases, moves of ``prod``, datasets and
    versions of ``d1``."""
    job = await job_with_checkpoints(pool, store, [10, 20])
    async with app_as(pool, store, VISION) as client:
        for model, checkpoint in (("alpha", 0), ("alpha", 1), ("beta", 0)):
            uri = job.checkpoints[checkpoint].uri
            made = await register(client, "vision", model, job, checkpoint_uri=uri)
            assert made.status_code == 201, made.text
        for alias, version in (("prod", 1), ("prod", 2), ("staging", 1)):
            path = f"/v1/models/vision/alpha/aliases/{alias}"
            moved = await client.put(path, json={"version": version})
            assert moved.status_code == 200, moved.text
        for name in ("d1", "d1", "d2"):
            assert (await add(client, "vision", name)).status_code == 201


@pytest.mark.usefixtures("filled")
@pytest.mark.parametrize(("path", "field", "rows", "route"), ROUTES, ids=[r[0] for r in ROUTES])
async def test_one_cursor_and_one_error_for_every_list(
    pool: asyncpg.Pool, store: ObjectStore, path: str, field: str, rows: int, route: str
) -> None:
    async with app_as(pool, store, VISION) as client:
        whole = await client.get(path, params={"limit": rows})
        assert whole.status_code == 200, whole.text
        assert len(whole.json()[field]) == rows
        assert whole.json()["next"] is None  # a full page that is the last has no next
        first = (await client.get(path, params={"limit": 1})).json()
        second = await client.get(path, params={"limit": 1, "after": first["next"]})
        assert second.status_code == 200, second.text
        assert second.json()[field] and second.json()[field] != first[field]
        for bad in NOT_CURSORS:
            refused = await client.get(path, params={"after": bad})
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"] == [
                {"field": "after", "message": f"not a cursor returned by {route}"}
            ], (bad, refused.text)


async def test_the_audit_log_pages_with_the_same_cursor(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Five entries, three of them below ``before``, read two a page: the pages follow the
    ``Link`` (keeping ``before``), newest first, and a cursor it did not give is the same
    422 as every list's."""
    async with pool.acquire() as conn:
        for n in range(5):
            await audit.record(conn, OPERATOR, "test", f"thing {n}")
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM audit_log ORDER BY id DESC")]
    async with app_as(pool, store, OPERATOR) as client:
        seen: list[int] = []
        query = f"/v1/audit?limit=2&before={ids[1]}"
        for _ in range(5):
            page = await client.get(query)
            assert page.status_code == 200, page.text
            seen += [e["id"] for e in page.json()]
            following = page.links.get("next", {}).get("url")
            if not following:
                break
            assert f"before={ids[1]}" in following
            query = following
        assert seen == ids[2:]
        whole = await client.get("/v1/audit", params={"limit": len(ids)})
        assert [e["id"] for e in whole.json()] == ids and "link" not in whole.headers
        for bad in NOT_CURSORS:
            refused = await client.get("/v1/audit", params={"after": bad})
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"] == [
                {"field": "after", "message": "not a cursor returned by GET /v1/audit"}
            ], (bad, refused.text)


@pytest.mark.usefixtures("filled")
async def test_a_cursor_of_another_list_is_refused(pool: asyncpg.Pool, store: ObjectStore) -> None:
    """A ``next`` of one list given to another: the models list's ``(team, name)`` was read
    by the datasets list, a model's versions' position by another model's, the audit log's by
    every integer-keyed list, each paging from an arbitrary point. Now each is a 422 on
    ``after`` saying it belongs to another list."""
    async with pool.acquire() as conn:
        for n in range(3):
            await audit.record(conn, OPERATOR, "test", f"thing {n}")
    async with app_as(pool, store, OPERATOR) as operator:
        audit_next = (await operator.get("/v1/audit", params={"limit": 1})).links["next"]["url"]
        audit_cursor = audit_next.split("after=")[1]
    async with app_as(pool, store, VISION) as client:

        async def next_of(path: str, field: str = "next") -> str:
            page = await client.get(path, params={"limit": 1})
            assert page.status_code == 200, page.text
            cursor: str = page.json()[field]
            return cursor

        models = await next_of("/v1/models")
        alpha_versions = await next_of("/v1/models/vision/alpha/versions")
        prod_moves = await next_of("/v1/models/vision/alpha/aliases/prod/moves")
        foreign = [
            ("/v1/datasets", models, "GET /v1/datasets"),
            ("/v1/models", await next_of("/v1/datasets"), "GET /v1/models"),
            ("/v1/models/vision/beta/versions", alpha_versions, ROUTES[2][3]),
            ("/v1/datasets/vision/d1", alpha_versions, ROUTES[3][3]),
            ("/v1/models/vision/alpha/versions", audit_cursor, ROUTES[2][3]),
            ("/v1/models/vision/alpha/aliases/staging/moves", prod_moves, ROUTES[5][3]),
        ]
        for path, cursor, route in foreign:
            refused = await client.get(path, params={"after": cursor})
            assert refused.status_code == 422, (path, refused.text)
            assert refused.json()["errors"] == [
                {"field": "after", "message": f"a cursor of another list, not of {route}"}
            ], (path, refused.text)
