"""Every paged list route of the registry pages with one cursor (``shared.paging``): a page
has a ``next`` only when more rows follow, and a cursor the route did not give (forged,
another format, too long) is the same 422 everywhere, naming ``after`` and why.

The models and datasets lists had a cursor of their own, ``team/name`` as plain text, and
answered a ``next`` for every full page, the last one too, whose next page was empty.
"""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration.registry.modelkit import VISION, app_as, job_with_checkpoints, register
from tests.integration.registry.test_datasets import add
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
