"""Database spans (``shared.db_spans``, installed by ``shared.telemetry.instrument_database``)
on a real PostgreSQL are the stock asyncpg instrumentation's: each query made through the
installed wrapping is compared with the same query made through the library's own
per-query method (on the unwrapped asyncpg method): name, kind, parent, attributes in
order, status and events; a failing statement records the error; two connections to
different databases as different users each get their own attributes; no parameter
value appears."""

from __future__ import annotations

import functools
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from asyncpg.cursor import Cursor
from asyncpg.prepared_stmt import PreparedStatement
from opentelemetry import trace
from opentelemetry.instrumentation._semconv import (
    _OpenTelemetrySemanticConventionStability,
    _OpenTelemetryStabilitySignalType,
)
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.asyncpg.version import __version__
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.shared.db_spans import WithinTraceAsyncPG
from trainyard_platform.shared.telemetry import instrument_database, tracer

pytestmark = pytest.mark.integration

SCOPE = "opentelemetry.instrumentation.asyncpg"
TOKEN = secrets.token_urlsafe(24)


@pytest.fixture
def stock(spans: InMemorySpanExporter) -> Any:
    """Our instrumentation installed, and the library's own instrumentor beside it, not
    installed (its per-query methods are called on the unwrapped asyncpg methods)."""
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    assert instrument_database(provider)
    made = object.__new__(AsyncPGInstrumentor)  # the class is a process-wide singleton
    made.__init__()
    made._semconv_opt_in_mode = (
        _OpenTelemetrySemanticConventionStability._get_opentelemetry_stability_opt_in_mode(
            _OpenTelemetryStabilitySignalType.DATABASE
        )
    )
    made._tracer = trace.get_tracer(SCOPE, __version__, provider)
    return made


@pytest.fixture
async def conn(database_url: str, stock: Any) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    await connection.execute("CREATE TABLE tokens (owner text NOT NULL, value text NOT NULL)")
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def other(
    postgres_server: PostgresServer, conn: asyncpg.Connection
) -> AsyncIterator[asyncpg.Connection]:
    """A connection to another database as another user."""
    suffix = uuid.uuid4().hex[:12]
    database, role = f"spans_other_{suffix}", f"spans_user_{suffix}"
    dsn = postgres_server.create_database(database)
    await conn.execute(f"CREATE ROLE {role} LOGIN")
    connection = await asyncpg.connect(dsn, user=role)
    try:
        yield connection
    finally:
        await connection.close()
        postgres_server.drop_database(database)
        await conn.execute(f"DROP ROLE {role}")


def _original(cls: type, method: str, instance: object) -> Callable[..., Awaitable[Any]]:
    """``instance.method`` as asyncpg defines it, without the installed wrapping."""
    return functools.partial(vars(cls)[method].__wrapped__, instance)


async def _ours_and_stock(
    spans: InMemorySpanExporter,
    ours: Callable[[], Awaitable[Any]],
    theirs: Callable[[], Awaitable[Any]],
    *,
    same_result: bool = True,
) -> tuple[ReadableSpan, ReadableSpan, int]:
    """Run both in one recording span; their spans and the parent's span id (both return
    the same, or raise the same error)."""
    spans.clear()
    outcomes = []
    with trace.get_tracer("test").start_as_current_span("request") as request:
        for run in (ours, theirs):
            try:
                result = await run()
                outcomes.append(repr(result) if same_result else "returned")
            except asyncpg.PostgresError as error:
                outcomes.append(f"raised {type(error).__name__}")
    assert outcomes[0] == outcomes[1]
    (our_span, stock_span) = [
        s
        for s in spans.get_finished_spans()
        if s.instrumentation_scope is not None and s.instrumentation_scope.name == SCOPE
    ]
    return our_span, stock_span, request.get_span_context().span_id


_ERROR_TEXT = ("exception.stacktrace", "exception.message")


def _shape(span: ReadableSpan) -> dict[str, Any]:
    """What the two must agree on (ids, times and the stack trace's frames differ; so does
    a PostgreSQL error's text, which ours withholds: ``shared.span_errors``)."""
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "kind": span.kind,
        "attributes": list((span.attributes or {}).items()),
        "status": (span.status.status_code, (span.status.description or "").split(":")[0]),
        "events": [
            (e.name, {k: v for k, v in (e.attributes or {}).items() if k not in _ERROR_TEXT})
            for e in span.events
        ],
        "scope": (scope.name, scope.version) if scope else None,
    }


def _assert_same(our_span: ReadableSpan, stock_span: ReadableSpan, parent: int) -> None:
    assert _shape(our_span) == _shape(stock_span)
    assert our_span.parent is not None and our_span.parent.span_id == parent
    assert stock_span.parent is not None and stock_span.parent.span_id == parent
    assert not any(TOKEN in str(v) for v in (our_span.attributes or {}).values())


CALLS = [
    pytest.param("execute", ("INSERT INTO tokens (owner, value) VALUES ($1, $2)", "ann", TOKEN)),
    pytest.param(
        "executemany",
        ("INSERT INTO tokens (owner, value) VALUES ($1, $2)", [("cy", TOKEN), ("di", TOKEN)]),
    ),
    pytest.param("fetch", ("SELECT owner FROM tokens WHERE value = $1", TOKEN)),
    pytest.param("fetchrow", ("SELECT owner, value FROM tokens WHERE owner = $1", "ann")),
    pytest.param("fetchval", ("/* who */ SELECT count(*) FROM tokens WHERE value <> $1", TOKEN)),
    pytest.param("fetch", ("SELECT * FROM no_such_table WHERE a = $1", TOKEN), id="failing"),
]


