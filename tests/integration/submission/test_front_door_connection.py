"""``POST /v1/jobs`` runs its token check and its own statement on one pooled connection,
taken by the guard (``api.caller_guard``) and given back by the route's ``release_held``
middleware: whatever the answer (stored, replayed, refused by the guard, by the rate
limit or by a check of the body), the connection is back in its pool once it is sent."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import SPEC
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.service import NAME
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration


@pytest.fixture
async def front(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """A pool of the app's own: nothing else (no relay, no consumer) borrows from it, so
    every connection of it must be idle between requests."""
    async with open_pool(settings.database, NAME) as own:
        yield own


async def _client(settings: Settings, front: asyncpg.Pool) -> httpx.AsyncClient:
    store = open_store(settings.storage.uri, settings.storage)
    app = create_app(settings, AppDeps(pool=front, store=store))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://submission")


async def _user(client: httpx.AsyncClient, admin: str, name: str, role: str) -> str:
    response = await client.post(
        "/v1/admin/users",
        json={"name": name, "role": role},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def _all_idle(front: asyncpg.Pool) -> bool:
    return front.get_idle_size() == front.get_size()


async def test_every_answer_gives_the_connection_back(
    settings: Settings, pool: asyncpg.Pool, front: asyncpg.Pool
) -> None:
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    tight = settings.model_copy(update={"write_rate_per_s": 0.01, "write_burst": 1})
    async with (
        await _client(settings, front) as client,
        await _client(tight, front) as limited,
    ):
        member = await _user(client, admin, "carol", "member")
        viewer = await _user(client, admin, "dave", "viewer")
        other = {**SPEC, "name": "other"}
        cases: list[tuple[httpx.AsyncClient, str, dict[str, Any], dict[str, str], int]] = [
            (client, member, SPEC, {"Idempotency-Key": "k1"}, 201),
            (client, member, SPEC, {"Idempotency-Key": "k1"}, 200),  # replayed
            (client, member, other, {"Idempotency-Key": "k1"}, 409),  # key reused
            (client, admin, SPEC, {}, 201),  # audited: a transaction of its own
            (client, viewer, SPEC, {}, 403),  # refused by the guard, after its query
            (client, "ty_not-a-token", SPEC, {}, 401),
            (client, member, {**SPEC, "gpus": "two"}, {}, 422),
            (client, member, {**SPEC, "gpu_flavor": "nope"}, {}, 422),
            (client, member, SPEC, {"Content-Type": "text/plain"}, 415),
            (limited, member, SPEC, {}, 201),
            (limited, member, SPEC, {}, 429),  # refused by the rate limit, in the guard
        ]
        for http, token, spec, headers, expected in cases:
            response = await http.post(
                "/v1/jobs", json=spec, headers={"Authorization": f"Bearer {token}", **headers}
            )
            assert response.status_code == expected, response.text
            assert _all_idle(front), (expected, front.get_idle_size(), front.get_size())


async def test_a_submission_checking_its_bundle_in_the_store_holds_no_connection(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """A job naming a bundle is checked against the object store (the bundle's size: an
    S3 HEAD, up to the store's timeouts when it stalls). Before, the connection the guard
    took for the request was held meanwhile: a stalled store held every connection of the
    pool with as many submissions, and every other request failed with 503. Now it is
    given back first: with a pool of one connection, another request is answered while
    the check waits."""
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    one = settings.database.model_copy(
        update={"pool_min_size": 1, "pool_max_size": 1, "acquire_timeout_seconds": 3}
    )
    store = open_store(settings.storage.uri, settings.storage)
    data = b"a bundle, as far as its size goes\n"
    sha = hashlib.sha256(data).hexdigest()
    store.put_bytes(f"bundles/ml/{sha}.tar.gz", data)
    release = threading.Event()
    asked = asyncio.Event()
    loop = asyncio.get_running_loop()
    size = store.size

    def slow_size(key: str) -> int | None:
        loop.call_soon_threadsafe(asked.set)
        release.wait(60)
        return size(key)

    store.size = slow_size  # type: ignore[method-assign]
    async with open_pool(one, NAME) as front:
        app = create_app(settings, AppDeps(pool=front, store=store))
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://submission") as client:
            auth = {"Authorization": f"Bearer {admin}"}
            job = {**SPEC, "code": {"kind": "bundle", "sha256": sha, "size_bytes": len(data)}}
            submitting = asyncio.create_task(client.post("/v1/jobs", json=job, headers=auth))
            submitted = await _served_meanwhile(client, auth, submitting, asked, release)
            assert submitted.status_code == 201, submitted.text


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
async def test_a_submission_whose_body_is_slow_to_come_holds_no_connection(
    settings: Settings, pool: asyncpg.Pool, announced: bool
) -> None:
    """The client sends the job's body slowly (a slow link, or on purpose). Before, the
    guard took the request's connection first and the route read the body holding it: as
    many such submissions as the pool has connections held them all, and every other
    request failed with 503. Now the connection is held only once the body is in: with a
    pool of one connection, another request is answered while the body is awaited, and
    the submission is then stored. An audited caller: its token is checked every time."""
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    one = settings.database.model_copy(
        update={"pool_min_size": 1, "pool_max_size": 1, "acquire_timeout_seconds": 3}
    )
    body = json.dumps(SPEC).encode()
    started, release = asyncio.Event(), asyncio.Event()

    async def slowly() -> AsyncIterator[bytes]:
        yield body[:10]
        started.set()  # the app asked for more: it is reading the body
        await release.wait()
        yield body[10:]

    auth = {"Authorization": f"Bearer {admin}"}
    headers = {**auth, "Content-Type": "application/json"}
    if announced:
        headers["Content-Length"] = str(len(body))
    store = open_store(settings.storage.uri, settings.storage)
    async with open_pool(one, NAME) as front:
        app = create_app(settings, AppDeps(pool=front, store=store))
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://submission") as client:
            submitting = asyncio.create_task(
                client.post("/v1/jobs", content=slowly(), headers=headers)
            )
            submitted = await _served_meanwhile(client, auth, submitting, started, release)
            assert submitted.status_code == 201, submitted.text
        assert _all_idle(front)


async def _served_meanwhile(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    submitting: asyncio.Task[httpx.Response],
    held: asyncio.Event,
    release: asyncio.Event,
) -> httpx.Response:
    """Once ``held`` is set (the submission waits on its slow part), another request
    (``GET /v1/me``) must be answered while the submission still waits; then ``release``
    it and return its answer. Every wait is bounded."""
    try:
        async with asyncio.timeout(30):
            await held.wait()
        async with asyncio.timeout(20):
            me = await client.get("/v1/me", headers=auth)
        assert me.status_code == 200, me.text
        assert not submitting.done()
    finally:
        release.set()
    async with asyncio.timeout(30):
        return await submitting
