"""Admission of the datasets and parent model a job names, end to end on real PostgreSQL:
submission asks the registry's app (its real guard, which checks the user's token with
submission's ``/v1/me``) with the submitting user's own token, and refuses at admission
(422 naming the item, one message for "does not exist" and "not granted") what the team may
not read; what it admits is stored resolved to versions."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.registry.modelkit import apply
from tests.integration.registry.test_registry import ref, spec, started, succeeded
from tests.integration.submission.conftest import SPEC
from trainyard_platform.services.registry.api import create_app as registry_app
from trainyard_platform.services.registry.service import MIGRATIONS as REGISTRY_MIGRATIONS
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.service import NAME
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.identity import IdentityClient
from trainyard_platform.shared.storage import ObjectStore, open_store

pytestmark = pytest.mark.integration


@dataclass
class Platform:
    submission: httpx.AsyncClient
    registry: httpx.AsyncClient
    registry_pool: asyncpg.Pool
    store: ObjectStore
    vision: str
    ml: str
    tokens: dict[str, str]

    def auth(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[team]}"}

    async def submit(self, team: str, **fields: Any) -> httpx.Response:
        return await self.submission.post(
            "/v1/jobs", json={**SPEC, **fields}, headers=self.auth(team)
        )

    async def dataset(self, team: str, name: str) -> None:
        body = {"uri": f"s3://data/{name}", "sha256": "b" * 64, "size_bytes": 10}
        answer = await self.registry.post(
            f"/v1/datasets/{team}/{name}/versions", json=body, headers=self.auth(team)
        )
        assert answer.status_code == 201, answer.text


@pytest.fixture
async def stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    async with contextlib.AsyncExitStack() as entered:
        yield entered


@pytest.fixture
async def platform(
    settings: Settings,
    pool: asyncpg.Pool,
    database_url: str,
    stack: contextlib.AsyncExitStack,
) -> AsyncIterator[Platform]:
    tag = uuid.uuid4().hex[:6]
    vision, ml = f"vision{tag}", f"ml{tag}"
    tokens = {
        vision: await identity.bootstrap_user(pool, vision, "bob"),
        ml: await identity.bootstrap_user(pool, ml, "alice"),
    }
    store = open_store(settings.storage.uri, settings.storage)
    apps: dict[str, Any] = {}
    # Submission's app gets a pool of one connection: the registry checks the user's token
    # with submission's /v1/me while submission waits on it, so a submission that held its
    # connection through admission would wait on itself.
    one = settings.database.model_copy(update={"pool_min_size": 1, "pool_max_size": 1})
    front = await stack.enter_async_context(open_pool(one, NAME))

    async def registry_asgi(scope: Any, receive: Any, send: Any) -> None:
        await apps["registry"](scope, receive, send)

    submission = create_app(
        settings.model_copy(update={"registry_url": "http://registry"}),
        AppDeps(
            pool=front,
            store=store,
            registry_transport=httpx.ASGITransport(app=registry_asgi),
        ),
    )
    to_submission = httpx.ASGITransport(app=submission)  # type: ignore[arg-type]
    async with (
        open_pool(settings.database.model_copy(update={"url": database_url}), "registry") as rp,
        httpx.AsyncClient(transport=to_submission, base_url="http://submission") as client,
        httpx.AsyncClient(transport=to_submission, base_url="http://submission") as me,
    ):
        await migrate(rp, "registry", REGISTRY_MIGRATIONS)
        guard = service_guard(SecretStr("operator-token"), IdentityClient("", http=me))
        apps["registry"] = registry_app(rp, guard, [], store=store)
        to_registry = httpx.ASGITransport(app=apps["registry"])
        async with httpx.AsyncClient(transport=to_registry, base_url="http://registry") as reg:
            yield Platform(client, reg, rp, store, vision, ml, tokens)


async def model_version(p: Platform, team: str, name: str) -> None:
    """Version 1 of model ``team/name``, registered by the registry's own success handler."""
    job = str(uuid.uuid4())
    job_spec = spec(name, team)
    await apply(p.registry_pool, p.store, job, started(job, f"a-{job}", 0, job_spec))
    await apply(p.registry_pool, p.store, job, succeeded(job, f"a-{job}", ref(p.store, job, 3)))


