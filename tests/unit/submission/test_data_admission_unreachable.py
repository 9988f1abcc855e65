"""A registry that cannot answer makes jobs that name data answer 503, and the operator's log
says why, naming the setting: once per reason a minute, never the user's token."""

from __future__ import annotations

import logging

import httpx
import pytest

from trainyard_platform.services.submission import data_admission
from trainyard_platform.services.submission.data_admission import (
    DataAdmission,
    RegistryUnavailable,
)
from trainyard_platform.services.submission.schemas import JobRequest
from trainyard_platform.shared.identity import IdentityRateLimited

JOB = JobRequest.model_validate(
    {
        "name": "n",
        "entrypoint": "train",
        "gpus": 1,
        "gpu_flavor": "h200",
        "datasets": ["team-a/digits:1"],
    }
)


def _refusing(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


async def test_an_unreachable_registry_is_logged_once_naming_the_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = DataAdmission("http://registry:8083", httpx.MockTransport(_refusing))
    caplog.set_level(logging.WARNING, logger=data_admission.__name__)

    for _ in range(3):
        with pytest.raises(RegistryUnavailable):
            await admission.admit(JOB, "Bearer ty_some-user-token")

    [record] = [r for r in caplog.records if r.name == data_admission.__name__]
    message = record.getMessage()
    assert "TRAINYARD_SUBMISSION_REGISTRY_URL" in message
    assert "http://registry:8083" in message
    assert "Connection refused" in message
    assert "ty_some-user-token" not in message


async def test_a_registry_answering_an_error_is_logged_with_its_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = DataAdmission(
        "http://registry:8083", httpx.MockTransport(lambda request: httpx.Response(502))
    )
    caplog.set_level(logging.WARNING, logger=data_admission.__name__)

    with pytest.raises(RegistryUnavailable, match="answered 502"):
        await admission.admit(JOB, "Bearer ty_some-user-token")

    [record] = [r for r in caplog.records if r.name == data_admission.__name__]
    assert "answered 502" in record.getMessage()


async def test_a_registry_refusing_the_users_rate_limit_is_the_users_429_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The registry limits each user's requests itself (``shared.access``), and its token
    check spends the user's reads at submission: its 429 is the user's, passed on with its
    reason and ``Retry-After``. It was a 503 saying the registry could not be asked, and a
    warning in the operator's log."""
    detail = (
        "rate limit exceeded: at most 50 read requests to the registry service per second "
        "per user (bursts of 200); retry after 3 s"
    )

    def refusing(request: httpx.Request) -> httpx.Response:
        body = {"detail": detail, "errors": [{"field": "Authorization", "message": "spent"}]}
        return httpx.Response(429, json=body, headers={"Retry-After": "3"})

    admission = DataAdmission("http://registry:8083", httpx.MockTransport(refusing))
    caplog.set_level(logging.WARNING, logger=data_admission.__name__)
    with pytest.raises(IdentityRateLimited) as refused:
        await admission.admit(JOB, "Bearer ty_some-user-token")
    assert (str(refused.value), refused.value.retry_after) == (detail, "3")
    assert [r for r in caplog.records if r.name == data_admission.__name__] == []
