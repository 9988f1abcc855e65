"""Deleting a whole model, against real PostgreSQL and a real S3 endpoint: refused while it
has live versions, conditional on the model's ETag, its name freed for a new model, the same
404 as a model that never existed to everyone after, and the lineage of jobs made from it
still readable. (Before, a model could not be deleted: its name stayed taken for good.)"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from tests.integration.registry.modelkit import (
    ML,
    VISION,
    VISION_ADMIN,
    app_as,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_datasets import add
from tests.integration.registry.test_lineage import get, run_job
from trainyard_platform.services.registry import models
from trainyard_platform.services.registry.collector import StorageCollector
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


async def test_a_model_without_live_versions_is_deleted_and_its_name_freed(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"digts-{uuid.uuid4().hex[:6]}"  # mistyped
    job = await job_with_checkpoints(pool, store, [1, 2])
    async with app_as(pool, store, VISION_ADMIN) as client:
        for checkpoint in job.checkpoints:
            made = await register(client, "vision", name, job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201, made.text
        await client.put(f"/v1/models/vision/{name}/aliases/production", json={"version": 2})
        await client.put(f"/v1/models/vision/{name}/grants/ml")

        refused = await client.delete(f"/v1/models/vision/{name}")
        assert refused.status_code == 409, refused.text
        assert refused.json()["detail"] == (
            f"model vision/{name} has 2 live versions (1, 2): delete them first "
            f"(trainyard model rm vision/{name} VERSION), then the model"
        )
        read = await client.get(f"/v1/models/vision/{name}")
        stale = read.headers["ETag"]
        assert (await client.delete(f"/v1/models/vision/{name}/aliases/production")).is_success
        for version in (1, 2):
            gone = await client.delete(f"/v1/models/vision/{name}/versions/{version}")
            assert gone.status_code == 200, gone.text
        # A tag read before the versions went is not the model now: nothing deleted.
        changed = await client.delete(f"/v1/models/vision/{name}", headers={"If-Match": stale})
        assert changed.status_code == 412, changed.text
        assert changed.json()["errors"][0]["field"] == "If-Match"
        fresh = (await client.get(f"/v1/models/vision/{name}")).headers["ETag"]
        assert fresh != stale

        deleted = await client.delete(f"/v1/models/vision/{name}", headers={"If-Match": fresh})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"team": "vision", "model": name, "tombstones": 2}
        for path in ("", "/versions", "/versions/1", "/aliases"):
            assert (await client.get(f"/v1/models/vision/{name}{path}")).status_code == 404
        gone = (await client.get(f"/v1/models/vision/{name}")).json()["detail"]
        assert gone.startswith(f"no model {name!r} in team 'vision'")  # as one never made
        assert (await client.delete(f"/v1/models/vision/{name}")).status_code == 404
        listed = (await client.get("/v1/models?limit=500")).json()["models"]
        assert name not in {m["name"] for m in listed}

        # The name is free: a new model of it starts again at version 1, with no alias.
        again = await register(client, "vision", name, job)
        assert again.status_code == 201, again.text
        assert again.json()["version"] == 1
        model = (await client.get(f"/v1/models/vision/{name}")).json()
        assert (model["versions"], model["aliases"], model["grants"]) == (1, {}, [])

    async with pool.acquire() as conn:
        audited = await conn.fetchval(
            "SELECT count(*) FROM audit_log WHERE action = 'delete model' AND target = $1",
            f"vision/{name}",
        )
        moves = await conn.fetch(
            "SELECT to_version FROM model_alias_moves mv JOIN models m ON m.id = mv.model_id "
            "WHERE m.team = 'vision' AND m.name = $1 ORDER BY mv.id",
            name,
        )
    assert audited == 1
    assert [m["to_version"] for m in moves] == [2, None]  # the old model's history stays


async def test_another_team_gets_the_404_of_a_model_that_does_not_exist(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await register(client, "vision", name, job)).status_code == 201
        await client.put(f"/v1/models/vision/{name}/grants/ml")
    async with app_as(pool, store, ML) as ml:
        assert (await ml.get(f"/v1/models/vision/{name}")).status_code == 200
        # A grant lets ml read the model, not delete it: the words of any other team's write.
        refused = await ml.delete(f"/v1/models/vision/{name}")
        absent = await ml.delete("/v1/models/vision/no-such-model")
        assert refused.status_code == absent.status_code == 404
        assert refused.json()["detail"].replace(name, "X") == absent.json()["detail"].replace(
            "no-such-model", "X"
        )
    async with app_as(pool, store, VISION) as client:
        assert (await client.delete(f"/v1/models/vision/{name}/versions/1")).status_code == 200
        assert (await client.delete(f"/v1/models/vision/{name}")).status_code == 200
    async with app_as(pool, store, ML) as ml:
        for path in (f"vision/{name}", "vision/no-such-model"):
            assert (await ml.get(f"/v1/models/{path}")).status_code == 404
        granted = (await ml.get("/v1/models?granted=true")).json()["models"]
        assert name not in {m["name"] for m in granted}


async def test_the_lineage_of_a_job_made_from_a_deleted_model_stays_readable(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    base, tuned = f"base-{tag}", f"tuned-{tag}"
    await run_job(pool, store, base)
    await run_job(pool, store, tuned, parent_model=f"vision/{base}:1")
    async with app_as(pool, store, VISION) as vision:
        for path in (f"{tuned}/versions/1", f"{base}/versions/1", base):
            gone = await vision.delete(f"/v1/models/vision/{path}")
            assert gone.status_code == 200, gone.text
        up = await get(vision, f"/v1/lineage/models/vision/{tuned}/versions/1/upstream")
    deleted = {n["id"]: n["deleted"] for n in up["nodes"] if n["kind"] == "model_version"}
    async with pool.acquire() as conn:
        made = {
            r["name"]: r["id"]
            for r in await conn.fetch(
                "SELECT m.name, v.id FROM model_versions v JOIN models m ON m.id = v.model_id "
                "WHERE m.team = 'vision' AND m.name = ANY($1::text[])",
                [base, tuned],
            )
        }
    # The tuned model is not deleted (only its version): its id is as ever. The base model
    # is: its version's id names the version, as the name may name another model now.
    assert deleted == {
        f"model_version:vision/{base}:1#{made[base]}": True,
        f"model_version:vision/{tuned}:1": True,
    }


async def test_a_model_made_again_under_a_deleted_one_s_name_is_another_lineage_node(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A deleted model's versions and those of the model made again under its name are
    different versions: a lineage graph holding both (here, the downstream of a dataset each
    was trained on) shows each as a node of its own. Before, both had the id
    ``model_version:vision/NAME:1``: the graph kept the first and hung the second's edges on
    it, so the new version read as deleted (or the old one as live)."""
    tag = uuid.uuid4().hex[:6]
    raw, base = f"raw-{tag}", f"base-{tag}"
    async with app_as(pool, store, VISION) as vision:
        assert (await add(vision, "vision", raw)).status_code == 201
    await run_job(pool, store, base, datasets=[f"vision/{raw}:1"])
    async with app_as(pool, store, VISION) as vision:
        for path in (f"{base}/versions/1", base):
            gone = await vision.delete(f"/v1/models/vision/{path}")
            assert gone.status_code == 200, gone.text
    await run_job(pool, store, base, datasets=[f"vision/{raw}:1"])
    async with app_as(pool, store, VISION) as vision:
        down = await get(vision, f"/v1/lineage/datasets/vision/{raw}/versions/1/downstream")
        up = await get(vision, f"/v1/lineage/models/vision/{base}/versions/1/upstream")
    versions = [n for n in down["nodes"] if n["kind"] == "model_version"]
    assert sorted(n["deleted"] for n in versions) == [False, True]
    assert len({n["id"] for n in versions}) == 2
    (live,) = [n for n in versions if not n["deleted"]]
    assert live["id"] == f"model_version:vision/{base}:1"  # a live model's ids are as before
    # Each version's node is reached from its own checkpoint only.
    into = {e["to"]: e["from"] for e in down["edges"] if e["relation"] == "registered_as"}
    assert len({into[n["id"]] for n in versions}) == 2
    assert [n["deleted"] for n in up["nodes"] if n["kind"] == "model_version"] == [False]

    # A grant of the model made again opens it, not the deleted model's version.
    async with app_as(pool, store, VISION_ADMIN) as vision:
        assert (await vision.put(f"/v1/datasets/vision/{raw}/grants/ml")).is_success
        assert (await vision.put(f"/v1/models/vision/{base}/grants/ml")).is_success
    async with app_as(pool, store, ML) as ml:
        theirs = await get(ml, f"/v1/lineage/datasets/vision/{raw}/versions/1/downstream")
    assert [n["id"] for n in theirs["nodes"] if n["kind"] == "model_version"] == [live["id"]]


