"""A model, version, alias or dataset that is not there answers a 404 that says what is there
and what to do, drawn only from what the caller may read.

Before, every such 404 was a dead end: ``no model 'digit' in team 'vision'`` beside a model
``digits``, ``no version 1`` for a version that was deleted (while ``download`` said it was
deleted), ``no alias 'prd'`` beside ``prod``; the CLI printed it as it came."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.integration.registry.modelkit import (
    ML,
    VISION,
    VISION_ADMIN,
    app_as,
    job_with_checkpoints,
    register,
)
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration

DATASET = {"uri": "s3://data/mnist.parquet", "sha256": "a" * 64, "size_bytes": 10}


async def detail(answer: httpx.Response) -> str:
    assert answer.status_code == 404, answer.text
    text: str = answer.json()["detail"]
    return text


async def test_what_is_not_there_says_what_is(pool: asyncpg.Pool, store: ObjectStore) -> None:
    job = await job_with_checkpoints(pool, store, [1, 2])
    async with app_as(pool, store, VISION) as client:
        for _ in range(2):
            assert (await register(client, "vision", "digits", job)).status_code == 201
        prod = await client.put("/v1/models/vision/digits/aliases/prod", json={"version": 2})
        assert prod.status_code == 200
        assert (await client.delete("/v1/models/vision/digits/versions/1")).status_code == 200
        made = await client.post("/v1/datasets/vision/mnist/versions", json=DATASET)
        assert made.status_code == 201

        model = "/v1/models/vision/digits"
        typo = await detail(await client.get("/v1/models/vision/digit"))
        assert typo == (
            "no model 'digit' in team 'vision': did you mean 'digits'? "
            "(trainyard model ls lists the models you may read)"
        )
        for path in (
            "/v1/models/vision/Digits/versions/2",
            "/v1/models/vision/Digits/versions",
            "/v1/models/vision/Digits/aliases",
            "/v1/models/vision/Digits/versions/by-alias/prod",
            "/v1/lineage/models/vision/Digits/versions/2/upstream",
        ):
            assert "did you mean 'digits'?" in await detail(await client.get(path)), path
        deleted = (
            "version 1 of model 'digits' in team 'vision' was deleted; its latest live version "
            "is 2 (trainyard model show vision/digits lists them)"
        )
        for path in (f"{model}/versions/1", f"{model}/versions/1/download"):
            assert await detail(await client.get(path)) == deleted, path
        never = await detail(await client.get(f"{model}/versions/9"))
        assert never.startswith("no version 9 of model 'digits' in team 'vision'; its latest")
        moved = await client.put(f"{model}/aliases/stable", json={"version": 9})
        assert "its latest live version is 2" in await detail(moved)
        prd = await detail(await client.get(f"{model}/versions/by-alias/prd"))
        assert prd == "no alias 'prd' of model 'digits' in team 'vision': did you mean 'prod'?"
        other = await detail(await client.get(f"{model}/versions/by-alias/staging"))
        assert other.endswith("its aliases are prod")
        assert "its aliases are prod" in await detail(await client.delete(f"{model}/aliases/x"))
        # A model with no alias at all (there is nothing to guess from).
        assert (await register(client, "vision", "plain", job)).status_code == 201
        bare = await detail(await client.get("/v1/models/vision/plain/versions/by-alias/prod"))
        assert bare == (
            "no alias 'prod' of model 'plain' in team 'vision'; it has no aliases "
            "(trainyard model alias set vision/plain prod VERSION makes one)"
        )

        mnst = await detail(await client.get("/v1/datasets/vision/mnst"))
        assert mnst == (
            "no dataset 'mnst' in team 'vision': did you mean 'mnist'? "
            "(trainyard dataset ls lists the datasets you may read)"
        )
        for path in (
            "/v1/datasets/vision/mnist/versions/5",
            "/v1/lineage/datasets/vision/mnist/versions/5/downstream",
        ):
            assert await detail(await client.get(path)) == (
                "no version 5 of dataset 'mnist' in team 'vision'; its latest version is 1 "
                "(trainyard dataset show vision/mnist lists them)"
            ), path

    # Another team: what it may not read answers as what does not exist, hint included.
    nothing = (
        "no model 'digits' in team 'vision' (trainyard model ls lists the models you may read)"
    )
    async with app_as(pool, store, ML) as client:
        for path in (
            "/v1/models/vision/digits",
            "/v1/models/vision/digits/versions/2",
            "/v1/models/vision/digits/versions/by-alias/prod",
            "/v1/lineage/models/vision/digits/versions/2/upstream",
        ):
            assert await detail(await client.get(path)) == nothing, path
        assert "did you mean" not in await detail(await client.get("/v1/models/vision/digit"))
        assert "did you mean" not in await detail(await client.get("/v1/datasets/vision/mnst"))
    async with app_as(pool, store, VISION_ADMIN) as client:
        granted = await client.put("/v1/models/vision/digits/grants/ml")
        assert granted.status_code == 200, granted.text
    async with app_as(pool, store, ML) as client:
        typo = await detail(await client.get("/v1/models/vision/digit"))
        assert "did you mean 'digits'?" in typo
        assert "latest live version is 2" in await detail(
            await client.get("/v1/models/vision/digits/versions/1")
        )


async def test_a_checkpoint_not_committed_says_which_is(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Registering a job's checkpoint it did not commit names the one it did commit last;
    a job that committed none says so in words (it said ``has no committed checkpoint
    any``)."""
    job = await job_with_checkpoints(pool, store, [10, 20])
    empty = await job_with_checkpoints(pool, store, [])
    async with app_as(pool, store, VISION) as client:
        wrong = await register(client, "vision", "digits", job, checkpoint_uri="s3://x/y.pt")
        assert await detail(wrong) == (
            f"job {job.id!r} has no committed checkpoint 's3://x/y.pt'; the latest it "
            f"committed is {job.checkpoints[1].uri} (step 20), the one registered when "
            "checkpoint_uri (trainyard model register --checkpoint) is left out"
        )
        none = await register(client, "vision", "digits", empty)
        assert await detail(none) == (
            f"job {empty.id!r} has committed no checkpoint yet: a job's runner reports each "
            "checkpoint it commits, and only those can be registered"
        )
        named = await register(client, "vision", "digits", empty, checkpoint_uri="s3://x/y.pt")
        assert "has committed no checkpoint yet" in await detail(named)
    assert store.list("registry/") == []


