"""Datasets on a real PostgreSQL: immutable versions per team, team-scoped reads, grants by
the owning team's admins (audited), the access audit written from ``job.started``, and every
name of the dataset routes confined (422 naming the field)."""

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
    VISION_ADMIN,
    VISION_VIEWER,
    app_as,
    apply,
)
from tests.integration.registry.test_registry import spec, started
from trainyard_platform.services.registry.dataset_api import DATASETS
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


def version_body(**changes: Any) -> dict[str, Any]:
    return {
        "uri": "s3://data/digits/v1.parquet",
        "sha256": "a" * 64,
        "size_bytes": 1797,
        "data_schema": {"pixels": "float32[64]", "label": "int8"},
        "feature_version": "git:1234abcd",
        **changes,
    }


async def add(client: httpx.AsyncClient, team: str, name: str, **changes: Any) -> httpx.Response:
    return await client.post(f"/v1/datasets/{team}/{name}/versions", json=version_body(**changes))


async def test_every_post_makes_a_new_immutable_version(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"digits-{uuid.uuid4().hex[:6]}"
    async with app_as(pool, store, VISION) as client:
        first = await add(client, "vision", name)
        second = await add(client, "vision", name, uri="s3://data/digits/v2.parquet")
        assert (first.status_code, second.status_code) == (201, 201)
        assert (first.json()["version"], second.json()["version"]) == (1, 2)
        assert second.json()["reference"] == f"vision/{name}:2"
        one = (await client.get(f"/v1/datasets/vision/{name}/versions/1")).json()
        assert one["uri"] == "s3://data/digits/v1.parquet"  # the second did not change it
        assert one["data_schema"] == {"pixels": "float32[64]", "label": "int8"}
        detail = (await client.get(f"/v1/datasets/vision/{name}")).json()
        assert detail["latest_version"] == 2 and len(detail["versions"]) == 2
        assert detail["grants"] == []
        listed = (await client.get("/v1/datasets")).json()["datasets"]
        assert name in [d["name"] for d in listed]
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.RaiseError, match="immutable"):
            await conn.execute("UPDATE dataset_versions SET uri = 'x://y' WHERE version = 1")
        with pytest.raises(asyncpg.RaiseError, match="immutable"):
            await conn.execute("DELETE FROM dataset_versions")


async def test_another_team_reads_only_with_a_grant_which_only_admins_give(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"faces-{uuid.uuid4().hex[:6]}"
    grant = f"/v1/datasets/vision/{name}/grants/ml"
    async with app_as(pool, store, VISION) as member:
        assert (await add(member, "vision", name)).status_code == 201
        assert (await member.put(grant)).status_code == 403
    async with app_as(pool, store, VISION_VIEWER) as viewer:
        assert (await viewer.get(f"/v1/datasets/vision/{name}")).status_code == 200
        assert (await add(viewer, "vision", name)).status_code == 403
    async with app_as(pool, store, ML) as ml:
        hidden = await ml.get(f"/v1/datasets/vision/{name}")
        absent = await ml.get("/v1/datasets/vision/no-such-dataset")
        assert (hidden.status_code, absent.status_code) == (404, 404)
        assert (await ml.get(f"/v1/datasets/vision/{name}/versions/1")).status_code == 404
        assert (await add(ml, "vision", name)).status_code == 404  # not its team
        assert (await ml.put(grant)).status_code == 404  # an admin, of another team
        assert name not in [d["name"] for d in (await ml.get("/v1/datasets")).json()["datasets"]]
    async with app_as(pool, store, VISION_ADMIN) as admin:
        given = await admin.put(grant)
        assert given.status_code == 200 and given.json()["changed"] is True
        assert (await admin.put(grant)).json()["changed"] is False
        self_grant = await admin.put(f"/v1/datasets/vision/{name}/grants/vision")
        assert self_grant.json()["errors"][0]["field"] == "grantee_team"
    async with app_as(pool, store, ML) as ml:
        seen = await ml.get(f"/v1/datasets/vision/{name}")
        assert seen.status_code == 200 and seen.json()["grants"] is None  # not its business
        assert (await ml.get(f"/v1/datasets/vision/{name}/versions/1")).status_code == 200
        assert name in [d["name"] for d in (await ml.get("/v1/datasets")).json()["datasets"]]
    async with app_as(pool, store, OPERATOR) as operator:
        revoked = await operator.delete(grant)
        assert revoked.json() == {
            "team": "vision",
            "name": name,
            "grantee_team": "ml",
            "granted": False,
            "changed": True,
        }
    async with app_as(pool, store, ML) as ml:
        assert (await ml.get(f"/v1/datasets/vision/{name}")).status_code == 404
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT actor, action FROM audit_log WHERE target = $1 ORDER BY id", f"vision/{name}"
        )
    assert [(r["actor"], r["action"]) for r in rows] == [
        ("vision/ada", "grant dataset"),
        ("vision/ada", "grant dataset"),
        ("op", "revoke dataset grant"),
    ]


