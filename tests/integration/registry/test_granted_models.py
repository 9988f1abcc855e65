"""A model granted to a team is first-class for it, on a real PostgreSQL and S3 endpoint:
its lineage is a valid starting point and a granted parent is shown in the grantee's own
lineage (the owner's jobs and checkpoints stay hidden, counted); the grantee lists what was
granted to it (``GET /v1/models?granted=true``), no other team does; a revoked grant closes
all of it again at once; and registering a version answers it with its ``cost``."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.registry.modelkit import (
    ML,
    OPERATOR,
    VISION,
    app_as,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_datasets import add
from tests.integration.registry.test_lineage import ids, run_job
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration

NLP = Principal(user="nina", team="nlp", role=Role.MEMBER, token_id=6)


async def upstream(client: httpx.AsyncClient, team: str, name: str) -> httpx.Response:
    return await client.get(f"/v1/lineage/models/{team}/{name}/versions/1/upstream")


async def body(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def granted_names(client: httpx.AsyncClient, **params: str) -> list[str]:
    listed = await body(await client.get("/v1/models", params={"granted": "true", **params}))
    return [f"{m['team']}/{m['name']}" for m in listed["models"]]


async def test_lineage_starts_from_and_shows_a_granted_model_until_revoked(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    base, tuned = f"base-{tag}", f"tuned-{tag}"
    grant = f"/v1/models/ml/{base}/grants/vision"
    base_job = await run_job(pool, store, base, team="ml")
    base_node = f"model_version:ml/{base}:1"

    # Without a grant: ml's model is no starting point for vision (404 as for no model).
    async with app_as(pool, store, VISION) as vision:
        assert (await upstream(vision, "ml", base)).status_code == 404
        assert (await upstream(vision, "ml", f"none-{tag}")).status_code == 404

    async with app_as(pool, store, ML) as ml:
        assert (await ml.put(grant)).status_code == 200
    tuned_job = await run_job(pool, store, tuned, parent_model=f"ml/{base}:1")

    async with app_as(pool, store, VISION) as vision:
        theirs = await body(await upstream(vision, "ml", base))
        mine = await body(await upstream(vision, "vision", tuned))
    # The granted model is shown; the job and checkpoint that made it are ml's: hidden.
    assert ids(theirs) == {base_node} and theirs["hidden"] == 2
    assert base_node in ids(mine) and f"job:{base_job}" not in ids(mine)
    assert mine["hidden"] == 2
    edges = {(e["from"], e["to"], e["relation"]) for e in mine["edges"]}
    assert (base_node, f"job:{tuned_job}", "fine_tuned_by") in edges
    shown = next(n for n in mine["nodes"] if n["id"] == base_node)
    assert (shown["team"], shown["name"], shown["version"]) == ("ml", base, 1)
    # Its cost as vision reads it: ml's job counted, not listed; ml lists it.
    async with app_as(pool, store, VISION) as vision:
        cost = (await body(await vision.get(f"/v1/models/ml/{base}/versions/1")))["cost"]
    assert cost["jobs"] == [] and cost["hidden_jobs"] == 1
    async with app_as(pool, store, ML) as ml:
        owner = (await body(await ml.get(f"/v1/models/ml/{base}/versions/1")))["cost"]
    assert [j["job_id"] for j in owner["jobs"]] == [base_job] and owner["hidden_jobs"] == 0
    async with app_as(pool, store, NLP) as nlp:  # granted to vision, not to nlp
        assert (await upstream(nlp, "ml", base)).status_code == 404
    async with app_as(pool, store, OPERATOR) as operator:
        everything = await body(await upstream(operator, "vision", tuned))
        assert f"job:{base_job}" in ids(everything) and everything["hidden"] == 0

    # Revoked: no starting point again, and the parent counts as hidden in vision's own.
    async with app_as(pool, store, ML) as ml:
        assert (await ml.delete(grant)).json()["changed"] is True
    async with app_as(pool, store, VISION) as vision:
        assert (await upstream(vision, "ml", base)).status_code == 404
        after = await body(await upstream(vision, "vision", tuned))
    assert base_node not in ids(after) and after["hidden"] == 3
    assert ids(after) == ids(mine) - {base_node}


async def test_only_the_grantee_team_lists_what_was_granted_to_it(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [5], team="ml", name=name)
    async with app_as(pool, store, ML) as ml:
        assert (await register(ml, "ml", name, job)).status_code == 201
    async with app_as(pool, store, VISION) as vision:
        assert f"ml/{name}" not in await granted_names(vision)

    async with app_as(pool, store, ML) as ml:
        assert (await ml.put(f"/v1/models/ml/{name}/grants/vision")).status_code == 200
        assert f"ml/{name}" not in await granted_names(ml)  # ml's own: not granted to it
    async with app_as(pool, store, VISION) as vision:
        listed = await granted_names(vision)
        assert f"ml/{name}" in listed and all(not n.startswith("vision/") for n in listed)
        assert f"ml/{name}" in await granted_names(vision, team="ml")
        assert await granted_names(vision, team="nlp") == []
        own = await body(await vision.get("/v1/models"))
        assert all(m["team"] == "vision" for m in own["models"])  # unchanged without it
        unknown = await vision.get("/v1/models", params={"granted": "true", "shared": "1"})
        assert unknown.status_code == 422
        assert [e["field"] for e in unknown.json()["errors"]] == ["shared"]
        twice = await vision.get("/v1/models?granted=true&granted=false")
        assert twice.status_code == 422 and twice.json()["errors"][0]["field"] == "granted"
    async with app_as(pool, store, NLP) as nlp:
        assert f"ml/{name}" not in await granted_names(nlp)
    async with app_as(pool, store, OPERATOR) as operator:
        refused = await operator.get("/v1/models", params={"granted": "true"})
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["field"] == "granted"

    async with app_as(pool, store, ML) as ml:
        assert (await ml.delete(f"/v1/models/ml/{name}/grants/vision")).status_code == 200
    async with app_as(pool, store, VISION) as vision:
        assert f"ml/{name}" not in await granted_names(vision)


async def test_registering_answers_the_version_as_get_does_with_its_cost(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"costed-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [5], team="vision", name=name)
    async with app_as(pool, store, VISION) as vision:
        made = await register(vision, "vision", name, job)
        assert made.status_code == 201, made.text
        shown = await body(await vision.get(f"/v1/models/vision/{name}/versions/1"))
    answer = made.json()
    assert answer == shown
    assert answer["cost"]["jobs"][0]["job_id"] == job.id
    assert answer["cost"]["jobs"][0]["relation"] == "own"


async def test_a_grantee_reads_the_model_not_the_work_behind_it(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """Every registry answer a grantee reads shows the model (or dataset) it was granted and
    nothing of the owner's job: no job or allocation id, spec, people, hosts or checkpoints,
    in the version answers and in the lineage graph alike. The owner and operators still see
    all of it."""
    tag = uuid.uuid4().hex[:6]
    name, data = f"shared-{tag}", f"feat-{tag}"
    job = await run_job(pool, store, name, team="ml")
    model = f"/v1/models/ml/{name}"
    async with app_as(pool, store, ML) as ml:
        assert (await ml.put(f"{model}/grants/vision")).status_code == 200
        assert (await ml.put(f"{model}/aliases/prod", json={"version": 1})).status_code == 200
        made = await add(ml, "ml", data, producing_job_id=job)
        assert made.status_code == 201, made.text
        assert (await ml.put(f"/v1/datasets/ml/{data}/grants/vision")).status_code == 200
        owner = await body(await ml.get(f"{model}/versions/1"))
    # What the owner sees of its work, none of which a grantee may.
    lineage = owner["lineage"]
    secrets = {
        job,
        owner["allocation_id"],
        owner["source_uri"],
        owner["artifact"]["manifest_uri"],
        lineage["environment"]["hostname"],
        lineage["environment"]["node_id"],
        f'"{lineage["spec"]["user"]}"',
        '"ml/bob"',  # ml's admin: moved the alias, added the dataset version
    }
    assert all(secrets) and owner["job_id"] == job and lineage["spec"]["team"] == "ml"
    routes = [
        model,
        f"{model}/versions",
        f"{model}/versions/1",
        f"{model}/versions/by-alias/prod",
        f"{model}/versions/1/download",
        f"{model}/aliases",
        f"{model}/aliases/prod/moves",
        "/v1/datasets",
        f"/v1/datasets/ml/{data}",
        f"/v1/datasets/ml/{data}/versions/1",
        f"/v1/lineage/models/ml/{name}/versions/1/upstream",
        f"/v1/lineage/models/ml/{name}/versions/1/upstream?format=openlineage",
        f"/v1/lineage/datasets/ml/{data}/versions/1/downstream",
        f"/v1/lineage/datasets/ml/{data}/versions/1/downstream?format=openlineage",
    ]
    async with app_as(pool, store, VISION) as vision:
        for route in routes:
            answer = await vision.get(route)
            assert answer.status_code == 200, (route, answer.text)
            leaked = sorted(s for s in secrets if s in answer.text)
            assert leaked == [], (route, leaked)
        shown = await body(await vision.get(f"{model}/versions/1"))
        moves = await body(await vision.get(f"{model}/aliases/prod/moves"))
        listed = await body(await vision.get(f"{model}/versions"))
    # The model itself stays: what it is, how to check it, how it scores, what it cost.
    assert (shown["team"], shown["model"], shown["version"]) == ("ml", name, 1)
    assert shown["artifact"]["sha256"] == owner["artifact"]["sha256"]
    assert shown["artifact"]["size_bytes"] == owner["artifact"]["size_bytes"]
    assert shown["artifact"]["uri"] == owner["artifact"]["uri"]  # the registry's own copy
    assert shown["metrics"] == owner["metrics"] and shown["aliases"] == ["prod"]
    assert shown["cost"]["hidden_jobs"] == 1
    assert shown["lineage"] is None and shown["job_id"] is None
    assert listed["versions"][0]["artifact"]["sha256"] == owner["artifact"]["sha256"]
    assert [(m["from_version"], m["to_version"], m["actor"]) for m in moves["moves"]] == [
        (None, 1, None)
    ]
    # The owner and operators still see everything.
    async with app_as(pool, store, OPERATOR) as operator:
        everything = await body(await operator.get(f"{model}/versions/1"))
        seen = await body(await operator.get(f"/v1/datasets/ml/{data}/versions/1"))
    assert {k: v for k, v in everything.items() if k != "cost"} == {
        k: v for k, v in owner.items() if k != "cost"
    }
    assert seen["producing_job_id"] == job and seen["created_by"] == "ml/bob"
    async with app_as(pool, store, ML) as ml:
        moved = await body(await ml.get(f"{model}/aliases/prod/moves"))
        graph = await body(await ml.get(f"/v1/lineage/models/ml/{name}/versions/1/upstream"))
    assert moved["moves"][0]["actor"] == "ml/bob"
    root = next(n for n in graph["nodes"] if n["id"] == graph["root"])
    assert root["job_id"] == job and f"job:{job}" in ids(graph)


async def test_a_grantee_never_reads_the_checkpoint_behind_a_version_without_a_copy(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A version registered before the registry kept its own copies has the owner's job
    checkpoint as its artifact: a grantee sees neither its URI (null) nor, when it asks to
    download it, the URI in the refusal (409). The owner is told where the checkpoint is."""
    name = f"legacy-{uuid.uuid4().hex[:6]}"
    job = await run_job(pool, store, name, team="ml")
    model = f"/v1/models/ml/{name}"
    async with pool.acquire() as conn, conn.transaction():
        # As a version of before migration 0004 was stored: versions are immutable (0013),
        # so the test's own database lets this one change through.
        await conn.execute("ALTER TABLE model_versions DISABLE TRIGGER model_versions_immutable")
        await conn.execute(
            """UPDATE model_versions SET artifact_key = NULL, artifact_uri = source_uri
               WHERE job_id = $1""",
            job,
        )
        await conn.execute("ALTER TABLE model_versions ENABLE TRIGGER model_versions_immutable")
    async with app_as(pool, store, ML) as ml:
        assert (await ml.put(f"{model}/grants/vision")).status_code == 200
        owner = await body(await ml.get(f"{model}/versions/1"))
        refused_owner = await ml.get(f"{model}/versions/1/download")
    assert owner["owned"] is False and job in owner["artifact"]["uri"]
    assert refused_owner.status_code == 409 and owner["artifact"]["uri"] in refused_owner.text
    async with app_as(pool, store, VISION) as vision:
        shown = await body(await vision.get(f"{model}/versions/1"))
        listed = await body(await vision.get(f"{model}/versions"))
        refused = await vision.get(f"{model}/versions/1/download")
        refused_content = await vision.get(f"{model}/versions/1/content")
    assert shown["artifact"]["uri"] is None and listed["versions"][0]["artifact"]["uri"] is None
    assert shown["artifact"]["sha256"] == owner["artifact"]["sha256"]
    for answer in (refused, refused_content):
        assert answer.status_code == 409, answer.text
        assert job not in answer.text and "register" in answer.json()["detail"]


