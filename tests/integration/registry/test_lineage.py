"""Lineage on a real PostgreSQL and S3 endpoint, through the registry's own handlers: a
fine-tuned model's upstream reaches back to its datasets (and names the checkpoint a restart
really resumed from), a dataset's downstream finds every model made from it, another team
sees neither without a grant, and both export as OpenLineage run events."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.registry.modelkit import ML, OPERATOR, VISION, app_as, apply
from tests.integration.registry.test_datasets import add
from tests.integration.registry.test_registry import T0, ref, spec, started, succeeded
from trainyard_platform.shared.events.payloads import JobCancelled, JobSubmitted
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


async def run_job(
    pool: asyncpg.Pool, store: ObjectStore, name: str, *, restart: bool = False, **fields: Any
) -> str:
    """A job of team vision that starts (and, with ``restart``, starts again from its first
    checkpoint), commits a checkpoint and succeeds, asking for a model version."""
    job = str(uuid.uuid4())
    job_spec = spec(name).model_copy(update=fields)
    await apply(pool, store, job, started(job, f"a1-{job}", 0, job_spec))
    final = f"a1-{job}"
    if restart:
        first = ref(store, job, 5)
        final = f"a2-{job}"
        await apply(pool, store, job, started(job, final, 1, job_spec, resumed_from=first.uri))
    epoch = 2 if restart else 1
    await apply(pool, store, job, succeeded(job, final, ref(store, job, 10), epoch=epoch))
    return job


def ids(graph: dict[str, Any]) -> set[str]:
    return {n["id"] for n in graph["nodes"]}


async def get(client: httpx.AsyncClient, path: str) -> dict[str, Any]:
    answer = await client.get(path)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_upstream_of_a_fine_tuned_model_reaches_its_datasets_and_downstream_finds_it(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    raw, features, base, tuned = f"raw-{tag}", f"feat-{tag}", f"base-{tag}", f"tuned-{tag}"
    async with app_as(pool, store, ML) as ml:
        assert (await add(ml, "ml", features)).status_code == 201
        await ml.put(f"/v1/datasets/ml/{features}/grants/vision")
    async with app_as(pool, store, VISION) as vision:
        assert (await add(vision, "vision", raw)).status_code == 201
    base_job = await run_job(pool, store, base, datasets=[f"vision/{raw}:1", f"ml/{features}:1"])
    async with app_as(pool, store, VISION) as vision:
        moved = await vision.put(
            f"/v1/models/vision/{base}/aliases/production", json={"version": 1}
        )
        assert moved.status_code == 200, moved.text
    tuned_job = await run_job(
        pool, store, tuned, restart=True, parent_model=f"vision/{base}@production"
    )

    async with app_as(pool, store, VISION) as vision:
        up = await get(vision, f"/v1/lineage/models/vision/{tuned}/versions/1/upstream")
        down = await get(vision, f"/v1/lineage/datasets/vision/{raw}/versions/1/downstream")
        events = (
            await get(
                vision,
                f"/v1/lineage/models/vision/{tuned}/versions/1/upstream?format=openlineage",
            )
        )["events"]

    resumed = ref(store, tuned_job, 5).uri
    assert {
        f"dataset_version:vision/{raw}:1",
        f"dataset_version:ml/{features}:1",
        f"job:{base_job}",
        f"checkpoint:{ref(store, base_job, 10).uri}",
        f"model_version:vision/{base}:1",
        f"job:{tuned_job}",
        f"checkpoint:{resumed}",
        f"checkpoint:{ref(store, tuned_job, 10).uri}",
        f"model_version:vision/{tuned}:1",
    } == ids(up)
    edges = {(e["from"], e["to"], e["relation"]) for e in up["edges"]}
    assert (f"model_version:vision/{base}:1", f"job:{tuned_job}", "fine_tuned_by") in edges
    assert (f"checkpoint:{resumed}", f"job:{tuned_job}", "resumed_by") in edges
    assert (f"dataset_version:ml/{features}:1", f"job:{base_job}", "read_by") in edges
    assert up["hidden"] == 0 and up["truncated"] is False

    models = {n["id"] for n in down["nodes"] if n["kind"] == "model_version"}
    assert models == {f"model_version:vision/{base}:1", f"model_version:vision/{tuned}:1"}

    by_run = {e["run"]["runId"]: e for e in events}
    assert set(by_run) == {base_job, tuned_job}
    tuned_event = by_run[tuned_job]
    assert tuned_event["eventType"] == "COMPLETE"  # tracking saw it succeed
    assert tuned_event["job"] == {
        "namespace": "trainyard.vision",
        "name": f"default.{tuned}",
        "facets": {},
    }
    inputs = {(i["namespace"], i["name"]) for i in tuned_event["inputs"]}
    assert ("trainyard.models", f"vision/{base}") in inputs
    assert ("trainyard.checkpoints", resumed) in inputs
    outputs = {(o["namespace"], o["name"]) for o in tuned_event["outputs"]}
    assert ("trainyard.models", f"vision/{tuned}") in outputs
    base_inputs = {(i["namespace"], i["name"]) for i in by_run[base_job]["inputs"]}
    assert base_inputs == {
        ("trainyard.datasets", f"vision/{raw}"),
        ("trainyard.datasets", f"ml/{features}"),
    }
    for event in events:
        assert set(event) >= {"eventType", "eventTime", "run", "job", "inputs", "outputs"}
        assert event["producer"] and event["schemaURL"].endswith("#/$defs/RunEvent")

    # The owner of the granted features sees that vision made models from them, not which.
    async with app_as(pool, store, ML) as ml:
        theirs = await get(ml, f"/v1/lineage/datasets/ml/{features}/versions/1/downstream")
        assert ids(theirs) == {f"dataset_version:ml/{features}:1"} and theirs["hidden"] > 0
        hidden = await ml.get(f"/v1/lineage/models/vision/{tuned}/versions/1/upstream")
        assert hidden.status_code == 404
        secret = await ml.get(f"/v1/lineage/datasets/vision/{raw}/versions/1/downstream")
        assert secret.status_code == 404
    async with app_as(pool, store, OPERATOR) as operator:
        everything = await get(
            operator, f"/v1/lineage/datasets/ml/{features}/versions/1/downstream"
        )
        assert f"model_version:vision/{tuned}:1" in ids(everything)


async def test_a_job_is_given_nothing_another_team_did_not_grant(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    async with app_as(pool, store, ML) as ml:
        await add(ml, "ml", f"private-{tag}")
    job = await run_job(pool, store, f"sneaky-{tag}", datasets=[f"ml/private-{tag}:1"])
    async with app_as(pool, store, VISION) as vision:
        up = await get(vision, f"/v1/lineage/models/vision/sneaky-{tag}/versions/1/upstream")
    assert {n["kind"] for n in up["nodes"]} == {"job", "checkpoint", "model_version"}
    assert f"job:{job}" in ids(up)
    async with app_as(pool, store, ML) as ml:
        down = await get(ml, f"/v1/lineage/datasets/ml/private-{tag}/versions/1/downstream")
    assert ids(down) == {f"dataset_version:ml/private-{tag}:1"} and down["hidden"] == 0


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/lineage/models/%2E%2E/m/versions/1/upstream", "team"),
        ("/v1/lineage/models/v/a%00b/versions/1/upstream", "name"),
        ("/v1/lineage/datasets/v/" + "x" * 300 + "/versions/1/downstream", "name"),
        ("/v1/lineage/datasets/.hidden/d/versions/1/downstream", "team"),
        ("/v1/lineage/datasets/v/d/versions/1/downstream?format=dot", "format"),
    ],
)
async def test_bad_names_of_lineage_routes_are_refused_naming_the_field(
    pool: asyncpg.Pool, store: ObjectStore, path: str, field: str
) -> None:
    async with app_as(pool, store, OPERATOR) as operator:
        answer = await operator.get(path)
    assert answer.status_code in (400, 422), answer.text
    assert field in answer.text


async def test_a_parent_version_is_kept_while_a_live_version_was_fine_tuned_from_it(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    base, tuned = f"base-{tag}", f"tuned-{tag}"
    await run_job(pool, store, base)
    running = str(uuid.uuid4())
    job_spec = spec(f"still-{tag}").model_copy(update={"parent_model": f"vision/{base}:1"})
    await apply(pool, store, running, started(running, f"a-{running}", 0, job_spec))
    async with app_as(pool, store, VISION) as vision:
        refused = await vision.delete(f"/v1/models/vision/{base}/versions/1")
        assert refused.status_code == 409 and f"running job {running}" in refused.text
    await apply(pool, store, running, succeeded(running, f"a-{running}", ref(store, running, 2)))
    async with app_as(pool, store, VISION) as vision:
        made = f"/v1/models/vision/still-{tag}/versions/1"
        assert (await vision.delete(f"/v1/models/vision/{base}/versions/1")).status_code == 409
        assert (await vision.delete(made)).status_code == 200  # ended, and its version gone
    await run_job(pool, store, tuned, parent_model=f"vision/{base}:1")
    async with app_as(pool, store, VISION) as vision:
        refused = await vision.delete(f"/v1/models/vision/{base}/versions/1")
        assert refused.status_code == 409 and f"vision/{tuned} v1" in refused.text
        assert (
            await vision.get(f"/v1/models/vision/{base}/versions/1/download")
        ).status_code == 200
        assert (await vision.delete(f"/v1/models/vision/{tuned}/versions/1")).status_code == 200
        freed = await vision.delete(f"/v1/models/vision/{base}/versions/1")
        assert freed.status_code == 200 and freed.json()["objects"] == 1
        # The tombstone stays in the lineage of what was made from it.
        up = await get(vision, f"/v1/lineage/models/vision/{tuned}/versions/1/upstream")
    deleted = {n["id"]: n["deleted"] for n in up["nodes"] if n["kind"] == "model_version"}
    assert deleted == {
        f"model_version:vision/{base}:1": True,
        f"model_version:vision/{tuned}:1": True,
    }


async def test_a_job_the_registry_has_not_seen_start_is_not_a_lineage_node(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """The registry records a job's parent from its ``job.submitted`` (so the parent is kept
    while it waits), before it knows anything else of the job. Lineage shows a job once the
    registry saw it start: before, a job admitted and still waiting, or cancelled before it
    started, was a child node with no team and no name, hidden from its own team as
    another's, and an OpenLineage event with no ``eventTime`` and namespace ``trainyard.``
    (the RunEvent schema requires a date-time)."""
    tag = uuid.uuid4().hex[:6]
    raw, base = f"raw-{tag}", f"base-{tag}"
    async with app_as(pool, store, VISION) as vision:
        assert (await add(vision, "vision", raw)).status_code == 201
    base_job = await run_job(pool, store, base, datasets=[f"vision/{raw}:1"])
    tuned = spec(f"tuned-{tag}").model_copy(update={"parent_model": f"vision/{base}:1"})
    waiting, cancelled = str(uuid.uuid4()), str(uuid.uuid4())
    for job in (waiting, cancelled):
        await apply(pool, store, job, JobSubmitted(job_id=job, spec=tuned, submitted_at=T0))
    await apply(pool, store, cancelled, JobCancelled(job_id=cancelled, reason="by alice"))

    path = f"/v1/lineage/datasets/vision/{raw}/versions/1/downstream"
    for caller in (VISION, OPERATOR):
        async with app_as(pool, store, caller) as client:
            down = await get(client, path)
            events = (await get(client, f"{path}?format=openlineage"))["events"]
        jobs = [n for n in down["nodes"] if n["kind"] == "job"]
        assert [n["job_id"] for n in jobs] == [base_job], caller
        assert down["hidden"] == 0
        assert [e["run"]["runId"] for e in events] == [base_job]
        assert all(e["eventTime"] and e["job"]["namespace"] == "trainyard.vision" for e in events)

    # Once it starts, it is its team's child of the version, as ever.
    allocation = f"a-{waiting}"
    await apply(pool, store, waiting, started(waiting, allocation, 0, tuned))
    async with app_as(pool, store, VISION) as vision:
        down = await get(vision, path)
    edges = {(e["from"], e["to"], e["relation"]) for e in down["edges"]}
    assert (f"model_version:vision/{base}:1", f"job:{waiting}", "fine_tuned_by") in edges
    assert down["hidden"] == 0
