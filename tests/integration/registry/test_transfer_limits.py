"""What one team's artifact transfers may take of the registry, on a real PostgreSQL and S3
endpoint.

Every registration, ``download`` and ``content`` reads the whole artifact from the object
store into the registry's own disk and hashes it (``artifacts``): gigabytes of a model,
on a thread. Before, nothing bounded them: one viewer asking for its team's large model
many times at once filled the registry's disk and every thread ``asyncio.to_thread`` has,
so presigning, registering and serving stalled for every team. Now a team has at most
``MAX_TRANSFERS_PER_TEAM`` at once (one more: 429 with ``Retry-After``), all teams at most
``MAX_TRANSFERS`` (503), on threads of their own.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.fixtures.refusals import refused_before_entering
from tests.integration.registry.modelkit import ML, VISION, app_as, job_with_checkpoints, register
from trainyard_platform.services.registry.service import NAME
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


class Held:
    """Makes ``store.get_file`` wait until released, counting the reads under way."""

    def __init__(self, store: Any) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.entered = asyncio.Queue[int]()
        self.loop = asyncio.get_running_loop()
        self._get_file = store.get_file
        store.get_file = self.get_file

    def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.loop.call_soon_threadsafe(self.entered.put_nowait, self.now)
        try:
            self.release.wait(60)
            self._get_file(key, path, max_bytes=max_bytes)
        finally:
            with self.lock:
                self.now -= 1

    def let_in(self) -> str:
        return f"a third transfer of one team was let in ({self.most} at once)"


async def _download(client: httpx.AsyncClient, team: str, name: str) -> httpx.Response:
    return await client.get(f"/v1/models/{team}/{name}/versions/1/download")


async def test_a_team_has_at_most_its_share_of_transfers_at_once(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    vision_job = await job_with_checkpoints(pool, store, [1])
    ml_job = await job_with_checkpoints(pool, store, [1], team="ml", name="tabular")
    async with app_as(pool, store, VISION) as vision, app_as(pool, store, ML) as ml:
        assert (await register(vision, "vision", "digits", vision_job)).status_code == 201
        assert (await register(ml, "ml", "tabular", ml_job)).status_code == 201
        held = Held(store)
        first = [asyncio.create_task(_download(vision, "vision", "digits")) for _ in range(2)]
        for _ in range(2):
            await asyncio.wait_for(held.entered.get(), 30)
        # A third of the same team: refused at once, its artifact never read.
        refused = await refused_before_entering(
            _download(vision, "vision", "digits"), held.entered, held.let_in
        )
        assert int(refused.headers["retry-after"]) >= 1
        assert "transfers" in refused.json()["detail"], refused.text
        assert "vision" in refused.json()["detail"], refused.text
        # Another team is not held back by vision's.
        other = asyncio.create_task(_download(ml, "ml", "tabular"))
        await asyncio.wait_for(held.entered.get(), 30)
        held.release.set()
        for task in [*first, other]:
            answer = await task
            assert answer.status_code == 200, answer.text
        # Ended, they hold nothing: the team may transfer again.
        again = await _download(vision, "vision", "digits")
        assert again.status_code == 200, again.text
        assert held.most == 3


async def test_a_teams_share_of_transfers_holds_across_replicas(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Before, each replica counted a team's transfers in its own memory: with two replicas
    a team had twice its share. Now the places are held in the registry's database
    (``shared.slots``), so a team's third transfer is refused whichever replica it reaches."""
    vision_job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, VISION) as first, app_as(pool, store, VISION) as second:
        assert (await register(first, "vision", "digits", vision_job)).status_code == 201
        held = Held(store)
        under_way = [
            asyncio.create_task(_download(replica, "vision", "digits"))
            for replica in (first, second)
        ]
        for _ in range(2):
            await asyncio.wait_for(held.entered.get(), 30)
        for replica in (first, second):
            refused = await refused_before_entering(
                _download(replica, "vision", "digits"), held.entered, held.let_in
            )
            assert "TRAINYARD_REGISTRY_MAX_TRANSFERS_PER_TEAM" in refused.json()["detail"]
        held.release.set()
        for task in under_way:
            answer = await task
            assert answer.status_code == 200, answer.text
        assert held.most == 2
        # Ended, their places are given back: either replica may transfer again.
        for replica in (first, second):
            again = await _download(replica, "vision", "digits")
            assert again.status_code == 200, again.text


async def test_transfers_run_over_a_pool_of_one_connection(
    pool: asyncpg.Pool, store: ObjectStore, database_url: str
) -> None:
    """Before, a registration held a connection of the pool (its transaction) while its
    transfer took a place through the same pool: with as many registrations at once as the
    pool has connections, each waited for a connection none gave back, and answered 503 once
    the pool's acquire timeout ended. A pool of one connection shows it with one request.
    Now no route holds a connection while it takes or gives back a place."""
    vision_job = await job_with_checkpoints(pool, store, [1])
    one = DatabaseSettings(
        url=database_url, pool_min_size=1, pool_max_size=1, acquire_timeout_seconds=2
    )
    async with (
        asyncio.timeout(120),
        open_pool(one, NAME) as small,
        app_as(small, store, VISION) as vision,
    ):
        registered = await register(vision, "vision", "digits", vision_job)
        assert registered.status_code == 201, registered.text
        again = await register(vision, "vision", "digits", vision_job)
        assert again.status_code == 201, again.text
        assert (await _download(vision, "vision", "digits")).status_code == 200
        content = await vision.get("/v1/models/vision/digits/versions/2/content")
        assert content.status_code == 200, content.text
        # Every place given back: none is left held.
        assert await small.fetchval("SELECT count(*) FROM held_slots") == 0
