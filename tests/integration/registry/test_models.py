"""The model lifecycle against real PostgreSQL and a real S3 endpoint (moto's server):
explicit registration, immutability, aliases and their history, deletion, listing."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import asyncpg
import pytest
import urllib3

from tests.integration.registry.modelkit import (
    ML,
    OPERATOR,
    VISION,
    VISION_ADMIN,
    VISION_VIEWER,
    app_as,
    apply,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_registry import spec, started, succeeded
from trainyard_platform.services.registry.model_api import MODELS
from trainyard_platform.services.registry.models import MAX_ALIASES
from trainyard_platform.shared.storage import ObjectStore
from trainyard_platform.shared.storage.local import LocalStore

pytestmark = pytest.mark.integration


async def test_a_registered_artifact_is_a_verified_copy_a_job_cannot_change(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [10, 20])
    original = store.get_bytes(job.key(20))
    async with app_as(pool, store, VISION) as client:
        created = await register(client, "vision", "digits", job, tags=["baseline"])
        assert created.status_code == 201, created.text
        body = created.json()
        # The job's latest committed checkpoint, copied under the registry's prefix.
        assert body["version"] == 1 and body["origin"] == "explicit" and body["owned"]
        assert body["source_uri"] == job.checkpoints[1].uri
        assert body["artifact"]["uri"].startswith(f"{store.root_uri}/registry/vision/digits/")
        assert body["artifact"]["sha256"] == job.checkpoints[1].sha256
        assert (body["tags"], body["created_by"]) == (["baseline"], "vision/alice")

        # The job's object is overwritten after registration: the version does not change.
        store.put_bytes(job.key(20), b"overwritten by a later attempt")
        served = await client.get("/v1/models/vision/digits/versions/1/content")
        assert served.status_code == 200, served.text
        assert served.content == original
        assert served.headers["x-trainyard-sha256"] == job.checkpoints[1].sha256

        # Registering the changed checkpoint now is refused: it is not what was committed.
        refused = await register(client, "vision", "digits", job)
        assert refused.status_code == 409, refused.text
        assert "changed after it was committed" in refused.json()["detail"]

        # Any committed checkpoint may be named; each registration is a version of its own.
        older = await register(
            client, "vision", "digits", job, checkpoint_uri=job.checkpoints[0].uri
        )
        assert older.status_code == 201, older.text
        assert (older.json()["version"], older.json()["artifact"]["step"]) == (2, 10)
    # The refused copy was removed again.
    assert len(store.list("registry/")) == 2


async def test_registration_is_for_the_callers_team_and_committed_checkpoints_only(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [5])
    store.put_bytes(f"jobs/{job.id}/checkpoints/step-00000009/checkpoint.pt", b"staged only")
    async with app_as(pool, store, ML) as client:
        # Another team's model path, or another team's job under one's own: 404 both.
        assert (await register(client, "vision", "digits", job)).status_code == 404
        other = await register(client, "ml", "digits", job)
        assert other.status_code == 404 and job.id in other.json()["detail"]
    async with app_as(pool, store, VISION_VIEWER) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 403
    async with app_as(pool, store, VISION) as client:
        uncommitted = await register(
            client,
            "vision",
            "digits",
            job,
            checkpoint_uri=store.uri_for(f"jobs/{job.id}/checkpoints/step-00000009/checkpoint.pt"),
        )
        assert uncommitted.status_code == 404, uncommitted.text
        bad_tag = await register(client, "vision", "digits", job, tags=["ok", "../x"])
        assert bad_tag.status_code == 422
        assert [e["field"] for e in bad_tag.json()["errors"]] == ["tags[1]"]
        extra = await register(client, "vision", "digits", job, owner="mallory")
        assert extra.status_code == 422
        assert (await client.get("/v1/models/vision/digits")).status_code == 404
    assert store.list("registry/") == []


async def test_a_tampered_artifact_is_never_served_and_the_mismatch_is_logged(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    # A handler on the module's own logger: building a Litestar app replaces the root's.
    logged: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = logged.append  # type: ignore[method-assign]
    logger = logging.getLogger("trainyard_platform.services.registry.artifacts")
    job = await job_with_checkpoints(pool, store, [3])
    async with app_as(pool, store, VISION) as client:
        created = await register(client, "vision", "digits", job)
        key = store.list("registry/")[0]
        store.put_bytes(key, b"tampered in the bucket")
        logger.addHandler(handler)
        try:
            download = await client.get("/v1/models/vision/digits/versions/1/download")
            content = await client.get("/v1/models/vision/digits/versions/1/content")
        finally:
            logger.removeHandler(handler)
    assert created.status_code == 201
    for refused in (download, content):
        assert refused.status_code == 409, refused.text
        assert "no longer matches its registered sha256" in refused.json()["detail"]
        assert b"tampered" not in refused.content
    assert sum("failed its integrity check" in r.getMessage() for r in logged) == 2


async def test_aliases_move_atomically_and_every_move_is_recorded(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [1, 2])
    async with app_as(pool, store, VISION) as client:
        for checkpoint in job.checkpoints:
            made = await register(client, "vision", "digits", job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201
        moved = await client.put("/v1/models/vision/digits/aliases/production", json={"version": 1})
        assert moved.json() == {
            "team": "vision",
            "model": "digits",
            "alias": "production",
            "version": 1,
            "previous": None,
        }
        moved = await client.put("/v1/models/vision/digits/aliases/production", json={"version": 2})
        assert moved.json()["previous"] == 1
        await client.put("/v1/models/vision/digits/aliases/candidate", json={"version": 1})

        by_alias = await client.get("/v1/models/vision/digits/versions/by-alias/production")
        assert by_alias.status_code == 200
        assert (by_alias.json()["version"], by_alias.json()["aliases"]) == (2, ["production"])
        listed = await client.get("/v1/models/vision/digits/aliases")
        assert listed.json()["aliases"] == {"candidate": 1, "production": 2}

        # Replicas moving one alias at once take turns: every move starts where the one
        # before it ended, so the history is one unbroken chain.
        targets = [1, 2] * 5
        await asyncio.gather(
            *(
                client.put("/v1/models/vision/digits/aliases/production", json={"version": v})
                for v in targets
            )
        )
        deleted = await client.delete("/v1/models/vision/digits/aliases/production")
        assert deleted.status_code == 200 and deleted.json()["version"] is None
        history = (await client.get("/v1/models/vision/digits/aliases/production/moves")).json()
        moves = history["moves"]
        assert moves[0]["from_version"] is None and moves[-1]["to_version"] is None
        for before, after in itertools.pairwise(moves):
            assert after["from_version"] == before["to_version"]
            assert after["from_version"] != after["to_version"]  # a no-op is not a move
        assert {m["actor"] for m in moves} == {"vision/alice"}

        assert (
            await client.get("/v1/models/vision/digits/versions/by-alias/production")
        ).status_code == 404
        assert (
            await client.put("/v1/models/vision/digits/aliases/production", json={"version": 9})
        ).status_code == 404
        bad = await client.put("/v1/models/vision/digits/aliases/Prod", json={"version": 1})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "alias"
    async with app_as(pool, store, VISION_VIEWER) as client:
        assert (
            await client.put("/v1/models/vision/digits/aliases/candidate", json={"version": 2})
        ).status_code == 403
    async with app_as(pool, store, ML) as client:
        assert (await client.get("/v1/models/vision/digits/aliases")).status_code == 404
        assert (
            await client.get("/v1/models/vision/digits/aliases/candidate/moves")
        ).status_code == 404

    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("UPDATE model_alias_moves SET actor = 'someone else'")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM model_alias_moves")


async def test_an_alias_change_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """``GET .../aliases/{alias}`` answers where the alias points with its ``ETag``; a
    ``PUT`` or ``DELETE`` with ``If-Match: <it>`` proceeds while the alias points where it
    was read and is 412, naming ``If-Match`` and that it changed, once another member
    moved it since: a promotion decided on what was read no longer undoes another's.
    ``If-None-Match: *`` only creates. Without a condition, as before. (Before, there was
    no such ``GET`` nor tag, and both writes ignored the headers.)"""
    job = await job_with_checkpoints(pool, store, [1, 2, 3])
    path = "/v1/models/vision/digits/aliases/production"
    async with app_as(pool, store, VISION) as client:
        for checkpoint in job.checkpoints:
            made = await register(client, "vision", "digits", job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201
        assert (await client.get(path)).status_code == 404
        created = await client.put(path, json={"version": 1}, headers={"If-None-Match": "*"})
        assert created.status_code == 200, created.text
        again = await client.put(path, json={"version": 2}, headers={"If-None-Match": "*"})
        assert again.status_code == 412 and again.json()["errors"][0]["field"] == "If-None-Match"
        read = await client.get(path)
        assert read.json() == {
            "team": "vision",
            "model": "digits",
            "alias": "production",
            "version": 1,
        }
        tag = read.headers["ETag"]
        assert tag == created.headers["ETag"]
        # Another member moves it after this one looked.
        other = await client.put(path, json={"version": 2}, headers={"If-Match": tag})
        assert other.status_code == 200, other.text
        assert other.headers["ETag"] not in (tag, None)
        for response in (
            await client.put(path, json={"version": 3}, headers={"If-Match": tag}),
            await client.delete(path, headers={"If-Match": tag}),
        ):
            assert response.status_code == 412, response.text
            (error,) = response.json()["errors"]
            assert error["field"] == "If-Match"
            assert "alias 'production' of model vision/digits was changed" in error["message"]
        assert (await client.get(path)).json()["version"] == 2
        fresh = await client.put(
            path, json={"version": 3}, headers={"If-Match": other.headers["ETag"]}
        )
        assert fresh.status_code == 200 and fresh.json()["previous"] == 2, fresh.text
        # Without a condition, as before.
        assert (await client.put(path, json={"version": 1})).status_code == 200
        now = (await client.get(path)).headers["ETag"]
        gone = await client.delete(path, headers={"If-Match": now})
        assert gone.status_code == 200 and gone.json()["previous"] == 1, gone.text
        assert (await client.delete(path, headers={"If-Match": now})).status_code == 404
        moves = (await client.get(f"{path}/moves")).json()["moves"]
        assert [m["to_version"] for m in moves] == [1, 2, 3, 1, None]


async def test_a_version_delete_is_conditional_on_the_etag_of_the_version_read(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """``GET .../versions/{version}`` answers the version's ``ETag`` (of its
    registration); a ``DELETE`` with ``If-Match`` deletes only the registration that was
    read (412, nothing freed, for any other tag), ``If-None-Match: *`` never deletes, and
    a ``DELETE`` without a condition goes ahead as before. (Before, the version had no tag
    and the ``DELETE`` ignored the headers.)"""
    job = await job_with_checkpoints(pool, store, [1, 2, 3])
    base = "/v1/models/vision/digits/versions"
    async with app_as(pool, store, VISION) as client:
        for checkpoint in job.checkpoints:
            made = await register(client, "vision", "digits", job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201
        first = (await client.get(f"{base}/1")).headers["ETag"]
        second = (await client.get(f"{base}/2")).headers["ETag"]
        assert first != second
        other = await client.delete(f"{base}/2", headers={"If-Match": first})
        assert other.status_code == 412, other.text
        (error,) = other.json()["errors"]
        assert error["field"] == "If-Match"
        assert "version 2 of model vision/digits was changed" in error["message"]
        absent = await client.delete(f"{base}/2", headers={"If-None-Match": "*"})
        assert absent.status_code == 412 and absent.json()["errors"][0]["field"] == "If-None-Match"
        assert (await client.get(f"{base}/2")).status_code == 200
        assert (await client.delete(f"{base}/2", headers={"If-Match": second})).status_code == 200
        assert (await client.delete(f"{base}/2", headers={"If-Match": second})).status_code == 404
        assert (await client.delete(f"{base}/3")).status_code == 200  # no condition
    assert len(store.list("registry/")) == 1


async def test_deleting_a_version_frees_its_objects_unless_an_alias_points_at_it(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [7])
    async with app_as(pool, store, VISION_ADMIN) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
        assert (await register(client, "vision", "digits", job)).status_code == 201
        await client.put("/v1/models/vision/digits/aliases/production", json={"version": 1})
        await client.put("/v1/models/vision/digits/aliases/rollback", json={"version": 1})
        refused = await client.delete("/v1/models/vision/digits/versions/1")
        assert refused.status_code == 409
        assert (
            "'production'" in refused.json()["detail"] and "'rollback'" in refused.json()["detail"]
        )
        # Said as a sentence ("is what alias 'production', 'rollback' points at" before).
        assert refused.json()["detail"] == (
            "version 1 of vision/digits is what aliases 'production' and 'rollback' point at; "
            "move or delete them first"
        )
        assert len(store.list("registry/")) == 2

        await client.delete("/v1/models/vision/digits/aliases/production")
        await client.delete("/v1/models/vision/digits/aliases/rollback")
        freed = await client.delete("/v1/models/vision/digits/versions/1")
        assert freed.status_code == 200, freed.text
        assert freed.json() == {
            "team": "vision",
            "model": "digits",
            "version": 1,
            "objects": 1,
            "bytes": job.checkpoints[0].size_bytes,
        }
        assert len(store.list("registry/")) == 1
        assert store.exists(job.key(7))  # the job's own checkpoint is not the registry's
        assert (await client.get("/v1/models/vision/digits/versions/1")).status_code == 404
        assert (await client.delete("/v1/models/vision/digits/versions/1")).status_code == 404
        assert (
            await client.put("/v1/models/vision/digits/aliases/production", json={"version": 1})
        ).status_code == 409
        listing = await client.get("/v1/models/vision/digits/versions")
        assert [v["version"] for v in listing.json()["versions"]] == [2]
        # A deleted version's number is never given again.
        assert (await register(client, "vision", "digits", job)).json()["version"] == 3
        model = (await client.get("/v1/models/vision/digits")).json()
        assert (model["latest_version"], model["versions"]) == (3, 2)

    async with pool.acquire() as conn:
        audited = await conn.fetch(
            "SELECT action, target FROM audit_log WHERE actor = 'vision/ada' ORDER BY id"
        )
    assert ("delete model version", "vision/digits/1") in [tuple(r) for r in audited]


async def test_models_are_listed_per_team_with_paging(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    vision_job = await job_with_checkpoints(pool, store, [1])
    ml_job = await job_with_checkpoints(pool, store, [1], team="ml")
    async with app_as(pool, store, VISION) as client:
        for name in ("alpha", "beta", "gamma"):
            assert (await register(client, "vision", name, vision_job)).status_code == 201
    async with app_as(pool, store, ML) as client:
        assert (await register(client, "ml", "alpha", ml_job)).status_code == 201

    async with app_as(pool, store, VISION) as client:
        first = (await client.get("/v1/models", params={"limit": 2})).json()
        assert [m["name"] for m in first["models"]] == ["alpha", "beta"]
        assert first["next"] == MODELS.write("vision", "beta")  # the platform's cursor
        second = (
            await client.get("/v1/models", params={"limit": 2, "after": first["next"]})
        ).json()
        assert [m["name"] for m in second["models"]] == ["gamma"] and second["next"] is None
        assert (await client.get("/v1/models", params={"team": "ml"})).json()["models"] == []
        assert (await client.get("/v1/models/ml/alpha")).status_code == 404
        bad = await client.get("/v1/models", params={"after": "../x"})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "after"
    async with app_as(pool, store, OPERATOR) as client:
        every = (await client.get("/v1/models")).json()["models"]
        assert [(m["team"], m["name"]) for m in every] == [
            ("ml", "alpha"),
            ("vision", "alpha"),
            ("vision", "beta"),
            ("vision", "gamma"),
        ]
        only_ml = (await client.get("/v1/models", params={"team": "ml"})).json()["models"]
        assert [m["name"] for m in only_ml] == ["alpha"]
        in_project = await client.get("/v1/models", params={"project": "default"})
        assert len(in_project.json()["models"]) == 4
        elsewhere = await client.get("/v1/models", params={"project": "research"})
        assert elsewhere.json()["models"] == []
        bad = await client.get("/v1/models", params={"project": ".."})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "project"
        detail = (await client.get("/v1/models/vision/beta")).json()
        assert (detail["project"], detail["versions"], detail["aliases"]) == ("default", 1, {})


async def test_a_success_whose_checkpoint_changed_since_its_commit_registers_nothing(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    job = await job_with_checkpoints(pool, store, [6])
    store.put_bytes(job.key(6), b"changed after checkpoint.saved")
    success = succeeded(job.id, f"alloc-{job.id}", None)  # the newest recorded checkpoint
    await apply(pool, store, job.id, success)  # handled: no retry, no dead letter
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM model_versions") == 0
    assert store.list("registry/") == []

    # Another job whose checkpoint is as committed registers, as a copy.
    fixed = await job_with_checkpoints(pool, store, [6])
    await apply(pool, store, fixed.id, succeeded(fixed.id, f"alloc-{fixed.id}", None))
    async with app_as(pool, store, VISION) as client:
        version = (await client.get("/v1/models/vision/digits/versions/1")).json()
    assert (version["job_id"], version["origin"], version["owned"]) == (
        fixed.id,
        "job_success",
        True,
    )
    assert version["created_by"] == "alice"  # the job's user


async def test_versions_come_a_page_at_a_time(pool: asyncpg.Pool, store: ObjectStore) -> None:
    # GET .../versions answered every live version of a model in one body, however many.
    # Now it pages with the platform's cursor; a deleted version is skipped, not a hole.
    job = await job_with_checkpoints(pool, store, [10, 20, 30], name="paged")
    async with app_as(pool, store, VISION) as client:
        for checkpoint in [*job.checkpoints, *job.checkpoints]:
            made = await register(client, "vision", "paged", job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201, made.text
        deleted = await client.delete("/v1/models/vision/paged/versions/3")
        assert deleted.status_code == 200, deleted.text
        base = "/v1/models/vision/paged/versions"
        seen: list[int] = []
        query: dict[str, str | int] = {"limit": 2}
        for _ in range(10):
            answer = await client.get(base, params=query)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert len(body["versions"]) <= 2
            seen += [v["version"] for v in body["versions"]]
            if body["next"] is None:
                break
            query = {"limit": 2, "after": body["next"]}
        assert seen == [1, 2, 4, 5, 6]
        for bad in ({"after": "Mg"}, {"after": "WyJ4Il0"}, {"limit": 501}, {"limit": 0}):
            refused = await client.get(base, params=bad)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"][0]["field"] == next(iter(bad)), refused.text


async def test_alias_moves_come_a_page_at_a_time(pool: asyncpg.Pool, store: ObjectStore) -> None:
    # An alias's history is append-only and grows with every move; GET .../moves answered
    # all of it in one body. Now it pages with the platform's cursor.
    job = await job_with_checkpoints(pool, store, [10, 20], name="moved")
    async with app_as(pool, store, VISION) as client:
        for checkpoint in job.checkpoints:
            made = await register(client, "vision", "moved", job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201, made.text
        alias = "/v1/models/vision/moved/aliases/production"
        for target in [1, 2, 1, 2, 1]:
            assert (await client.put(alias, json={"version": target})).status_code in (200, 201)
        seen: list[int | None] = []
        query: dict[str, str | int] = {"limit": 2}
        for _ in range(10):
            answer = await client.get(f"{alias}/moves", params=query)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert len(body["moves"]) <= 2
            seen += [m["to_version"] for m in body["moves"]]
            if body["next"] is None:
                break
            query = {"limit": 2, "after": body["next"]}
        assert seen == [1, 2, 1, 2, 1]
        for bad in ({"after": "Mg"}, {"limit": 501}):
            refused = await client.get(f"{alias}/moves", params=bad)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"][0]["field"] == next(iter(bad)), refused.text
        never = await client.get("/v1/models/vision/moved/aliases/candidate/moves")
        assert never.status_code == 404


async def test_a_model_has_at_most_max_aliases(pool: asyncpg.Pool, store: ObjectStore) -> None:
    # A member could give a model any number of aliases, and its detail, its row in
    # GET /v1/models and GET .../aliases carry every one of them in one body. Now a new alias
    # past MAX_ALIASES is a 422 naming alias and the limit; moving or deleting one still works.
    job = await job_with_checkpoints(pool, store, [10], name="tagged")
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "tagged", job)).status_code == 201
        base = "/v1/models/vision/tagged/aliases"
        for n in range(MAX_ALIASES):
            made = await client.put(f"{base}/a{n:03}", json={"version": 1})
            assert made.status_code == 200, made.text
        refused = await client.put(f"{base}/one-more", json={"version": 1})
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["errors"]
        assert error["field"] == "alias"
        assert f"the most a model may have is {MAX_ALIASES}" in error["message"]
        listed = (await client.get(base)).json()["aliases"]
        assert len(listed) == MAX_ALIASES and "one-more" not in listed
        assert (await client.put(f"{base}/a000", json={"version": 1})).status_code == 200
        assert (await client.delete(f"{base}/a000")).status_code == 200
        assert (await client.put(f"{base}/one-more", json={"version": 1})).status_code == 200


async def test_aliases_come_a_page_at_a_time(pool: asyncpg.Pool, store: ObjectStore) -> None:
    # GET .../aliases answered every alias of the model in one body; now a page by name,
    # the rest by next (as the versions and the moves).
    job = await job_with_checkpoints(pool, store, [10], name="paged")
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "paged", job)).status_code == 201
        base = "/v1/models/vision/paged/aliases"
        for alias in ("e", "d", "c", "b", "a"):
            assert (await client.put(f"{base}/{alias}", json={"version": 1})).status_code == 200
        seen: list[str] = []
        query: dict[str, str | int] = {"limit": 2}
        for _ in range(10):
            answer = await client.get(base, params=query)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert len(body["aliases"]) <= 2 and set(body["aliases"].values()) == {1}
            seen += list(body["aliases"])
            if body["next"] is None:
                break
            query = {"limit": 2, "after": body["next"]}
        assert seen == ["a", "b", "c", "d", "e"]
        for bad in ({"after": "bm90IGEgY3Vyc29y"}, {"limit": 501}):
            refused = await client.get(base, params=bad)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"][0]["field"] == next(iter(bad)), refused.text
        assert (await client.get("/v1/models/vision/ghost/aliases")).status_code == 404


async def test_the_database_refuses_to_change_a_version_and_allows_one_deletion(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A version is immutable in the database itself, as a dataset version is: no statement
    changes its artifact, metrics, lineage, tags or description, un-deletes it, deletes it
    again or removes its row. Deleting it (its tombstone: ``deleted_at``, ``deleted_by``,
    once) is the one change. Before, only the API's lack of a route kept a version as
    published: an UPDATE by anything with the registry's credentials went through."""
    job = await job_with_checkpoints(pool, store, [4])
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "frozen", job)).status_code == 201
    changes = [
        "artifact_sha256 = repeat('0', 64)",
        "artifact_key = NULL",
        "artifact_uri = 'file:///elsewhere'",
        "metrics = '{\"val_accuracy\": 1.0}'",
        "lineage = '{}'",
        "tags = '{forged}'",
        "description = 'changed'",
        "version = 99",
        "job_id = 'another-job'",
        "deleted_at = now(), deleted_by = 'vision/mallory', description = 'changed'",
    ]
    async with pool.acquire() as conn:
        before = dict(await conn.fetchrow("SELECT * FROM model_versions"))
        for change in changes:
            with pytest.raises(asyncpg.RaiseError, match="model versions are immutable"):
                await conn.execute(f"UPDATE model_versions SET {change}")
        with pytest.raises(asyncpg.RaiseError, match="model versions are immutable"):
            await conn.execute("DELETE FROM model_versions")
        assert dict(await conn.fetchrow("SELECT * FROM model_versions")) == before
    async with app_as(pool, store, VISION) as client:
        deleted = await client.delete("/v1/models/vision/frozen/versions/1")
        assert deleted.status_code == 200, deleted.text
    async with pool.acquire() as conn:
        tombstone = dict(await conn.fetchrow("SELECT * FROM model_versions"))
        assert tombstone["deleted_by"] == "vision/alice"
        assert {k: v for k, v in tombstone.items() if not k.startswith("deleted_")} == {
            k: v for k, v in before.items() if not k.startswith("deleted_")
        }
        for change in ("deleted_at = NULL, deleted_by = NULL", "deleted_by = 'vision/mallory'"):
            with pytest.raises(asyncpg.RaiseError, match="model versions are immutable"):
                await conn.execute(f"UPDATE model_versions SET {change}")