async def test_a_change_to_another_teams_model_or_dataset_says_whose_it_is(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A team a model is granted to reads it, and was told ``no model 'digits' in team
    'vision'`` when it tried to move an alias of it or register a version, as if the model
    it had just listed did not exist. Every change to another team's model or dataset now
    says whose it is, in words that are the same whether it exists or not."""
    job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
        made = await client.post("/v1/datasets/vision/mnist/versions", json=DATASET)
        assert made.status_code == 201
    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await client.put("/v1/models/vision/digits/grants/ml")).status_code == 200
    async with app_as(pool, store, ML) as client:
        assert (await client.get("/v1/models/vision/digits")).status_code == 200
        for name in ("digits", "nothing-here"):
            model = f"/v1/models/vision/{name}"
            says = (
                f"no model {name!r} in team 'vision' that your team may change: only team "
                "'vision' changes its models (a grant lets another team read them)"
            )
            for method, path, body in (
                ("PUT", f"{model}/aliases/prod", {"version": 1}),
                ("DELETE", f"{model}/aliases/prod", None),
                ("DELETE", f"{model}/versions/1", None),
                ("POST", f"{model}/versions", {"job_id": job.id}),
                ("PUT", f"{model}/grants/audio", None),
            ):
                answer = await client.request(method, path, json=body)
                assert await detail(answer) == says, (method, path)
        for name in ("mnist", "nothing-here"):
            dataset = f"/v1/datasets/vision/{name}"
            says = (
                f"no dataset {name!r} in team 'vision' that your team may change: only team "
                "'vision' changes its datasets (a grant lets another team read them)"
            )
            for method, path, body in (
                ("POST", f"{dataset}/versions", DATASET),
                ("PUT", f"{dataset}/grants/audio", None),
                ("DELETE", f"{dataset}/grants/audio", None),
            ):
                answer = await client.request(method, path, json=body)
                assert await detail(answer) == says, (method, path)


async def test_a_job_the_registry_has_not_seen_start_says_so(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A job submitted but not started yet (or of another team, or none) was ``no job 'x' in
    team 'vision'``, though ``trainyard ls`` lists it: the registry learns a job when it
    starts, and registers only what a started job committed."""
    async with app_as(pool, store, VISION) as client:
        queued = await client.post("/v1/models/vision/digits/versions", json={"job_id": "j-1"})
        assert await detail(queued) == (
            "no started job 'j-1' in team 'vision': the registry learns a job when it starts, "
            "and registers only checkpoints a started job of the team committed"
        )