def errors(answer: httpx.Response) -> dict[str, str]:
    assert answer.status_code == 422, answer.text
    return {e["field"]: e["message"] for e in answer.json()["errors"]}


async def test_what_the_team_may_read_is_admitted_resolved_to_versions(platform: Platform) -> None:
    p = platform
    await p.dataset(p.vision, "raw")
    await p.dataset(p.vision, "raw")
    await p.dataset(p.ml, "features")
    granted = await p.registry.put(
        f"/v1/datasets/{p.ml}/features/grants/{p.vision}", headers=p.auth(p.ml)
    )
    assert granted.status_code == 200, granted.text
    await model_version(p, p.vision, "base")
    moved = await p.registry.put(
        f"/v1/models/{p.vision}/base/aliases/production",
        json={"version": 1},
        headers=p.auth(p.vision),
    )
    assert moved.status_code == 200, moved.text

    answer = await p.submit(
        p.vision,
        datasets=[f"{p.vision}/raw", f"{p.ml}/features:1"],
        parent_model=f"{p.vision}/base@production",
    )
    assert answer.status_code == 201, answer.text
    stored = answer.json()["spec"]
    assert stored["datasets"] == [f"{p.vision}/raw:2", f"{p.ml}/features:1"]
    assert stored["parent_model"] == f"{p.vision}/base:1"


async def test_what_the_team_may_not_read_is_refused_without_saying_whether_it_exists(
    platform: Platform,
) -> None:
    p = platform
    await p.dataset(p.ml, "private")
    await p.dataset(p.ml, "shared")
    await p.registry.put(f"/v1/datasets/{p.ml}/shared/grants/{p.vision}", headers=p.auth(p.ml))
    await model_version(p, p.ml, "theirs")

    refused = errors(
        await p.submit(
            p.vision,
            datasets=[f"{p.ml}/shared", f"{p.ml}/private", f"{p.ml}/nothing", f"{p.ml}/shared:9"],
            parent_model=f"{p.ml}/theirs:1",
        )
    )
    assert set(refused) == {"datasets[1]", "datasets[2]", "datasets[3]", "parent_model"}
    assert refused["datasets[1]"] == refused["datasets[2]"]  # not granted == does not exist
    missing_model = errors(await p.submit(p.vision, parent_model=f"{p.vision}/none:1"))
    assert missing_model["parent_model"] == refused["parent_model"]

    revoked = await p.registry.delete(
        f"/v1/datasets/{p.ml}/shared/grants/{p.vision}", headers=p.auth(p.ml)
    )
    assert revoked.json()["changed"] is True
    assert list(errors(await p.submit(p.vision, datasets=[f"{p.ml}/shared"]))) == ["datasets[0]"]
    # The owner itself is admitted.
    assert (await p.submit(p.ml, datasets=[f"{p.ml}/shared"])).status_code == 201


