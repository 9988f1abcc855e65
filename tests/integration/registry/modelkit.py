"""What the model-lifecycle tests share: jobs whose checkpoints are really in the S3 store,
recorded through the registry's own handlers, and the app as a given caller (roles enforced
as ``service_guard`` enforces them)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx

from tests.integration.registry.test_registry import (
    T0,
    client_of,
    envelopes,
    ref,
    spec,
    started,
)
from trainyard_platform.services.registry.api import create_app
from trainyard_platform.services.registry.handlers import RegistryHandlers
from trainyard_platform.shared.access import enforce_least_role, remember
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Payload
from trainyard_platform.shared.events.payloads import CheckpointRef, CheckpointSaved
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.storage import ObjectStore

VISION = Principal(user="alice", team="vision", role=Role.MEMBER, token_id=1)
VISION_VIEWER = Principal(user="vic", team="vision", role=Role.VIEWER, token_id=3)
VISION_ADMIN = Principal(user="ada", team="vision", role=Role.ADMIN, token_id=4)
ML = Principal(user="bob", team="ml", role=Role.ADMIN, token_id=2)
OPERATOR = Principal(user="op", team=None, role=Role.OPERATOR, token_id=None)
TEAMS = frozenset({"vision", "ml", "audio", "platform"})
"""The teams that exist, as the submission service would answer (``Teams``)."""


async def team_exists(team: str) -> bool:
    return team in TEAMS


def app_as(
    pool: asyncpg.Pool,
    store: ObjectStore,
    principal: Principal,
    download_url_seconds: int = 300,
) -> httpx.AsyncClient:
    async def guard(connection: Any, handler: Any) -> None:
        remember(connection, principal, team_exists)
        enforce_least_role(principal, connection, handler)

    app = create_app(pool, guard, [], store=store, download_url_seconds=download_url_seconds)
    return client_of(app)


@dataclass(frozen=True)
class Job:
    id: str
    checkpoints: list[CheckpointRef]

    def key(self, step: int) -> str:
        return f"jobs/{self.id}/checkpoints/step-{step:08d}/checkpoint.pt"


async def apply(pool: asyncpg.Pool, store: ObjectStore, job_id: str, payload: Payload) -> None:
    """Hand ``payload`` (from its owner) to the registry's handlers, as the bus would."""
    handle = RegistryHandlers(store).consumer(pool)
    for envelope in envelopes(payload, job_id):
        await handle([Delivery(envelope)])


async def commit_checkpoint(
    pool: asyncpg.Pool, store: ObjectStore, job_id: str, step: int, *, record: bool = True
) -> CheckpointRef:
    """A checkpoint of ``job_id`` (object and manifest) in ``store``, recorded as the
    runner's ``checkpoint.saved`` would be unless ``record`` is False (still in flight)."""
    checkpoint = ref(store, job_id, step)
    store.put_bytes(checkpoint.manifest_uri.rpartition(f"{store.root_uri}/")[2], b"{}")
    if record:
        saved = CheckpointSaved(
            job_id=job_id,
            allocation_id=f"alloc-{job_id}",
            epoch=1,
            checkpoint=checkpoint,
            saved_at=T0,
        )
        await apply(pool, store, job_id, saved)
    return checkpoint


async def job_with_checkpoints(
    pool: asyncpg.Pool,
    store: ObjectStore,
    steps: list[int],
    team: str = "vision",
    name: str = "digits",
) -> Job:
    """A started job of ``team`` that committed a checkpoint at each of ``steps`` (objects in
    ``store``; ``checkpoint.saved`` recorded by the registry's handlers)."""
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    apply = RegistryHandlers(store).consumer(pool)

    async def handle(payload: Payload) -> None:
        for envelope in envelopes(payload, job_id):
            await apply([Delivery(envelope)])

    allocation = f"alloc-{job_id}"  # allocation ids are unique across jobs
    await handle(started(job_id, allocation, 0, spec(name, team)))
    refs = []
    for step in steps:
        checkpoint = ref(store, job_id, step)
        refs.append(checkpoint)
        await handle(
            CheckpointSaved(
                job_id=job_id,
                allocation_id=allocation,
                epoch=1,
                checkpoint=checkpoint,
                saved_at=T0,
            )
        )
    return Job(job_id, refs)


async def register(
    client: httpx.AsyncClient, team: str, model: str, job: Job, **body: Any
) -> httpx.Response:
    return await client.post(f"/v1/models/{team}/{model}/versions", json={"job_id": job.id, **body})