async def test_a_job_started_after_its_parent_was_deleted_is_its_tombstones_child(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """A job admitted naming a parent version, which is deleted before the job starts: the
    lineage edge is written to the version's tombstone (its row stays), and the parent's
    lineage shows it deleted. docs/models.md said the edge was left unwritten."""
    job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "base", job)).status_code == 201
        assert (await client.delete("/v1/models/vision/base/versions/1")).status_code == 200
        child = spec("child", "vision").model_copy(update={"parent_model": "vision/base:1"})
        await apply(pool, store, "job-child", started("job-child", "alloc-job-child", 0, child))
        async with pool.acquire() as conn:
            parent = await conn.fetchval(
                "SELECT v.version FROM job_parents p "
                "JOIN model_versions v ON v.id = p.parent_version_id "
                "WHERE p.job_id = 'job-child' AND v.deleted_at IS NOT NULL"
            )
        assert parent == 1
        graph = await client.get("/v1/lineage/models/vision/base/versions/1/upstream")
        assert graph.status_code == 200, graph.text
        assert graph.json()["nodes"][0]["deleted"] is True


async def test_head_of_a_versions_artifact_fetches_nothing(
    pool: asyncpg.Pool, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HEAD`` of ``content`` and ``download`` ran the whole ``GET``: the artifact fetched
    from the store and verified, then thrown away. They answer the ``GET``'s status and
    headers (the sha256, the file's name) from the version alone; a version of another
    team's model is 404 as for the ``GET``."""
    from trainyard_platform.services.registry import model_api

    job = await job_with_checkpoints(pool, store, [10])
    fetched: list[str] = []
    fetch = model_api.artifacts.fetch_verified

    def counted(source: ObjectStore, key: str, expected: object) -> object:
        fetched.append(key)
        return fetch(source, key, expected)  # type: ignore[arg-type]

    monkeypatch.setattr(model_api.artifacts, "fetch_verified", counted)
    base = "/v1/models/vision/digits/versions/1"
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
        head = await client.head(f"{base}/content")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["x-trainyard-sha256"] == job.checkpoints[0].sha256
        assert head.headers["content-disposition"] == 'attachment; filename="digits-v1.pt"'
        assert head.headers["content-type"] == "application/octet-stream"
        assert (await client.head(f"{base}/download")).status_code == 200
        assert (await client.head("/v1/models/vision/digits/versions/9/content")).status_code == 404
        assert fetched == []
        get = await client.get(f"{base}/content")
        assert get.status_code == 200 and len(fetched) == 1
        assert get.headers["content-disposition"] == head.headers["content-disposition"]
    async with app_as(pool, store, ML) as client:
        assert (await client.head(f"{base}/content")).status_code == 404
    assert len(fetched) == 1


async def test_content_answers_head_and_if_none_match_with_the_headers_of_its_get(
    pool: asyncpg.Pool, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HEAD`` of ``content`` answered no ``ETag``, ``Last-Modified`` or ``Content-Length``
    while its ``GET`` did, and the ``GET``'s were of the copy it had just fetched (its
    file's path and time): another on every request, so no ``If-None-Match`` could ever
    match. Both now answer the same headers, all of the version (the ``ETag`` of its
    bytes), and ``If-None-Match`` naming it is 304 for both, with nothing fetched."""
    from trainyard_platform.services.registry import model_api

    job = await job_with_checkpoints(pool, store, [10])
    fetched: list[str] = []
    fetch = model_api.artifacts.fetch_verified

    def counted(source: ObjectStore, key: str, expected: object) -> object:
        fetched.append(key)
        return fetch(source, key, expected)  # type: ignore[arg-type]

    monkeypatch.setattr(model_api.artifacts, "fetch_verified", counted)
    url = "/v1/models/vision/digits/versions/1/content"
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
        first, again = await client.get(url), await client.get(url)
        head = await client.head(url)
        assert first.status_code == again.status_code == head.status_code == 200
        assert len(fetched) == 2
        tag = first.headers["etag"]
        assert tag == f'"{job.checkpoints[0].sha256}"'
        assert again.headers["etag"] == tag
        assert int(head.headers["content-length"]) == len(first.content)
        assert dict(head.headers) == dict(first.headers) and head.content == b""

        for method in ("GET", "HEAD"):
            for asked in (tag, f'W/{tag}, "other"', "*"):
                same = await client.request(method, url, headers={"If-None-Match": asked})
                assert same.status_code == 304, (method, asked, same.status_code)
                assert same.content == b"" and same.headers["etag"] == tag
                assert "content-length" not in same.headers
            other = await client.request(method, url, headers={"If-None-Match": '"other"'})
            assert other.status_code == 200 and other.headers["etag"] == tag
        assert len(fetched) == 3  # the GET whose If-None-Match named another tag

        # download's body is a new URL each time: its HEAD has the GET's headers but the
        # length, which is not known without making one, and neither has an ETag.
        link = "/v1/models/vision/digits/versions/1/download"
        got, head = await client.get(link), await client.head(link)
        assert got.status_code == head.status_code == 200 and head.content == b""
        assert set(got.headers) - set(head.headers) == {"content-length"}
        assert set(head.headers) <= set(got.headers) and "etag" not in got.headers


async def test_a_checkpoint_freed_since_its_commit_is_refused_naming_it(
    pool: asyncpg.Pool, store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A recorded checkpoint the store no longer holds (freed by retention since it was
    committed): its registration is a 409 naming the field that chose it, not a 500, and a
    success registering it logs one line, without a traceback, and is not retried."""
    job = await job_with_checkpoints(pool, store, [10, 20])
    store.delete(job.key(20))
    async with app_as(pool, store, VISION) as client:
        latest = await register(client, "vision", "digits", job)
        assert latest.status_code == 409, latest.text
        assert "no longer in the object store" in latest.json()["detail"]
        assert job.checkpoints[1].uri in latest.json()["detail"]
        assert [e["field"] for e in latest.json()["errors"]] == ["job_id"]
        named = await register(
            client, "vision", "digits", job, checkpoint_uri=job.checkpoints[1].uri
        )
        assert named.status_code == 409, named.text
        assert [e["field"] for e in named.json()["errors"]] == ["checkpoint_uri"]
        older = await register(
            client, "vision", "digits", job, checkpoint_uri=job.checkpoints[0].uri
        )
        assert older.status_code == 201, older.text
    assert len(store.list("registry/")) == 1  # no copy of the freed one left behind

    gone = await job_with_checkpoints(pool, store, [6])
    store.delete(gone.key(6))
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        # Handled (``apply`` raises otherwise): no retry, no dead letter.
        await apply(pool, store, gone.id, succeeded(gone.id, f"alloc-{gone.id}", None))
    errors = [r for r in caplog.records if gone.id in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert "no longer in the object store" in errors[0].getMessage()
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM model_versions WHERE job_id = $1", gone.id)
            == 0
        )


async def test_an_object_store_outage_is_a_503_to_retry_not_an_internal_error(
    pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """Registration and download while the store does not answer (what the S3 client raises
    when its endpoint refuses): 503 with ``Retry-After``, naming the store, no traceback."""

    class Flaky(LocalStore):
        down = False

        def copy(self, src: str, dst: str) -> None:
            if self.down:
                raise urllib3.exceptions.MaxRetryError(None, "/bucket", "connection refused")  # type: ignore[arg-type]
            super().copy(src, dst)

        def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
            if self.down:
                raise urllib3.exceptions.MaxRetryError(None, "/bucket", "connection refused")  # type: ignore[arg-type]
            super().get_file(key, path, max_bytes=max_bytes)

    store = Flaky(tmp_path / "store")
    job = await job_with_checkpoints(pool, store, [3])
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
        store.down = True
        for answer in (
            await register(client, "vision", "digits", job),
            await client.get("/v1/models/vision/digits/versions/1/content"),
        ):
            assert answer.status_code == 503, answer.text
            assert "object store" in answer.json()["detail"]
            assert "retry-after" in answer.headers
