"""Requests with a missing or wrong token, bounded per client address (``failed_auth``):
past the burst an address gets 429 with ``Retry-After`` before any token lookup; a user
seen valid lately from it, and every other address, keep working (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import Submission, running_submission
from trainyard_platform.services.submission import api, identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.bus import Bus

pytestmark = pytest.mark.integration

BURST = 3


@pytest.fixture
async def limited(settings: Settings, pool: asyncpg.Pool, bus: Bus) -> AsyncIterator[Submission]:
    async with running_submission(settings, pool, bus) as running:
        yield running


def _client(app: object, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://submission")


def _bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


async def test_an_address_past_its_failures_is_refused_before_any_lookup_but_for_seen_users(
    limited: Submission, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[str] = []
    real = identity.authenticate

    async def counted(pool: asyncpg.Pool, token: str) -> identity.Caller | None:
        lookups.append(token)
        return await real(pool, token)

    monkeypatch.setattr(api.identity, "authenticate", counted)
    tight = settings.model_copy(update={"failed_auth_burst": BURST, "failed_auth_rate_per_s": 0.01})
    app = create_app(tight, AppDeps(pool=limited.pool, store=limited.store))
    async with _client(app, "10.0.0.1") as near, _client(app, "10.0.0.2") as far:
        seen = await near.get("/v1/me", headers=_bearer(limited.admin_token))
        assert seen.status_code == 200, seen.text  # alice, seen valid from this address
        for token in ("ty_wrong", None, "ty_wrong-again"):  # the burst: each a 401
            refused = await near.get("/v1/jobs", headers=_bearer(token))
            assert refused.status_code == 401, refused.text
        before = len(lookups)
        for token in ("ty_wrong", None):
            limited_answer = await near.get("/v1/jobs", headers=_bearer(token))
            assert limited_answer.status_code == 429, limited_answer.text
            retry = limited_answer.headers["retry-after"]
            assert retry.isdigit() and int(retry) >= 1
            body = limited_answer.json()
            assert "missing or wrong token from this client address" in body["detail"]
            assert body["errors"][0]["field"] == "Authorization"
        assert len(lookups) == before  # refused before any lookup

        still = await near.get("/v1/jobs", headers=_bearer(limited.admin_token))
        assert still.status_code == 200, still.text  # a user behind the same address
        unseen = await near.get("/v1/jobs", headers=_bearer(limited.other_team_token))
        assert unseen.status_code == 429, unseen.text  # first seen while refused: waits
        elsewhere = await far.get("/v1/jobs", headers=_bearer(limited.other_team_token))
        assert elsewhere.status_code == 200, elsewhere.text  # another address: no wait
        wrong_elsewhere = await far.get("/v1/jobs", headers=_bearer("ty_wrong"))
        assert wrong_elsewhere.status_code == 401, wrong_elsewhere.text