async def test_a_grantee_never_reads_nor_probes_the_owner_project(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """The project of a model is that of the owner's job (its spec): the owner's work. No
    answer a grantee reads names it — the model, its listings, versions, aliases, lineage,
    cost — and filtering a listing of granted models by project matches nothing, so the
    project cannot be found by trying names either. The owner and operators see it."""
    tag = uuid.uuid4().hex[:6]
    name, project = f"proj-{tag}", f"secret-{tag}"
    await run_job(pool, store, name, team="ml", project=project)
    model = f"/v1/models/ml/{name}"
    async with app_as(pool, store, ML) as ml:
        assert (await ml.put(f"{model}/grants/vision")).status_code == 200
        assert (await ml.put(f"{model}/aliases/prod", json={"version": 1})).status_code == 200
        assert (await body(await ml.get(model)))["project"] == project
        mine = await body(await ml.get("/v1/models", params={"project": project}))
        assert [m["name"] for m in mine["models"]] == [name]
    routes = [
        model,
        "/v1/models?granted=true",
        "/v1/models?granted=true&team=ml",
        "/v1/models?team=ml",
        f"{model}/versions",
        f"{model}/versions/1",
        f"{model}/versions/by-alias/prod",
        f"{model}/aliases",
        f"{model}/aliases/prod/moves",
        f"/v1/lineage/models/ml/{name}/versions/1/upstream",
        f"/v1/lineage/models/ml/{name}/versions/1/upstream?format=openlineage",
    ]
    async with app_as(pool, store, VISION) as vision:
        for route in routes:
            answer = await vision.get(route)
            assert answer.status_code == 200, (route, answer.text)
            assert project not in answer.text, route
        shown = await body(await vision.get(model))
        assert shown["project"] is None and shown["name"] == name
        assert f"ml/{name}" in await granted_names(vision)
        for params in ({"granted": "true"}, {"granted": "true", "team": "ml"}, {"team": "ml"}):
            right = await body(
                await vision.get("/v1/models", params={**params, "project": project})
            )
            wrong = await body(await vision.get("/v1/models", params={**params, "project": "nope"}))
            assert right == wrong == {"models": [], "next": None}, params
    async with app_as(pool, store, OPERATOR) as operator:
        assert (await body(await operator.get(model)))["project"] == project
        listed = await body(await operator.get("/v1/models", params={"team": "ml"}))
        assert {m["name"]: m["project"] for m in listed["models"]}.get(name) == project
