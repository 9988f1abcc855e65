"""A service that cannot reach the identity service says so in its log, naming the setting.

With ``TRAINYARD_SCHEDULER_IDENTITY_URL`` at a closed port every request with a user token
answered 503 ``identity service unreachable (ConnectError)``, and the scheduler's log said
nothing at all: the operator paged for the 503s had nothing to read."""

from __future__ import annotations

import logging

import httpx
import pytest

from trainyard_platform.shared import identity as identity_module
from trainyard_platform.shared.identity import IdentityClient, IdentityUnavailable


def _refusing(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


async def test_an_unreachable_identity_service_is_logged_once_naming_the_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    http = httpx.AsyncClient(
        base_url="http://submission:8080", transport=httpx.MockTransport(_refusing)
    )
    client = IdentityClient(
        "http://submission:8080", http=http, setting="TRAINYARD_SCHEDULER_IDENTITY_URL"
    )
    caplog.set_level(logging.WARNING, logger=identity_module.__name__)

    for _ in range(3):
        with pytest.raises(IdentityUnavailable):
            await client.principal("ty_some-user-token")
    await client.aclose()

    [record] = [r for r in caplog.records if r.name == identity_module.__name__]
    message = record.getMessage()
    assert "TRAINYARD_SCHEDULER_IDENTITY_URL" in message
    assert "http://submission:8080" in message
    assert "Connection refused" in message
    assert "ty_some-user-token" not in message