async def test_without_an_answer_from_the_registry_nothing_naming_data_is_admitted(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    token = await identity.bootstrap_user(pool, f"t{uuid.uuid4().hex[:6]}", "carol")
    store = open_store(settings.storage.uri, settings.storage)
    headers = {"Authorization": f"Bearer {token}"}
    body = {**SPEC, "datasets": ["vision/raw"]}
    for registry_url, status in (("http://127.0.0.1:9", 503), (None, 422)):
        app = create_app(
            settings.model_copy(update={"registry_url": registry_url}),
            AppDeps(pool=pool, store=store),
        )
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            answer = await client.post("/v1/jobs", json=body, headers=headers)
            assert answer.status_code == status, answer.text
            plain = await client.post("/v1/jobs", json=SPEC, headers=headers)
            assert plain.status_code == 201, plain.text  # a job naming no data never asks


async def test_a_parent_model_of_another_team_is_admitted_only_with_a_grant(
    platform: Platform,
) -> None:
    p = platform
    await model_version(p, p.ml, "shared")
    grants = f"/v1/models/{p.ml}/shared/grants/{p.vision}"

    refused = errors(await p.submit(p.vision, parent_model=f"{p.ml}/shared:1"))
    assert list(refused) == ["parent_model"]
    assert "has not granted it" in refused["parent_model"]
    # The grant is the owning team's admin's to give (the bootstrap user is an admin).
    assert (await p.registry.put(grants, headers=p.auth(p.vision))).status_code == 404
    granted = await p.registry.put(grants, headers=p.auth(p.ml))
    assert granted.status_code == 200, granted.text
    assert granted.json() == {
        "team": p.ml,
        "name": "shared",
        "grantee_team": p.vision,
        "granted": True,
        "changed": True,
    }

    answer = await p.submit(p.vision, parent_model=f"{p.ml}/shared:1")
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["parent_model"] == f"{p.ml}/shared:1"

    revoked = await p.registry.delete(grants, headers=p.auth(p.ml))
    assert revoked.json()["changed"] is True
    again = errors(await p.submit(p.vision, parent_model=f"{p.ml}/shared:1"))
    assert again == refused  # revoked: the very next job is refused, as before the grant


async def test_a_retry_is_its_keys_job_though_the_latest_version_changed(
    platform: Platform,
) -> None:
    """A dataset named without a version is the latest one at admission: a retry under the
    same ``Idempotency-Key`` after a newer version came is the job its key made (with the
    version it was admitted with), not a conflict with it."""
    p = platform
    await p.dataset(p.vision, "raw")
    headers = {**p.auth(p.vision), "Idempotency-Key": "nightly-raw"}
    body = {**SPEC, "datasets": [f"{p.vision}/raw"]}
    first = await p.submission.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 201, first.text
    await p.dataset(p.vision, "raw")  # version 2
    again = await p.submission.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["spec"]["datasets"] == [f"{p.vision}/raw:1"]
    other = {**body, "datasets": [f"{p.vision}/raw:2"]}
    refused = await p.submission.post("/v1/jobs", json=other, headers=headers)
    assert refused.status_code == 409, refused.text
    assert "Idempotency-Key" in refused.json()["detail"]


async def test_the_spec_carries_the_id_of_the_parent_version_admitted(platform: Platform) -> None:
    """Admission resolves ``parent_model`` to a version and puts that version's id in the
    job's spec (``parent_model_version_id``), so the registry records that very version as
    the job's parent, even if the model is deleted and made again under its name before it
    hears of the job. A caller may give the id, as a pin (a rerun sends its stored spec
    back): the id of the version ``parent_model`` names is admitted, any other is refused
    with 422 naming the field, and so is one without a ``parent_model``. Before, the spec
    carried only ``team/name:version``, which the registry looked up by name when its
    ``job.submitted`` arrived."""
    p = platform
    await model_version(p, p.vision, "base")
    version = await p.registry.get(
        f"/v1/models/{p.vision}/base/versions/1", headers=p.auth(p.vision)
    )
    assert version.status_code == 200, version.text

    answer = await p.submit(p.vision, parent_model=f"{p.vision}/base:1")
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["parent_model_version_id"] == version.json()["id"]
    plain = await p.submit(p.vision)
    assert plain.status_code == 201, plain.text
    assert plain.json()["spec"]["parent_model_version_id"] is None

    forged = await p.submit(
        p.vision, parent_model=f"{p.vision}/base:1", parent_model_version_id=str(uuid.uuid4())
    )
    assert list(errors(forged)) == ["parent_model_version_id"]
    assert "is not the id of the version" in errors(forged)["parent_model_version_id"]
    orphan = await p.submit(p.vision, parent_model_version_id=version.json()["id"])
    assert list(errors(orphan)) == ["parent_model_version_id"]
    pinned = await p.submit(
        p.vision, parent_model=f"{p.vision}/base:1", parent_model_version_id=version.json()["id"]
    )
    assert pinned.status_code == 201, pinned.text
    assert pinned.json()["spec"]["parent_model_version_id"] == version.json()["id"]
