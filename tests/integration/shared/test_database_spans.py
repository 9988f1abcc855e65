"""Database spans (``shared.telemetry.instrument_database``) on a real PostgreSQL: a query
inside a trace is a client span under the current span, with the statement text but never
its parameters; a query outside any trace (a polling loop) makes no span at all."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.telemetry import instrument_database

pytestmark = pytest.mark.integration

DB_SCOPE = "opentelemetry.instrumentation.asyncpg"


@pytest.fixture
async def pool(database_url: str, spans: InMemorySpanExporter) -> AsyncIterator[asyncpg.Pool]:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    assert instrument_database(provider)
    async with open_pool(DatabaseSettings(url=database_url), "spans_test") as opened:
        await opened.execute("CREATE TABLE tokens (owner text PRIMARY KEY, value text NOT NULL)")
        yield opened


def _queries(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    return [
        s
        for s in spans.get_finished_spans()
        if s.instrumentation_scope is not None and s.instrumentation_scope.name == DB_SCOPE
    ]


async def test_a_query_in_a_trace_is_a_child_span_without_its_parameters(
    pool: asyncpg.Pool, spans: InMemorySpanExporter
) -> None:
    token = secrets.token_urlsafe(24)
    spans.clear()
    with trace.get_tracer("test").start_as_current_span("request") as request:
        await pool.execute("INSERT INTO tokens (owner, value) VALUES ($1, $2)", "ann", token)
        assert await pool.fetchval("SELECT value FROM tokens WHERE owner = $1", "ann") == token
    (insert, select) = _queries(spans)
    parent = request.get_span_context()
    for span, verb in ((insert, "INSERT"), (select, "SELECT")):
        assert span.name == verb
        assert span.kind == trace.SpanKind.CLIENT
        assert span.context is not None and span.context.trace_id == parent.trace_id
        assert span.parent is not None and span.parent.span_id == parent.span_id
        attributes = dict(span.attributes or {})
        assert attributes["db.system"] == "postgresql"
        assert str(attributes["db.statement"]).startswith(verb)
        assert "$1" in str(attributes["db.statement"])
        assert not any(token in str(v) for v in attributes.values()), attributes


async def test_a_query_outside_any_trace_makes_no_span(
    pool: asyncpg.Pool, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    assert trace.get_current_span() is trace.INVALID_SPAN
    await pool.fetch("SELECT owner FROM tokens")
    await pool.execute("INSERT INTO tokens (owner, value) VALUES ('bob', 'b')")
    assert _queries(spans) == []
    # The same pool still traces as soon as there is a trace again.
    with trace.get_tracer("test").start_as_current_span("request"):
        await pool.fetch("SELECT owner FROM tokens")
    assert [s.name for s in _queries(spans)] == ["SELECT"]