@pytest.mark.parametrize(("method", "args"), CALLS)
async def test_a_statements_span_is_the_stock_instrumentations(
    conn: asyncpg.Connection,
    stock: Any,
    spans: InMemorySpanExporter,
    method: str,
    args: tuple[Any, ...],
) -> None:
    cls = asyncpg.connection.Connection
    for _ in range(2):  # the second time from the kept descriptions
        await conn.execute("DELETE FROM tokens")
        our_span, stock_span, parent = await _ours_and_stock(
            spans,
            lambda: getattr(conn, method)(*args),
            lambda: stock._do_execute(_original(cls, method, conn), conn, args, {}),
        )
        _assert_same(our_span, stock_span, parent)
        assert our_span.name == args[0].split("*/")[-1].split()[0]


async def test_a_failing_statement_records_the_error(
    conn: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    request = trace.get_tracer("test").start_as_current_span("request")
    with request, pytest.raises(asyncpg.UndefinedTableError):
        await conn.fetch("SELECT * FROM no_such_table")
    (span, _) = spans.get_finished_spans()
    assert span.name == "SELECT"
    assert span.status.status_code == trace.StatusCode.ERROR
    assert (span.status.description or "").startswith("UndefinedTableError: ")
    assert [e.name for e in span.events] == ["exception"]


async def test_a_statements_error_never_carries_the_values_it_quotes(
    conn: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    """PostgreSQL quotes the offending value in a unique violation's detail and in an
    invalid input's message; neither reaches the span (status, event, stack trace) nor the
    request's span the error escapes through."""
    await conn.execute("DELETE FROM tokens")
    await conn.execute("ALTER TABLE tokens ADD CONSTRAINT tokens_value_key UNIQUE (value)")
    await conn.execute("INSERT INTO tokens VALUES ('ann', $1)", TOKEN)
    for statement, args, error in (
        ("INSERT INTO tokens VALUES ('bob', $1)", (TOKEN,), asyncpg.UniqueViolationError),
        ("SELECT $1::text::uuid", (TOKEN,), asyncpg.InvalidTextRepresentationError),
    ):
        spans.clear()
        # Through a service's span (outermost: the error escapes it), as a handler's.
        with pytest.raises(error) as raised, tracer("test").start_as_current_span("request"):
            await conn.execute(statement, *args)
        assert TOKEN in str(raised.value)  # PostgreSQL did quote it
        finished = spans.get_finished_spans()
        assert [s.name for s in finished] == [statement.split()[0], "request"]
        for span in finished:
            texts = [span.status.description or ""] + [
                str(v) for e in span.events for v in (e.attributes or {}).values()
            ]
            assert span.status.description is not None
            assert "message withheld" in span.status.description
            assert not any(TOKEN in t for t in texts), span.name
            assert any(f"SQLSTATE {raised.value.sqlstate}" in t for t in texts)


async def test_prepared_statements_and_cursors_make_the_stock_spans(
    conn: asyncpg.Connection, stock: Any, spans: InMemorySpanExporter
) -> None:
    await conn.execute("INSERT INTO tokens VALUES ('ann', $1), ('bob', $1)", TOKEN)
    statement = await conn.prepare("SELECT owner FROM tokens WHERE value = $1 ORDER BY owner")
    our_span, stock_span, parent = await _ours_and_stock(
        spans,
        lambda: statement.fetch(TOKEN),
        lambda: stock._do_prepared_execute(
            _original(PreparedStatement, "fetch", statement), statement, (TOKEN,), {}
        ),
    )
    _assert_same(our_span, stock_span, parent)
    async with conn.transaction():
        cursor = await conn.cursor("SELECT owner FROM tokens WHERE value = $1", TOKEN)
        our_span, stock_span, parent = await _ours_and_stock(
            spans,
            lambda: cursor.fetch(1),
            lambda: stock._do_cursor_execute(_original(Cursor, "fetch", cursor), cursor, (1,), {}),
            same_result=False,  # the cursor moves on
        )
    _assert_same(our_span, stock_span, parent)
    assert our_span.name == "CURSOR: SELECT"


async def test_two_connections_each_get_their_own_attributes(
    conn: asyncpg.Connection, other: asyncpg.Connection, stock: Any, spans: InMemorySpanExporter
) -> None:
    query = "SELECT current_user, current_database()"
    cls = asyncpg.connection.Connection
    for connection in (conn, other, conn, other):
        user, database = await connection.fetchrow(query)
        our_span, stock_span, parent = await _ours_and_stock(
            spans,
            lambda c=connection: c.fetchrow(query),
            lambda c=connection: stock._do_execute(_original(cls, "fetchrow", c), c, (query,), {}),
        )
        _assert_same(our_span, stock_span, parent)
        attributes = our_span.attributes or {}
        assert (attributes["db.user"], attributes["db.name"]) == (user, database)
    assert (await conn.fetchval("SELECT current_user")) != (
        await other.fetchval("SELECT current_user")
    )
    # Each described once, and kept: the installed instrumentor's descriptions.
    installed = WithinTraceAsyncPG._instance
    assert isinstance(installed, WithinTraceAsyncPG)
    assert conn in installed._connections and other in installed._connections
