"""Fixtures for the submission service against real PostgreSQL and NATS.

``submission`` runs the service's parts in the test's event loop exactly as ``serve`` wires
them (migrated pool, outbox relay, the ``submission`` consumer through ``idempotent``, the
Litestar app over the object store ``TRAINYARD_STORAGE_URI`` names: a folder of the test's
own) and talks to the app over ASGI with an httpx client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from trainyard_platform.services.submission import handlers, identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.service import MIGRATIONS, NAME, SUBJECTS, event_handler
from trainyard_platform.shared.bus import BatchHandler, Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import AllocationGranted
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.inbox import TransactionalHandler
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings, StorageSettings
from trainyard_platform.shared.storage import ObjectStore, open_store

SPEC: dict[str, Any] = {
    "name": "digits-cnn",
    "entrypoint": "examples.digits_cnn",
    "args": ["--epochs", "2"],
    "gpus": 1,
    "gpu_flavor": "cpu",
    "hyperparameters": {"lr": 0.01, "batch_size": 64, "optimizer": "adam", "amsgrad": False},
    "seed": 7,
}


@pytest.fixture
def settings(database_url: str, nats_settings: NatsSettings, tmp_path: Path) -> Settings:
    return Settings(
        database=DatabaseSettings(url=database_url),
        nats=nats_settings,
        storage=StorageSettings(uri=(tmp_path / "objects").as_uri()),
    )


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    async with open_pool(settings.database, NAME) as p:
        await migrate(p, NAME, MIGRATIONS)
        yield p


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    async with Bus.connect(nats_settings, "submission-test") as connected:
        yield connected


@dataclass
class Submission:
    """The service's parts, running, plus an HTTP client and a token per team."""

    client: httpx.AsyncClient
    pool: asyncpg.Pool
    bus: Bus
    store: ObjectStore
    admin_token: str
    other_team_token: str

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin_token}"}

    async def submit(self, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.client.post("/v1/jobs", json=spec or SPEC, headers=self.auth())
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    async def job(self, job_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/jobs/{job_id}", headers=self.auth())
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def publish(
        self, payload: Payload, subject: str | None = None, source: str | None = None
    ) -> Envelope[Payload]:
        """Publish ``payload`` as ``source`` would (default: its owner; the scheduler's
        ``trainyard/scheduler`` is the one whose ``job.failed`` ends a job)."""
        if subject is None:
            # Routing key: the node for grants, the job for everything else (docs/events.md).
            key = "node_id" if isinstance(payload, AllocationGranted) else "job_id"
            subject = str(getattr(payload, key))
        envelope = Envelope.wrap(payload, source=source or owner(payload), subject=subject)
        await self.bus.publish(envelope)
        return envelope

    async def wait_for(
        self, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 15
    ) -> dict[str, Any]:
        """Poll the job view until ``done(view)``; fail with the last view on timeout."""
        view: dict[str, Any] = {}
        try:
            async with asyncio.timeout(timeout):
                while True:
                    view = await self.job(job_id)
                    if done(view):
                        return view
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pytest.fail(f"job view never reached the expected state; last view: {view}")


@contextlib.asynccontextmanager
async def running_submission(
    settings: Settings,
    pool: asyncpg.Pool,
    bus: Bus,
    dispatch: TransactionalHandler = handlers.dispatch,
    wrap: Callable[[BatchHandler], BatchHandler] = lambda h: h,
) -> AsyncIterator[Submission]:
    """The service's parts around ``dispatch`` (the service's own unless a test spies on
    it); ``wrap`` sees every delivery, before the inbox check."""
    stop = asyncio.Event()
    consumer = wrap(event_handler(pool, dispatch))
    tasks = [
        asyncio.create_task(OutboxRelay(pool, bus, idle_poll_s=0.1).run(stop)),
        asyncio.create_task(bus.consume_batches(NAME, SUBJECTS, consumer, stop)),
    ]
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    other = await identity.bootstrap_user(pool, "vision", "bob")
    store = open_store(settings.storage.uri, settings.storage)
    try:
        # ASGI in this event loop (Litestar's AsyncTestClient runs the app on another loop,
        # where the pool's connections cannot be used).
        app = create_app(settings, AppDeps(pool=pool, store=store))
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://submission") as client:
            yield Submission(client, pool, bus, store, admin, other)
    finally:
        stop.set()
        await asyncio.gather(*tasks)


@pytest.fixture
async def submission(settings: Settings, pool: asyncpg.Pool, bus: Bus) -> AsyncIterator[Submission]:
    async with running_submission(settings, pool, bus) as running:
        yield running


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)
