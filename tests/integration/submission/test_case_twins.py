"""Team names, and user names within a team, are unique regardless of case, on real
PostgreSQL (docs/security.md, Identities): an admin cannot make ``Alice`` beside ``alice``,
nor an operator a team ``Vision`` beside ``vision`` -- 409 naming the field and the name
that exists, nothing stored -- and the database's own index holds it when two creates race.
Lookups stay exact: ``GET /v1/teams/Vision`` does not find ``vision``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.service import MIGRATIONS, NAME
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.http_errors import NameTaken
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.settings import DatabaseSettings, StorageSettings
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(
    database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, asyncpg.Pool, dict[str, str]]]:
    """The app over a migrated database with teams ``ml`` (admin ``alice``) and ``vision``
    (admin ``bob``), and an operator; the tokens by who holds them."""
    settings = Settings(
        database=DatabaseSettings(url=database_url),
        storage=StorageSettings(uri=(tmp_path / "objects").as_uri()),
    )
    async with open_pool(settings.database, NAME) as pool:
        await migrate(pool, NAME, MIGRATIONS)
        tokens = {
            "alice": await identity.bootstrap_user(pool, "ml", "alice"),
            "bob": await identity.bootstrap_user(pool, "vision", "bob"),
            "root": await identity.bootstrap_user(pool, "platform", "root", Role.OPERATOR),
        }
        store = open_store(settings.storage.uri, settings.storage)
        app = create_app(settings, AppDeps(pool=pool, store=store))
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://submission") as client:
            yield client, pool, tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _names(pool: asyncpg.Pool, table: str) -> list[str]:
    rows = await pool.fetch(f"SELECT name FROM {table} ORDER BY id")
    return [r["name"] for r in rows]


async def test_a_user_differing_only_by_case_is_a_409_naming_the_field(
    world: tuple[httpx.AsyncClient, asyncpg.Pool, dict[str, str]],
) -> None:
    client, pool, tokens = world
    before = await _names(pool, "users")
    for name in ("Alice", "ALICE"):
        refused = await client.post(
            "/v1/admin/users", json={"name": name}, headers=bearer(tokens["alice"])
        )
        assert refused.status_code == 409, refused.text
        message = "a user named 'alice' exists in team ml; names differ from it only by case"
        assert refused.json() == {
            "detail": f"name: {message}",
            "errors": [{"field": "name", "message": message}],
        }
    # The same name in another team is another person: allowed, as before.
    other = await client.post(
        "/v1/admin/users", json={"name": "Alice", "team": "vision"}, headers=bearer(tokens["root"])
    )
    assert other.status_code == 201, other.text
    assert await _names(pool, "users") == [*before, "Alice"]
    with pytest.raises(NameTaken, match="a user named 'bob' exists in team vision"):
        await identity.bootstrap_user(pool, "vision", "BOB")


async def test_a_team_differing_only_by_case_is_a_409_and_lookups_stay_exact(
    world: tuple[httpx.AsyncClient, asyncpg.Pool, dict[str, str]],
) -> None:
    client, pool, tokens = world
    before = await _names(pool, "teams")
    refused = await client.post(
        "/v1/admin/users", json={"name": "eve", "team": "Vision"}, headers=bearer(tokens["root"])
    )
    assert refused.status_code == 409, refused.text
    message = "a team named 'vision' exists; names differ from it only by case"
    assert refused.json() == {
        "detail": f"team: {message}",
        "errors": [{"field": "team", "message": message}],
    }
    assert await _names(pool, "teams") == before
    assert await pool.fetchval("SELECT count(*) FROM users WHERE name = 'eve'") == 0
    with pytest.raises(NameTaken, match="team: a team named 'ml' exists"):
        await identity.bootstrap_user(pool, "ML", "carol")
    # A lookup is exact: the URL of a team is its stored spelling.
    seen = await client.get("/v1/teams/Vision", headers=bearer(tokens["bob"]))
    assert seen.status_code == 404
    assert (await client.get("/v1/teams/vision", headers=bearer(tokens["bob"]))).status_code == 200


async def test_two_creates_at_once_differing_by_case_one_wins(
    world: tuple[httpx.AsyncClient, asyncpg.Pool, dict[str, str]],
) -> None:
    """The check in code reads before it inserts; the unique index decides a race."""
    client, pool, tokens = world

    async def create(name: str, team: str) -> httpx.Response:
        return await client.post(
            "/v1/admin/users", json={"name": name, "team": team}, headers=bearer(tokens["root"])
        )

    for round_ in range(5):
        users = await asyncio.gather(create(f"dora{round_}", "ml"), create(f"Dora{round_}", "ml"))
        assert sorted(r.status_code for r in users) == [201, 409], [r.text for r in users]
        teams = await asyncio.gather(create("x", f"team{round_}"), create("x", f"TEAM{round_}"))
        assert sorted(r.status_code for r in teams) == [201, 409], [r.text for r in teams]
    for table, scope in (("users", "team_id, "), ("teams", "")):
        most = await pool.fetchval(
            f"SELECT count(*) FROM {table} GROUP BY {scope}lower(name) ORDER BY 1 DESC LIMIT 1"
        )
        assert most == 1, f"{table}: names differing only by case were both stored"
