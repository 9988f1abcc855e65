"""The scheduler says its flavor catalogue: each operator change of a flavor leaves through
its outbox, in the change's transaction, with a growing revision; a refused change says
nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.api import create_app
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events import Payload, parse_envelope
from trainyard_platform.shared.events.payloads import FlavorDeclared, FlavorRetired

pytestmark = pytest.mark.integration

AUTH = {"Authorization": "Bearer op-token"}


@pytest.fixture
async def http(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(pool, service_guard(SecretStr("op-token"))))
    async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as client:
        yield client


async def said(pool: asyncpg.Pool) -> list[tuple[str, Payload]]:
    rows = await pool.fetch(
        "SELECT subject, body FROM outbox WHERE subject LIKE 'trainyard.flavor.%' ORDER BY seq"
    )
    return [(r["subject"], parse_envelope(bytes(r["body"])).data) for r in rows]


async def test_declared_described_and_retired_flavors_are_said_in_order(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    assert (await http.put("/v1/admin/flavors/l40s", json={}, headers=AUTH)).status_code == 201
    described = await http.put(
        "/v1/admin/flavors/l40s", json={"description": "48 GB"}, headers=AUTH
    )
    assert described.status_code == 200
    assert (await http.delete("/v1/admin/flavors/l40s", headers=AUTH)).status_code == 204

    events = await said(pool)
    assert [subject for subject, _ in events] == [
        "trainyard.flavor.declared.v1.l40s",
        "trainyard.flavor.declared.v1.l40s",
        "trainyard.flavor.retired.v1.l40s",
    ]
    first, second, retired = (payload for _, payload in events)
    assert isinstance(first, FlavorDeclared) and isinstance(second, FlavorDeclared)
    assert isinstance(retired, FlavorRetired)
    assert (first.description, second.description) == ("", "48 GB")
    assert first.revision < second.revision < retired.revision


async def test_a_refused_change_says_nothing(http: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "h1", "h200", 8, datetime.now(UTC))
    assert (await http.delete("/v1/admin/flavors/h200", headers=AUTH)).status_code == 409
    assert (await http.put("/v1/admin/flavors/Bad!", json={}, headers=AUTH)).status_code == 422
    assert await said(pool) == []
