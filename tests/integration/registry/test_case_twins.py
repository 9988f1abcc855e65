"""Model and dataset names are unique in a team regardless of case, on real PostgreSQL and
S3 (docs/models.md, docs/datasets.md): a new ``Digits`` beside ``digits`` is a 409 naming
the field and the name that exists, nothing stored, even when two creates race; a job whose
name differs only by case from a model of its team adds its version to that model (never a
second model, never a dead letter), and its run to that experiment; lookups stay exact."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.integration.registry.modelkit import (
    ML,
    VISION,
    app_as,
    apply,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_datasets import add
from tests.integration.registry.test_registry import succeeded
from trainyard_platform.shared.events.payloads import ModelRegistered
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


def clash(kind: str, existing: str, team: str = "vision") -> dict[str, object]:
    message = (
        f"a {kind} named {existing!r} exists in team {team}; names differ from it only by case"
    )
    return {"detail": f"name: {message}", "errors": [{"field": "name", "message": message}]}


async def _names(pool: asyncpg.Pool, table: str) -> list[tuple[str, str]]:
    rows = await pool.fetch(f"SELECT team, name FROM {table} ORDER BY id")
    return [(r["team"], r["name"]) for r in rows]


async def test_a_model_differing_only_by_case_is_a_409_and_lookups_stay_exact(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    first = await job_with_checkpoints(pool, store, [1], name="digits")
    await apply(pool, store, first.id, succeeded(first.id, f"alloc-{first.id}", None))
    copies = store.list("registry/")
    other = await job_with_checkpoints(pool, store, [2], name="other")
    async with app_as(pool, store, VISION) as client:
        for name in ("Digits", "DIGITS"):
            refused = await register(client, "vision", name, other)
            assert refused.status_code == 409, refused.text
            assert refused.json() == clash("model", "digits")
        assert (await client.get("/v1/models/vision/Digits")).status_code == 404
        assert (await client.get("/v1/models/vision/digits")).status_code == 200
        # Another team's model of that name is another model.
    ml_job = await job_with_checkpoints(pool, store, [3], team="ml", name="x")
    async with app_as(pool, store, ML) as client:
        assert (await register(client, "ml", "Digits", ml_job)).status_code == 201
    assert await _names(pool, "models") == [("vision", "digits"), ("ml", "Digits")]
    assert [k for k in store.list("registry/") if k.startswith("registry/vision/")] == copies


async def test_a_job_named_like_a_model_but_for_case_adds_its_version_there(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    first = await job_with_checkpoints(pool, store, [1], name="digits")
    await apply(pool, store, first.id, succeeded(first.id, f"alloc-{first.id}", None))
    shouted = await job_with_checkpoints(pool, store, [4], name="DIGITS")
    await apply(pool, store, shouted.id, succeeded(shouted.id, f"alloc-{shouted.id}", None))
    assert await _names(pool, "models") == [("vision", "digits")]
    async with app_as(pool, store, VISION) as client:
        version = (await client.get("/v1/models/vision/digits/versions/2")).json()
    assert version["job_id"] == shouted.id
    assert version["model"] == "digits"
    registered = await pool.fetch(
        "SELECT convert_from(body, 'UTF8')::jsonb AS event FROM outbox ORDER BY seq"
    )
    events = [r["event"] for r in registered]
    named = [e["data"]["model_name"] for e in events if e["type"] == ModelRegistered.TYPE]
    assert named == ["digits", "digits"]
    # Its runs are the model's runs: one experiment, as for one spelling.
    experiments = await pool.fetch(
        "SELECT e.name, count(*) AS runs FROM experiments e "
        "JOIN tracked_jobs j ON j.experiment_id = e.id GROUP BY e.name"
    )
    assert [tuple(r) for r in experiments] == [("digits", 2)]


async def test_two_model_creates_at_once_differing_by_case_one_wins(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    jobs = [await job_with_checkpoints(pool, store, [1], name=f"j{i}") for i in range(2)]
    async with app_as(pool, store, VISION) as client:
        answers = await asyncio.gather(
            register(client, "vision", "alpha", jobs[0]),
            register(client, "vision", "Alpha", jobs[1]),
        )
    assert sorted(a.status_code for a in answers) == [201, 409], [a.text for a in answers]
    assert len(await _names(pool, "models")) == 1


async def test_a_dataset_differing_only_by_case_is_a_409_even_when_two_race(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    async with app_as(pool, store, VISION) as client:
        assert (await add(client, "vision", "digits")).status_code == 201
        for name in ("Digits", "DIGITS"):
            refused = await add(client, "vision", name)
            assert refused.status_code == 409, refused.text
            assert refused.json() == clash("dataset", "digits")
        assert (await add(client, "vision", "digits")).json()["version"] == 2  # exact: as before
        assert (await client.get("/v1/datasets/vision/Digits")).status_code == 404
        for round_ in range(5):
            answers = await asyncio.gather(
                add(client, "vision", f"faces{round_}"), add(client, "vision", f"FACES{round_}")
            )
            assert sorted(a.status_code for a in answers) == [201, 409], [a.text for a in answers]
    most = await pool.fetchval(
        "SELECT count(*) FROM datasets GROUP BY team, lower(name) ORDER BY 1 DESC LIMIT 1"
    )
    assert most == 1
