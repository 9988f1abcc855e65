"""Grants on models on a real PostgreSQL and S3 endpoint: another team can neither see,
download nor fine-tune from a model without a grant (404, like a model that does not exist),
can do all three with one, and never write to it; only the owning team's admins (and
operators) give and take grants, audited; a revoked grant applies at once."""

from __future__ import annotations

import uuid

import asyncpg
import httpx
import pytest

from tests.integration.registry.modelkit import (
    ML,
    OPERATOR,
    VISION,
    VISION_ADMIN,
    app_as,
    apply,
    job_with_checkpoints,
    register,
)
from tests.integration.registry.test_registry import spec, started
from trainyard_platform.shared.identity import Principal, Role
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration

ML_MEMBER = Principal(user="mo", team="ml", role=Role.MEMBER, token_id=5)


def reads(name: str) -> list[str]:
    """Every read route of model ``ml/name`` (version 1, alias ``production``)."""
    base = f"/v1/models/ml/{name}"
    return [
        base,
        f"{base}/versions",
        f"{base}/versions/1",
        f"{base}/versions/by-alias/production",
        f"{base}/versions/1/download",
        f"{base}/versions/1/content",
        f"{base}/aliases",
        f"{base}/aliases/production/moves",
    ]


async def statuses(client: httpx.AsyncClient, paths: list[str]) -> dict[str, int]:
    return {path: (await client.get(path)).status_code for path in paths}


async def fine_tune(pool: asyncpg.Pool, store: ObjectStore, parent: str) -> str | None:
    """Start a job of team vision fine-tuning from ``parent``; the parent version the
    registry recorded for it (the lineage edge), if any."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    job_spec = spec("tuned").model_copy(update={"parent_model": parent})
    await apply(pool, store, job, started(job, f"alloc-{job}", 0, job_spec))
    async with pool.acquire() as conn:
        found = await conn.fetchval(
            """SELECT m.team || '/' || m.name || ':' || v.version FROM job_parents p
               JOIN model_versions v ON v.id = p.parent_version_id
               JOIN models m ON m.id = v.model_id WHERE p.job_id = $1""",
            job,
        )
    return None if found is None else str(found)


async def test_another_team_sees_downloads_and_fine_tunes_only_with_a_grant(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    name = f"cnn-{uuid.uuid4().hex[:6]}"
    grants = f"/v1/models/ml/{name}/grants/vision"
    job = await job_with_checkpoints(pool, store, [5], team="ml", name=name)
    async with app_as(pool, store, ML) as ml:
        assert (await register(ml, "ml", name, job)).status_code == 201
        moved = await ml.put(f"/v1/models/ml/{name}/aliases/production", json={"version": 1})
        assert moved.status_code == 200

    # Without a grant: every read is 404, the same as for a model that does not exist.
    async with app_as(pool, store, VISION) as vision:
        assert set((await statuses(vision, reads(name))).values()) == {404}
        assert set((await statuses(vision, reads("no-such-model"))).values()) == {404}
        listed = (await vision.get("/v1/models", params={"team": "ml"})).json()
        assert listed == {"models": [], "next": None}
    assert await fine_tune(pool, store, f"ml/{name}:1") is None
    assert await fine_tune(pool, store, f"ml/{name}@production") is None

    # Only the owning team's admins (or operators) grant.
    async with app_as(pool, store, ML_MEMBER) as member:
        assert (await member.put(grants)).status_code == 403
    async with app_as(pool, store, VISION_ADMIN) as other_admin:
        assert (await other_admin.put(grants)).status_code == 404
        assert (await other_admin.put(f"/v1/models/vision/{name}/grants/ml")).status_code == 404
    async with app_as(pool, store, ML) as ml:
        itself = await ml.put(f"/v1/models/ml/{name}/grants/ml")
        assert itself.status_code == 422 and itself.json()["errors"][0]["field"] == "grantee_team"
        bad = await ml.put(f"/v1/models/ml/{name}/grants/.hidden")
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "grantee_team"
        granted = await ml.put(grants)
        assert granted.status_code == 200, granted.text
        assert granted.json() == {
            "team": "ml",
            "name": name,
            "grantee_team": "vision",
            "granted": True,
            "changed": True,
        }
        assert (await ml.put(grants)).json()["changed"] is False
        assert (await ml.get(f"/v1/models/ml/{name}")).json()["grants"] == ["vision"]

    # With it: every read answers, the bytes come verified, and a job may fine-tune from it.
    async with app_as(pool, store, VISION) as vision:
        assert set((await statuses(vision, reads(name))).values()) == {200}
        detail = (await vision.get(f"/v1/models/ml/{name}")).json()
        assert detail["grants"] is None  # whom else ml granted is not vision's business
        content = await vision.get(f"/v1/models/ml/{name}/versions/1/content")
        assert content.content == store.get_bytes(job.key(5))
        download = (await vision.get(f"/v1/models/ml/{name}/versions/1/download")).json()
        assert download["needs_token"] is False and f"/registry/ml/{name}/" in download["url"]
        listed = (await vision.get("/v1/models", params={"team": "ml"})).json()["models"]
        assert [m["name"] for m in listed] == [name]
        own = (await vision.get("/v1/models")).json()["models"]
        assert all(m["team"] == "vision" for m in own)
        # Reading is all a grant gives: writes stay the owning team's.
        assert (await register(vision, "ml", name, job)).status_code == 404
        put_alias = await vision.put(f"/v1/models/ml/{name}/aliases/mine", json={"version": 1})
        assert put_alias.status_code == 404
        assert (await vision.delete(f"/v1/models/ml/{name}/versions/1")).status_code == 404
    async with app_as(pool, store, VISION_ADMIN) as other_admin:
        assert (await other_admin.delete(grants)).status_code == 404
    assert await fine_tune(pool, store, f"ml/{name}:1") == f"ml/{name}:1"
    assert await fine_tune(pool, store, f"ml/{name}@production") == f"ml/{name}:1"

    # Revoked: 404 again at once, and new jobs get no edge.
    async with app_as(pool, store, OPERATOR) as operator:
        revoked = await operator.delete(grants)
        assert revoked.json()["granted"] is False and revoked.json()["changed"] is True
    async with app_as(pool, store, VISION) as vision:
        assert set((await statuses(vision, reads(name))).values()) == {404}
    assert await fine_tune(pool, store, f"ml/{name}:1") is None
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT actor, action FROM audit_log WHERE target = $1 ORDER BY id", f"ml/{name}"
        )
    assert [(r["actor"], r["action"]) for r in rows if "grant" in r["action"]] == [
        ("ml/bob", "grant model"),
        ("ml/bob", "grant model"),
        ("op", "revoke model grant"),
    ]
