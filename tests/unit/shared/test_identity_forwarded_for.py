"""The operator services ask submission ``GET /v1/me`` with each caller's token and name the
caller's address in ``X-Forwarded-For`` (``IdentityClient.principal``), so a refused token
is counted against that caller. The address is the one the service's uvicorn gives, which a
peer in its ``FORWARDED_ALLOW_IPS`` may set to anything (``*`` believes any client's first
``X-Forwarded-For`` entry). A value that was no IP address went into the header as it was:
one beyond ASCII failed building the request, and the caller got a 500 for its token check.
Only an IP address is named now; anything else names none, and the check goes on."""

from __future__ import annotations

import httpx
import pytest
from litestar import get
from pydantic import SecretStr

from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import IdentityClient


@get("/v1/things", sync_to_thread=False)
def things() -> list[str]:
    return []


async def _asked_with(client_host: str) -> tuple[int, list[str | None]]:
    """The service's answer to a caller at ``client_host``, and the ``X-Forwarded-For`` of
    each identity check it made."""
    named: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        named.append(request.headers.get("X-Forwarded-For"))
        me = {"user": "alice", "team": "ml", "role": "viewer", "token_id": 1}
        return httpx.Response(200, json=me)

    http = httpx.AsyncClient(base_url="http://identity", transport=httpx.MockTransport(answer))
    identity = IdentityClient("http://identity", http=http)
    app = service_app("test", [things], service_guard(SecretStr("operator"), identity))
    transport = httpx.ASGITransport(app=app, client=(client_host, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://service") as caller:
        response = await caller.get("/v1/things", headers={"Authorization": "Bearer ty_alice"})
    await identity.aclose()
    return response.status_code, named


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8::7", "2001:db8::7"),
        ("::1", "::1"),
        ("::ffff:203.0.113.9", "::ffff:203.0.113.9"),  # as uvicorn gives it, not rewritten
        ("fe80::1%eth0", "fe80::1%eth0"),
    ],
)
async def test_the_callers_address_is_named(host: str, named: str) -> None:
    assert await _asked_with(host) == (200, [named])


@pytest.mark.parametrize(
    "host", ["caf\u00e9", "fe80::1%\u00e9", "fe80::1%a b", "not an address", "203.0.113.9 x", ""]
)
async def test_a_client_that_is_no_address_names_none_and_is_still_checked(host: str) -> None:
    assert await _asked_with(host) == (200, [None])
