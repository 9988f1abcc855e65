"""Bad input never breaks anything: every garbage body is a 4xx in the shared error shape,
and a row the outbox cannot send never stops the service."""

from __future__ import annotations

import json
import os
from typing import Any

import asyncpg
import pytest

from tests.integration.submission.conftest import SPEC, Submission, eventually
from tests.integration.submission.test_bundles_and_logs import tar_gz
from trainyard_platform.services.submission.api import JSON_BODY_MAX_BYTES
from trainyard_platform.shared.outbox import parked_count

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}


def _shape(body: dict[str, Any]) -> None:
    assert set(body) == {"detail", "errors"} and isinstance(body["detail"], str), body
    for error in body["errors"]:
        assert set(error) == {"field", "message"} and error["message"], body


async def _post(
    submission: Submission, content: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    response = await submission.client.post(
        "/v1/jobs", content=content, headers={**submission.auth(), **(headers or JSON)}
    )
    assert "Traceback" not in response.text
    body = response.json()
    if response.status_code >= 400:
        _shape(body)
    return response.status_code, body


def _spec(**changes: Any) -> bytes:
    return json.dumps({**SPEC, **changes}).encode()


GARBAGE: dict[str, bytes] = {
    "invalid utf-8": b'{"name": "\xff\xfe"}',
    "a JSON array": b"[1, 2, 3]",
    "a string": b'"job"',
    "null": b"null",
    "empty": b"",
    "a huge integer": _spec(seed=0)[:-1] + b', "gpus": 1' + b"9" * 5000 + b"}",
    "a huge float": _spec()[:-1].replace(b'"seed": 7', b'"seed": 1e999') + b"}",
    "NaN": _spec()[:-1].replace(b'"seed": 7', b'"seed": NaN') + b"}",
    "deep nesting": b'{"name": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "nesting past the recursion limit": b"[" * 30_000 + b"]" * 30_000,
    "NUL in a key": _spec()[:-1] + b', "na\\u0000me": "x"}',
    "NUL in a hyperparameter key": _spec(hyperparameters={"l\x00r": 1}),
    "a lone surrogate": _spec(
        name="a\ud800b".encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
    ),
    "a UTF-8 BOM": b"\xef\xbb\xbf" + _spec(),
    "truncated": _spec()[:-5],
    "a number as a key": b"{1: 2}",
}


@pytest.mark.parametrize("what", list(GARBAGE))
async def test_garbage_bodies_are_4xx_in_the_shared_shape(
    submission: Submission, what: str
) -> None:
    status, body = await _post(submission, GARBAGE[what])
    assert 400 <= status < 500, (what, status, body)
    assert body["errors"], body


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "a\x00b"}, "name"),
        ({"name": "a\tb"}, "name"),
        ({"args": ["ok", "x\x00y"]}, "args[1]"),
        ({"args": ["\x1b[31m"]}, "args[0]"),
        ({"hyperparameters": {"opt": "a\x00"}}, "hyperparameters.opt"),
        ({"gpu_flavor": "cpu\n"}, "gpu_flavor"),
        ({"dataset": "s3://d/\x7f"}, "dataset"),
        ({"priority": "\x00"}, "priority"),
        (
            {"code": {"kind": "git", "repository": "https://h/r\x00", "commit": "a" * 40}},
            "code.repository",
        ),
    ],
)
async def test_control_characters_are_422_naming_the_field(
    submission: Submission, changes: dict[str, Any], field: str
) -> None:
    status, body = await _post(submission, _spec(**changes))
    assert status == 422, body
    assert field in [e["field"] for e in body["errors"]], body
    assert await _count(submission.pool, "jobs") == 0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {"code": {"kind": "git", "repository": "https://127.0.0.1./x", "commit": "a" * 40}},
            "code.repository",
        ),
        ({"requirements": ["x @ https://127.0.0.1./x-1.0-py3-none-any.whl"]}, "requirements[0]"),
    ],
)
async def test_a_host_programs_read_two_ways_is_422_naming_the_field_and_why(
    submission: Submission, changes: dict[str, Any], field: str
) -> None:
    # Before: taken (no address to this service), then failed on the runner as a host that
    # did not resolve, the platform's failure, retried (shared.url_hosts).
    status, body = await _post(submission, _spec(**changes))
    assert status == 422, body
    messages = [e["message"] for e in body["errors"] if e["field"] == field]
    assert messages and "names the host '127.0.0.1.', which ends in a number" in messages[0]
    assert await _count(submission.pool, "jobs") == 0


