"""A token never leaves the request it authenticates: not into spans, logs, events or the
audit log; only its hash is stored."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.submission.conftest import Submission

pytestmark = pytest.mark.integration


async def test_tokens_appear_in_no_span_log_event_or_table(
    submission: Submission, caplog: pytest.LogCaptureFixture, spans: InMemorySpanExporter
) -> None:
    caplog.set_level(logging.DEBUG)
    created = await submission.client.post(
        "/v1/tokens", json={"name": "ci"}, headers=submission.auth()
    )
    assert created.status_code == 201, created.text
    secrets = [submission.admin_token, created.json()["token"]]
    await submission.submit()
    await submission.client.get("/v1/me", headers=submission.auth(secrets[1]))
    await submission.client.get("/v1/me", headers=submission.auth("ty_wrong"))
    rotated = await submission.client.post(
        "/v1/tokens/rotate", json={}, headers=submission.auth(secrets[1])
    )
    secrets.append(rotated.json()["token"])

    recorded = [str(s.to_json()) for s in spans.get_finished_spans()]
    assert recorded, "the requests made spans"
    async with submission.pool.acquire() as conn:
        tables = [
            str(row)
            for table in ("tokens", "outbox", "audit_log", "users")
            for row in await conn.fetch(f"SELECT * FROM {table}")
        ]
    for secret in [*secrets, "ty_wrong"]:
        assert not any(secret in text for text in recorded), "a token in a span"
        assert secret not in caplog.text, "a token in the log"
        assert not any(secret in text for text in tables), "a token stored in clear"