async def test_the_access_audit_records_what_each_job_was_given(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    own, shared, secret = (f"d-{uuid.uuid4().hex[:6]}" for _ in range(3))
    async with app_as(pool, store, VISION) as client:
        await add(client, "vision", own)
        await add(client, "vision", own)
    async with app_as(pool, store, ML) as client:
        await add(client, "ml", shared)
        await add(client, "ml", secret)
        await client.put(f"/v1/datasets/ml/{shared}/grants/vision")
    job = f"job-{uuid.uuid4().hex[:8]}"
    refs = [f"vision/{own}:1", f"ml/{shared}", f"ml/{secret}:1", "vision/nothing:1"]
    job_spec = spec("reader").model_copy(update={"datasets": refs})
    await apply(pool, store, job, started(job, f"alloc-{job}", 0, job_spec))
    await apply(pool, store, job, started(job, f"alloc2-{job}", 1, job_spec))  # a restart
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT d.team, d.name, v.version, a.team AS reader, a.allocation_id
               FROM dataset_access a JOIN dataset_versions v ON v.id = a.dataset_version_id
               JOIN datasets d ON d.id = v.dataset_id WHERE a.job_id = $1
               ORDER BY d.team DESC""",
            job,
        )
    # Not the ungranted dataset, nor the one that does not exist; once each, first start's.
    assert [tuple(r) for r in rows] == [
        ("vision", own, 1, "vision", f"alloc-{job}"),
        ("ml", shared, 1, "vision", f"alloc-{job}"),
    ]


HOSTILE = {
    "%2E%2E": "..",
    ".hidden": ".hidden",
    "a%2Fb": "encoded slash",
    "%2Fetc%2Fpasswd": "absolute path",
    "a%5C..%5Cb": "backslashes",
    "a%00b": "NUL byte",
    "x" * 300: "very long",
    "%252E%252E": "double-encoded ..",
}


@pytest.mark.parametrize("bad", list(HOSTILE), ids=list(HOSTILE.values()))
async def test_hostile_names_of_dataset_routes_are_refused(
    pool: asyncpg.Pool, store: ObjectStore, bad: str
) -> None:
    async with app_as(pool, store, OPERATOR) as client:
        calls = [
            ("team", "GET", f"/v1/datasets/{bad}/digits", None),
            ("name", "GET", f"/v1/datasets/vision/{bad}", None),
            ("name", "GET", f"/v1/datasets/vision/{bad}/versions/1", None),
            ("team", "POST", f"/v1/datasets/{bad}/digits/versions", version_body()),
            ("name", "POST", f"/v1/datasets/vision/{bad}/versions", version_body()),
            ("grantee_team", "PUT", f"/v1/datasets/vision/digits/grants/{bad}", None),
            ("grantee_team", "DELETE", f"/v1/datasets/vision/digits/grants/{bad}", None),
            ("name", "PUT", f"/v1/datasets/vision/{bad}/grants/ml", None),
        ]
        for field, method, path, body in calls:
            answer = await client.request(method, path, json=body)
            where = f"{method} {path}: {answer.status_code} {answer.text[:200]}"
            if answer.status_code == 422:
                assert field in [e["field"] for e in answer.json()["errors"]], where
            else:
                assert answer.status_code == 404 and "%2F" in bad, where
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM datasets WHERE team = 'vision' AND name = 'digits'"
            )
            == 0
        )


async def test_a_bad_version_body_names_each_bad_field(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    async with app_as(pool, store, VISION) as client:
        answer = await add(
            client,
            "vision",
            "digits",
            uri="no uri",
            sha256="XYZ",
            size_bytes=-1,
            producing_job_id="job-of-nobody",
        )
        assert answer.status_code == 422
        assert {e["field"] for e in answer.json()["errors"]} == {"uri", "sha256", "size_bytes"}
        unknown_job = await add(client, "vision", "digits", producing_job_id="job-of-nobody")
        assert unknown_job.status_code == 422
        assert unknown_job.json()["errors"][0]["field"] == "producing_job_id"


async def test_the_listing_pages_on_and_never_stops_short_silently(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """``GET /v1/datasets?limit=N`` answered the first N and nothing said there were more
    (the CLI asked for 500 and showed 500 of 501)."""
    async with app_as(pool, store, ML) as ml:
        for name in ("m1", "m2"):
            assert (await add(ml, "ml", name)).status_code == 201
        assert (await ml.put("/v1/datasets/ml/m2/grants/vision")).status_code == 200
    async with app_as(pool, store, VISION) as vision:
        for name in ("v1", "v2", "v3"):
            assert (await add(vision, "vision", name)).status_code == 201
        seen, after, pages = [], None, 0
        while True:
            params = {"limit": 2} if after is None else {"limit": 2, "after": after}
            page = await vision.get("/v1/datasets", params=params)
            assert page.status_code == 200, page.text
            seen += [f"{d['team']}/{d['name']}" for d in page.json()["datasets"]]
            pages, after = pages + 1, page.json()["next"]
            if after is None:
                break
        assert seen == ["ml/m2", "vision/v1", "vision/v2", "vision/v3"]  # ml/m1: not granted
        assert pages == 2  # a full page that is the last has no next (shared.paging)
        # A cursor naming another team's dataset only says where to start.
        page = (
            await vision.get("/v1/datasets", params={"after": DATASETS.write("ml", "m1")})
        ).json()
        assert [d["name"] for d in page["datasets"]] == ["m2", "v1", "v2", "v3"]
        for forged in ("nothing", "a/../b", "/x", "a/b/c"):
            bad = await vision.get("/v1/datasets", params={"after": forged})
            assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "after"


async def test_a_dataset_s_versions_come_a_page_at_a_time(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    # GET /v1/datasets/{team}/{name} answered every version of the dataset in one body,
    # however many. Now a page of them with the platform's cursor (next, passed as after).
    name = f"paged-{uuid.uuid4().hex[:6]}"
    async with app_as(pool, store, VISION) as client:
        for n in range(5):
            made = await add(client, "vision", name, uri=f"s3://data/digits/v{n}.parquet")
            assert made.status_code == 201, made.text
        seen: list[int] = []
        query: dict[str, str | int] = {"limit": 2}
        for _ in range(10):
            answer = await client.get(f"/v1/datasets/vision/{name}", params=query)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert len(body["versions"]) <= 2 and body["latest_version"] == 5
            seen += [v["version"] for v in body["versions"]]
            if body["next"] is None:
                break
            query = {"limit": 2, "after": body["next"]}
        assert seen == [1, 2, 3, 4, 5]
        for bad in ({"after": "Mg"}, {"limit": 501}):
            refused = await client.get(f"/v1/datasets/vision/{name}", params=bad)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"][0]["field"] == next(iter(bad)), refused.text