async def test_free_text_may_hold_tabs_and_newlines(submission: Submission) -> None:
    status, body = await _post(
        submission, _spec(args=["--note", "a\tb\r\nc"], hyperparameters={"prompt": "x\ny"})
    )
    assert status == 201, body
    assert body["spec"]["args"][1] == "a\tb\r\nc"


async def test_duplicate_keys_are_422(submission: Submission) -> None:
    status, body = await _post(submission, _spec()[:-1] + b', "gpus": 2}')
    assert status == 422
    assert body["errors"] == [{"field": "gpus", "message": "duplicate key"}]
    nested = _spec()[:-1] + b', "hyperparameters": {"lr": 1, "lr": 2}}'
    status, body = await _post(
        submission, nested.replace(b'"hyperparameters": {"lr"', b'"x": {"lr"', 1)
    )
    assert status == 422


async def test_body_over_the_limit_is_413_with_a_clear_message(submission: Submission) -> None:
    big = _spec(args=["x" * JSON_BODY_MAX_BYTES])
    status, body = await _post(submission, big)
    assert status == 413
    assert f"at most {JSON_BODY_MAX_BYTES} bytes" in body["detail"]

    # Not announced up front (chunked): still cut off.
    async def chunks() -> Any:
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    response = await submission.client.post(
        "/v1/jobs", content=chunks(), headers={**submission.auth(), **JSON}
    )
    assert response.status_code == 413, response.text
    assert await _count(submission.pool, "jobs") == 0


async def test_the_bundle_upload_keeps_its_own_larger_limit(submission: Submission) -> None:
    import hashlib

    data = tar_gz(("noise.bin", os.urandom(JSON_BODY_MAX_BYTES * 4)))  # random: stays large
    assert len(data) > JSON_BODY_MAX_BYTES * 4
    sha = hashlib.sha256(data).hexdigest()
    response = await submission.client.put(
        f"/v1/bundles/{sha}", content=data, headers=submission.auth()
    )
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1", None],
)
async def test_a_wrong_content_type_is_415(
    submission: Submission, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/v1/jobs", "/v1/admin/users"):
        response = await submission.client.post(
            path, content=_spec(), headers={**submission.auth(), **headers}
        )
        assert response.status_code == 415, (path, response.text)
        _shape(response.json())
        assert "application/json" in response.json()["detail"]


async def test_json_with_a_charset_is_accepted(submission: Submission) -> None:
    status, body = await _post(
        submission, _spec(), {"Content-Type": "application/json; charset=UTF-8"}
    )
    assert status == 201, body


async def test_admin_users_body_is_screened_too(submission: Submission) -> None:
    response = await submission.client.post(
        "/v1/admin/users",
        content=b'{"name": "carol", "name": "dave"}',
        headers={**submission.auth(), **JSON},
    )
    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "name", "message": "duplicate key"}]


async def test_an_unsendable_outbox_row_never_stops_the_service(submission: Submission) -> None:
    # What a few-MB spec would have become before the API refused it: a row over the bus's
    # 1 MiB limit, written directly.
    async with submission.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO outbox (event_id, subject, body) VALUES ($1, $2, $3)",
            "oversized",
            "trainyard.job.submitted.oversized",
            b"{" + b" " * (2 * 1024 * 1024) + b"}",
        )
    job = await submission.submit()  # the service still serves, and relays what comes after

    async def relayed() -> bool:
        async with submission.pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL "
                    "AND convert_from(body, 'UTF8') LIKE '%' || $1 || '%'",
                    job["id"],
                )
            )

    await eventually(relayed)
    assert await parked_count(submission.pool) == 1
    assert (await submission.job(job["id"]))["status"] == "QUEUED"


async def _count(pool: asyncpg.Pool, table: str) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(f"SELECT count(*) FROM {table}")
        return count