async def test_a_deletion_whose_objects_cannot_be_freed_now_still_answers_that_it_is_done(
    pool: asyncpg.Pool, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The objects of a deleted version are freed after the deletion commits; the store
    failing then leaves them to the storage collector. The deletion is done: the answer says
    so, with nothing freed (and the model's deletion after it asks the store nothing).
    Before, the store's error reached the caller as a 500 for a deletion that had committed,
    and a retry got 404."""
    name = f"flaky-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1])

    def store_down(store: ObjectStore, version: object) -> models.Freed:
        raise OSError("connection reset by the object store")

    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await register(client, "vision", name, job)).status_code == 201
        monkeypatch.setattr(models, "free_objects", store_down)
        gone = await client.delete(f"/v1/models/vision/{name}/versions/1")
        assert gone.status_code == 200, gone.text
        assert (gone.json()["objects"], gone.json()["bytes"]) == (0, 0)
        deleted = await client.delete(f"/v1/models/vision/{name}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["tombstones"] == 1
        assert (await client.get(f"/v1/models/vision/{name}")).status_code == 404


async def test_a_model_s_etag_covers_its_grants(pool: asyncpg.Pool, store: ObjectStore) -> None:
    """A model's deletion removes its grants: a conditional delete (``If-Match``) whose ETag
    was read before another admin granted the model, or revoked a grant, is refused (412),
    nothing changed. Before, the ETag ignored grants and the delete removed the new grant."""
    name = f"granted-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await register(client, "vision", name, job)).status_code == 201
        assert (await client.delete(f"/v1/models/vision/{name}/versions/1")).status_code == 200
        before_grant = (await client.get(f"/v1/models/vision/{name}")).headers["ETag"]
        assert (await client.put(f"/v1/models/vision/{name}/grants/ml")).is_success
        granted = (await client.get(f"/v1/models/vision/{name}")).headers["ETag"]
        assert (await client.put(f"/v1/models/vision/{name}/grants/audio")).is_success
        for stale in (before_grant, granted):
            refused = await client.delete(f"/v1/models/vision/{name}", headers={"If-Match": stale})
            assert refused.status_code == 412, refused.text
        model = (await client.get(f"/v1/models/vision/{name}")).json()
        assert model["grants"] == ["audio", "ml"]  # nothing changed
        assert (await client.delete(f"/v1/models/vision/{name}/grants/audio")).is_success
        after_revoke = (await client.get(f"/v1/models/vision/{name}")).headers["ETag"]
        assert after_revoke == granted  # the same model, with the same grant, as then
        gone = await client.delete(f"/v1/models/vision/{name}", headers={"If-Match": granted})
        assert gone.status_code == 200, gone.text


async def test_an_alias_s_etag_is_not_that_of_a_model_made_again_under_its_name(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """An alias's ETag names the model it is of: read from a model since deleted, it does
    not match the alias of the same name and version of the model made again under its
    name (412, nothing changed). Before, the ETag was of the version number only, so a
    stale ``If-Match`` moved or deleted the new model's alias."""
    name = f"again-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1, 2])
    path = f"/v1/models/vision/{name}"
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", name, job)).status_code == 201
        assert (await client.put(f"{path}/aliases/prod", json={"version": 1})).is_success
        old = (await client.get(f"{path}/aliases/prod")).headers["ETag"]
        assert (await client.delete(f"{path}/aliases/prod")).is_success
        assert (await client.delete(f"{path}/versions/1")).status_code == 200
        assert (await client.delete(path)).status_code == 200
        made = await register(client, "vision", name, job, checkpoint_uri=job.checkpoints[1].uri)
        assert made.status_code == 201, made.text
        assert (await client.put(f"{path}/aliases/prod", json={"version": 1})).is_success
        new = (await client.get(f"{path}/aliases/prod")).headers["ETag"]
        assert new != old
        for write in (
            client.put(f"{path}/aliases/prod", json={"version": 1}, headers={"If-Match": old}),
            client.delete(f"{path}/aliases/prod", headers={"If-Match": old}),
        ):
            refused = await write
            assert refused.status_code == 412, refused.text
        assert (await client.get(f"{path}/aliases/prod")).headers["ETag"] == new
        moved = await client.put(
            f"{path}/aliases/prod", json={"version": 1}, headers={"If-Match": new}
        )
        assert moved.status_code == 200, moved.text
        assert moved.headers["ETag"] == new


async def test_a_job_s_record_names_its_parent_s_weights_not_only_its_name(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A job's reproducibility record holds the parent the registry recorded for it, with
    the sha256 of its weights: after its model is deleted and made again under its name,
    ``vision/NAME:1`` in a spec names other weights, and a reproduction fine-tuned from
    them is told apart (``data.parent_model``)."""
    tag = uuid.uuid4().hex[:6]
    base = f"base-{tag}"
    await run_job(pool, store, base)
    tuned_job = await run_job(pool, store, f"tuned-{tag}", parent_model=f"vision/{base}:1")
    async with app_as(pool, store, VISION) as vision:
        parent = await get(vision, f"/v1/models/vision/{base}/versions/1")
        record = await get(vision, f"/v1/jobs/{tuned_job}/record")
    assert record["record"]["data"]["parent_model"] == {
        "reference": f"vision/{base}:1",
        "sha256": parent["artifact"]["sha256"],
    }


async def test_a_grantee_s_etag_of_a_model_tells_nothing_of_its_other_grants(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """The grants of a model are its owner's (null to a grantee), and its ETag now covers
    them: the ETag a grantee reads is of what it is shown, so it neither changes with, nor
    can be searched for (an unkeyed hash of few team names), the other teams granted."""
    name = f"secret-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await register(client, "vision", name, job)).status_code == 201
        assert (await client.put(f"/v1/models/vision/{name}/grants/ml")).is_success
    async with app_as(pool, store, ML) as ml:
        before = await ml.get(f"/v1/models/vision/{name}")
        assert before.json()["grants"] is None
    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await client.put(f"/v1/models/vision/{name}/grants/audio")).is_success
    async with app_as(pool, store, ML) as ml:
        after = await ml.get(f"/v1/models/vision/{name}")
    assert after.json() == before.json()
    assert after.headers["ETag"] == before.headers["ETag"]


async def test_a_cursor_of_a_deleted_model_is_refused_by_the_one_made_again_under_its_name(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A cursor pages the model it was given for, not whatever model has its name now: the
    ``next`` of a deleted model's versions, aliases or an alias's moves, given to the model
    made again under its name, is a 422 on ``after`` saying it is another list's. Before,
    the cursors were of ``team/name``: the old model's position paged the new model's
    versions, mixing two models in one listing."""
    name = f"paged-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1, 2])
    path = f"/v1/models/vision/{name}"

    async def made() -> None:
        for checkpoint in job.checkpoints:
            added = await register(client, "vision", name, job, checkpoint_uri=checkpoint.uri)
            assert added.status_code == 201, added.text
        for alias, version in (("prod", 1), ("prod", 2), ("staging", 1)):
            moved = await client.put(f"{path}/aliases/{alias}", json={"version": version})
            assert moved.status_code == 200, moved.text

    async def next_of(listing: str) -> str:
        page = await client.get(f"{path}{listing}", params={"limit": 1})
        assert page.status_code == 200, page.text
        following: str = page.json()["next"]
        assert following
        return following

    listings = {
        "/versions": "GET /v1/models/{team}/{name}/versions",
        "/aliases": "GET /v1/models/{team}/{name}/aliases",
        "/aliases/prod/moves": "GET .../aliases/{alias}/moves",
    }
    async with app_as(pool, store, VISION) as client:
        await made()
        old = {listing: await next_of(listing) for listing in listings}
        for alias in ("prod", "staging"):
            assert (await client.delete(f"{path}/aliases/{alias}")).is_success
        for version in (1, 2):
            assert (await client.delete(f"{path}/versions/{version}")).status_code == 200
        assert (await client.delete(path)).status_code == 200
        await made()
        for listing, route in listings.items():
            refused = await client.get(f"{path}{listing}", params={"after": old[listing]})
            assert refused.status_code == 422, (listing, refused.text)
            assert refused.json()["errors"] == [
                {"field": "after", "message": f"a cursor of another list, not of {route}"}
            ], (listing, refused.text)
            # The new model's own cursors page it as ever.
            following = await client.get(
                f"{path}{listing}", params={"limit": 1, "after": await next_of(listing)}
            )
            assert following.status_code == 200, following.text


async def test_the_audit_log_names_which_model_and_version_a_write_was_of(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A model deleted and made again under its name is another model: each audit entry of
    a model's writes names its id (and a version's, the version's id) besides the names
    people read. Before, ``delete model`` named ``team/name`` only, so after a re-create the
    log could not tell which model had been deleted, nor which ``v1`` a version entry was."""
    name = f"audited-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1])
    path = f"/v1/models/vision/{name}"
    lives = []
    async with app_as(pool, store, VISION_ADMIN) as client:
        for _ in range(2):
            added = await register(client, "vision", name, job)
            assert added.status_code == 201, added.text
            assert (await client.put(f"{path}/aliases/prod", json={"version": 1})).is_success
            assert (await client.put(f"{path}/grants/ml")).is_success
            async with pool.acquire() as conn:
                model_id = await conn.fetchval(
                    "SELECT id FROM models WHERE team = 'vision' AND name = $1 "
                    "AND deleted_at IS NULL",
                    name,
                )
            lives.append((model_id, added.json()["id"]))
            assert (await client.delete(f"{path}/grants/ml")).is_success
            assert (await client.delete(f"{path}/aliases/prod")).is_success
            assert (await client.delete(f"{path}/versions/1")).status_code == 200
            assert (await client.delete(path)).status_code == 200
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT action, target, detail FROM audit_log WHERE target LIKE $1 ORDER BY id",
            f"vision/{name}%",
        )
    actions = [
        "register model version",
        "move model alias",
        "grant model",
        "revoke model grant",
        "delete model alias",
        "delete model version",
        "delete model",
    ]
    assert [r["action"] for r in rows] == actions * 2
    for life, (model_id, version_id) in enumerate(lives):
        entries = rows[life * len(actions) : (life + 1) * len(actions)]
        assert {r["detail"]["model_id"] for r in entries} == {model_id}, entries
        by_action = {r["action"]: r for r in entries}
        for action in ("register model version", "delete model version"):
            assert by_action[action]["detail"]["version_id"] == version_id
        assert by_action["delete model"]["target"] == f"vision/{name}"  # for people, as ever
    assert lives[0][0] != lives[1][0]


async def test_a_model_s_deletion_asks_the_store_nothing_and_the_collector_frees_leftovers(
    pool: asyncpg.Pool, store: ObjectStore, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each version's deletion frees its own objects; what a failed free left is no live
    version's, so the storage collector frees it. A model's deletion then has nothing of
    the store to do: its request asks the store nothing, however many versions it had.
    Before, it listed every tombstone's folder again in the request, work growing with every
    version the model ever had deleted."""
    name = f"many-{uuid.uuid4().hex[:6]}"
    job = await job_with_checkpoints(pool, store, [1, 2, 3])
    path = f"/v1/models/vision/{name}"
    real_free = models.free_objects

    def store_down(store: ObjectStore, version: object) -> models.Freed:
        raise OSError("connection reset by the object store")

    async with app_as(pool, store, VISION) as client:
        for checkpoint in job.checkpoints:
            added = await register(client, "vision", name, job, checkpoint_uri=checkpoint.uri)
            assert added.status_code == 201, added.text
        monkeypatch.setattr(models, "free_objects", store_down)
        assert (await client.delete(f"{path}/versions/1")).status_code == 200
        monkeypatch.setattr(models, "free_objects", real_free)
        for version in (2, 3):
            assert (await client.delete(f"{path}/versions/{version}")).status_code == 200

        asked: list[tuple[str, Any]] = []
        for call in ("list", "delete", "exists", "size", "get_bytes"):
            real = getattr(store, call)

            def counted(*args: Any, _call: str = call, _real: Any = real) -> Any:
                asked.append((_call, args))
                return _real(*args)

            monkeypatch.setattr(store, call, counted)
        deleted = await client.delete(path)
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"team": "vision", "model": name, "tombstones": 3}
        assert asked == []

    async with pool.acquire() as conn:
        left = await conn.fetchval(
            "SELECT v.artifact_key FROM model_versions v JOIN models m ON m.id = v.model_id "
            "WHERE m.team = 'vision' AND m.name = $1 AND v.version = 1",
            name,
        )
    folder = left.rpartition("/")[0] + "/"
    assert store.list(folder)  # what the failed free left
    database = DatabaseSettings(url=database_url)
    collector = StorageCollector(pool, database, store, keep=3, grace=timedelta(0))
    report = await collector.collect_once()
    assert report.ran, report
    assert store.list(folder) == []
