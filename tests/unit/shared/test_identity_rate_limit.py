"""The operator services check a user token by asking the submission service ``GET /v1/me``,
which spends a read of that user's rate limit. When the user's bucket is empty the answer is
the user's own 429, passed on with its ``Retry-After`` and reason; before, every such
request was a 503 "identity service answered 429", as if the service were down."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from litestar import get
from litestar.testing import TestClient
from pydantic import SecretStr

from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import IdentityClient, IdentityRateLimited

LIMITED = "rate limit exceeded: at most 50 read requests per second per user (bursts of 200)"


def _identity(status: int, headers: dict[str, str] | None = None) -> IdentityClient:
    def answer(request: httpx.Request) -> httpx.Response:
        if status == 200:
            me = {"user": "alice", "team": "ml", "role": "viewer", "token_id": 1}
            return httpx.Response(200, json=me)
        return httpx.Response(status, json={"detail": LIMITED, "errors": []}, headers=headers)

    http = httpx.AsyncClient(base_url="http://identity", transport=httpx.MockTransport(answer))
    return IdentityClient("http://identity", http=http)


@get("/v1/things", sync_to_thread=False)
def things() -> list[str]:
    return []


@pytest.mark.parametrize(
    ("sent", "passed_on"), [({"Retry-After": "3"}, "3"), ({}, "1"), ({"Retry-After": "x"}, "1")]
)
def test_the_users_own_rate_limit_is_a_429_with_retry_after(
    sent: dict[str, str], passed_on: str
) -> None:
    guard = service_guard(SecretStr("operator"), _identity(429, sent))
    with TestClient(service_app("test", [things], guard)) as client:
        answer = client.get("/v1/things", headers={"Authorization": "Bearer ty_alice"})
    assert answer.status_code == 429, answer.text
    assert answer.headers["Retry-After"] == passed_on
    why = [{"field": "Authorization", "message": LIMITED}]  # as submission's own 429
    assert answer.json() == {"detail": LIMITED, "errors": why}


def test_other_refusals_of_the_identity_service_stay_503() -> None:
    guard = service_guard(SecretStr("operator"), _identity(500))
    with TestClient(service_app("test", [things], guard)) as client:
        answer = client.get("/v1/things", headers={"Authorization": "Bearer ty_alice"})
    assert answer.status_code == 503
    with TestClient(
        service_app("test", [things], service_guard(SecretStr("op"), _identity(200)))
    ) as client:
        assert client.get("/v1/things", headers={"Authorization": "Bearer ty_a"}).status_code == 200


async def test_the_client_says_why() -> None:
    with pytest.raises(IdentityRateLimited) as limited:
        await _identity(429, {"Retry-After": "7"}).principal("ty_alice")
    assert (str(limited.value), limited.value.retry_after) == (LIMITED, "7")


def test_every_route_documents_429(**_: Any) -> None:
    app = service_app("test", [things], service_guard(SecretStr("operator")))
    responses = app.openapi_schema.to_schema()["paths"]["/v1/things"]["get"]["responses"]
    assert "429" in responses


async def test_a_write_is_checked_as_a_write_and_as_before_by_an_older_submission() -> None:
    """``POST /v1/me`` spends a write; a submission without that route (405, during an
    upgrade) is asked ``GET /v1/me`` as before, not taken as down."""
    asked: list[str] = []

    def answer(request: httpx.Request, post: int) -> httpx.Response:
        asked.append(request.method)
        if request.method == "POST" and post != 200:
            return httpx.Response(post)
        return httpx.Response(
            200, json={"user": "a", "team": "ml", "role": "viewer", "token_id": 1}
        )

    for post, methods in ((200, ["POST"]), (405, ["POST", "GET"])):
        asked.clear()
        transport = httpx.MockTransport(lambda r, post=post: answer(r, post))  # type: ignore[misc]
        http = httpx.AsyncClient(base_url="http://identity", transport=transport)
        found = await IdentityClient("http://identity", http=http).principal("ty_a", write=True)
        assert found is not None and found.user == "a"
        assert asked == methods
    asked.clear()
    transport = httpx.MockTransport(lambda r: answer(r, 200))
    http = httpx.AsyncClient(base_url="http://identity", transport=transport)
    await IdentityClient("http://identity", http=http).principal("ty_a")
    assert asked == ["GET"]
