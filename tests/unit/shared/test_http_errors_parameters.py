"""``check_parameters``: every path and query parameter is screened for control characters,
and a request with neither is let through without parsing anything."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from litestar import Request

from trainyard_platform.shared.http_errors import RequestInvalid, check_parameters


def _request(
    query: bytes = b"", path_params: dict[str, Any] | None = None
) -> Request[Any, Any, Any]:
    scope: Any = {
        "type": "http",
        "method": "GET",
        "path": "/v1/jobs",
        "query_string": query,
        "path_params": path_params or {},
        "headers": [],
        "state": {},
        "app": None,
    }
    return Request(scope)


def test_a_request_without_parameters_passes() -> None:
    asyncio.run(check_parameters(_request()))


def test_clean_parameters_pass() -> None:
    asyncio.run(check_parameters(_request(b"status=QUEUED&limit=5", {"job_id": "j-1"})))


@pytest.mark.parametrize(
    ("query", "path_params", "field"),
    [
        (b"name=a%00b", None, "name"),
        (b"", {"job_id": "j\x1f1"}, "job_id"),
        (b"label=k%3Dv%C2%85", {"job_id": "ok"}, "label"),
    ],
)
def test_a_control_character_in_any_parameter_is_named(
    query: bytes, path_params: dict[str, Any] | None, field: str
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        asyncio.run(check_parameters(_request(query, path_params)))
    assert [e.field for e in refused.value.errors] == [field]
