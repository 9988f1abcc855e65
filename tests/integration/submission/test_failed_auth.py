"""Requests with a missing or wrong token, bounded per client address (``failed_auth``):
past the burst an address gets 429 with ``Retry-After`` before any token lookup; a user
seen valid lately from it, and every other address, keep working (real PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Generator

import asyncpg
import httpx
import pytest
import uvicorn
from litestar import get
from pydantic import SecretStr

from tests.integration.submission.conftest import Submission, running_submission
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.services.submission import api, identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import IdentityClient

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


async def test_a_token_seen_valid_and_then_revoked_is_vouched_for_no_more(
    limited: Submission, settings: Settings
) -> None:
    """A token seen valid passes its address's refusal, so that the users behind a shared
    address keep working. Once it is refused (revoked: leaked, say), that is over: it
    kept being looked up, never held back, for up to 15 minutes from its last success,
    from any address, by whoever held it."""
    tight = settings.model_copy(update={"failed_auth_burst": BURST, "failed_auth_rate_per_s": 0.01})
    app = create_app(tight, AppDeps(pool=limited.pool, store=limited.store))
    async with _client(app, "10.0.0.3") as near:
        made = await near.post("/v1/tokens", json={"name": "leaked"}, headers=limited.auth())
        assert made.status_code == 201, made.text
        leaked = made.json()["token"]
        assert (await near.get("/v1/me", headers=_bearer(leaked))).status_code == 200  # seen
        revoked = await near.delete(f"/v1/tokens/{made.json()['id']}", headers=limited.auth())
        assert revoked.status_code == 204, revoked.text
        for token in (leaked, *["ty_wrong"] * (BURST - 1)):  # the burst: each a 401
            refused = await near.get("/v1/me", headers=_bearer(token))
            assert refused.status_code == 401, refused.text
        again = await near.get("/v1/me", headers=_bearer(leaked))
        assert again.status_code == 429, again.text  # held back as any wrong token
        still = await near.get("/v1/me", headers=limited.auth())
        assert still.status_code == 200, still.text  # alice's own, seen valid, still is


async def test_the_addresses_of_one_ipv6_64_share_one_budget_of_failures(
    limited: Submission, settings: Settings
) -> None:
    """A host is given a whole IPv6 /64: keyed by address, a client changing its address
    at each request had a fresh budget of failures each time, that is none at all."""
    tight = settings.model_copy(update={"failed_auth_burst": BURST, "failed_auth_rate_per_s": 0.01})
    app = create_app(tight, AppDeps(pool=limited.pool, store=limited.store))
    hops = [_client(app, f"2001:db8:7:1::{n}") for n in range(1, BURST + 2)]
    async with contextlib.AsyncExitStack() as stack:
        for hop in hops:
            await stack.enter_async_context(hop)
        neighbour = await stack.enter_async_context(_client(app, "2001:db8:7:2::1"))
        for hop in hops[:BURST]:  # the burst, each failure from another address
            refused = await hop.get("/v1/jobs", headers=_bearer("ty_wrong"))
            assert refused.status_code == 401, refused.text
        limited_answer = await hops[BURST].get("/v1/jobs", headers=_bearer("ty_wrong"))
        assert limited_answer.status_code == 429, limited_answer.text
        assert (
            "missing or wrong token from this client's network (2001:db8:7:1::/64)"
            in limited_answer.json()["detail"]
        )
        other = await neighbour.get("/v1/jobs", headers=_bearer("ty_wrong"))
        assert other.status_code == 401, other.text  # the next /64: a budget of its own


class _Server(uvicorn.Server):
    """uvicorn in the test's loop, leaving the signals alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def _served(app: object) -> AsyncIterator[str]:
    """``app`` behind uvicorn on loopback, as the service runs it (its ``X-Forwarded-For``
    believed from ``FORWARDED_ALLOW_IPS`` peers: loopback by default); yields its URL."""
    port = free_port()
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


@get("/v1/ping")
async def _ping() -> dict[str, str]:
    return {"ping": "pong"}


async def test_a_service_asking_for_its_callers_names_their_address_so_one_cannot_lock_out_all(
    limited: Submission, settings: Settings
) -> None:
    """The scheduler, registry and billing ask ``GET /v1/me`` with each of their callers'
    tokens, from their own address. A client sending wrong tokens to one of them spent that
    address's bucket, and then every user whose token this process had not seen lately got
    429 through that service for as long as the client kept on. The service names its
    caller's address (``X-Forwarded-For``, believed from a ``FORWARDED_ALLOW_IPS`` peer),
    so the failures are that caller's alone."""
    tight = settings.model_copy(update={"failed_auth_burst": BURST, "failed_auth_rate_per_s": 0.01})
    submission = create_app(tight, AppDeps(pool=limited.pool, store=limited.store))
    async with _served(submission) as url:
        asking = IdentityClient(url)
        try:
            service = service_app("scheduler", [_ping], service_guard(SecretStr("op"), asking))
            async with (
                _client(service, "203.0.113.9") as bad,
                _client(service, "198.51.100.7") as good,
            ):
                for _ in range(BURST):
                    refused = await bad.get("/v1/ping", headers=_bearer("ty_wrong"))
                    assert refused.status_code == 401, refused.text
                limited_answer = await bad.get("/v1/ping", headers=_bearer("ty_wrong"))
                assert limited_answer.status_code == 429, limited_answer.text  # still bounded
                # A user never seen by this submission process, through the same service.
                fresh = await good.get("/v1/ping", headers=_bearer(limited.other_team_token))
                assert fresh.status_code == 200, fresh.text
        finally:
            await asking.aclose()


async def test_a_client_cannot_pick_fresh_budgets_through_a_trusted_peers_forwarded_for(
    limited: Submission, settings: Settings
) -> None:
    """uvicorn gives the address a trusted peer's ``X-Forwarded-For`` names (loopback is
    trusted by default), whatever it is. Keyed as given, a client that could write it (a
    proxy passing the header on, ``FORWARDED_ALLOW_IPS=*``) named a new value at each
    request, a fresh budget each, as many keys as it liked, each as long as a header; and a
    6to4 host had a fresh budget in each of the 2^16 /64s of its /48."""
    tight = settings.model_copy(update={"failed_auth_burst": BURST, "failed_auth_rate_per_s": 0.01})
    submission = create_app(tight, AppDeps(pool=limited.pool, store=limited.store))
    async with _served(submission) as url, httpx.AsyncClient(base_url=url) as http:

        async def wrong(forwarded_for: str) -> httpx.Response:
            headers = {**_bearer("ty_wrong"), "X-Forwarded-For": forwarded_for}
            return await http.get("/v1/jobs", headers=headers)

        for n in range(BURST):  # the burst: no IP address named, each another value
            assert (await wrong(f"spray-{n}" + "x" * 1000)).status_code == 401
        assert (await wrong("spray-again")).status_code == 429
        for n in range(BURST):  # one IPv4 host through 6to4, each time another /64
            assert (await wrong(f"2002:cb00:7109:{n}::1")).status_code == 401
        assert (await wrong("2002:cb00:7109:ffff::1")).status_code == 429
        held = await wrong("203.0.113.9")  # the same host's own IPv4 address
        assert held.status_code == 429, held.text
        assert "missing or wrong token from this client address" in held.json()["detail"]
        assert (await wrong("198.51.100.7")).status_code == 401  # another host: its own
