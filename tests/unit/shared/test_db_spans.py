"""``shared.db_spans``: the spans of ``WithinTraceAsyncPG``'s per-query methods are the
stock asyncpg instrumentation's (name, kind, parent, attributes in order, status, events,
scope), in every semantic-conventions mode, for statements, cursors and prepared
statements, succeeding or failing; descriptions kept per connection never mix two
connections; no span outside a recording span or with instrumentation suppressed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation._semconv import _StabilityMode
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.asyncpg.version import __version__
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.db_spans import WithinTraceAsyncPG
from trainyard_platform.shared.telemetry import DirectTracerProvider

SCOPE = "opentelemetry.instrumentation.asyncpg"
SECRET = "s3cr3t-token-value"
MODES = [_StabilityMode.DEFAULT, _StabilityMode.DATABASE, _StabilityMode.DATABASE_DUP]


class Params(NamedTuple):
    user: str | None
    password: str
    database: str | None


class Connection:
    """What the instrumentation reads of an asyncpg connection."""

    def __init__(self, user: str | None, database: str | None, addr: object) -> None:
        self._params = Params(user, "password-never-read", database)
        self._addr = addr


class Statement:
    """What it reads of a cursor or a prepared statement."""

    def __init__(self, connection: Connection, query: str) -> None:
        self._connection = connection
        self._query = query
        self._args = (SECRET,)


class Boom(Exception):
    pass


def _instrumentor(
    cls: type[AsyncPGInstrumentor], provider: TracerProvider, mode: _StabilityMode
) -> Any:
    """An instrumentor as ``instrument()`` leaves it, without wrapping asyncpg (the class
    is a process-wide singleton; this one is not)."""
    made = object.__new__(cls)
    made.__init__()
    made._semconv_opt_in_mode = mode
    source = DirectTracerProvider(provider) if cls is WithinTraceAsyncPG else provider
    made._tracer = trace.get_tracer(SCOPE, __version__, source)
    return made


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _answer(*args: Any, **kwargs: Any) -> str:
    return "rows"


async def _fail(*args: Any, **kwargs: Any) -> str:
    raise Boom('relation "nope" does not exist')


async def _end_of_rows(*args: Any, **kwargs: Any) -> str:
    raise StopAsyncIteration


Call = Callable[[Any], Coroutine[Any, Any, Any]]

TCP = Connection("trainyard", "jobs", ("127.0.0.1", 5432))
SOCKET = Connection("postgres", "billing", "/run/postgresql/.s.PGSQL.5432")
BARE = Connection(None, None, None)

CASES: list[Any] = [
    pytest.param(
        lambda i: i._do_execute(_answer, TCP, ("INSERT INTO t VALUES ($1)", SECRET), {}),
        id="execute",
    ),
    pytest.param(
        lambda i: i._do_execute(_answer, SOCKET, ("/* a note */ SELECT $1", SECRET), {}),
        id="leading-comment-unix-socket",
    ),
    pytest.param(lambda i: i._do_execute(_answer, BARE, ("   ",), {}), id="blank-statement"),
    pytest.param(lambda i: i._do_execute(_answer, TCP, ("",), {}), id="empty-statement"),
    pytest.param(
        lambda i: i._do_execute(_fail, TCP, ("SELECT * FROM nope WHERE a = $1", SECRET), {}),
        id="failing-statement",
    ),
    pytest.param(
        lambda i: i._do_execute(_end_of_rows, TCP, ("SELECT 1",), {}),
        id="end-of-rows-is-an-error-but-for-a-cursor",
    ),
    pytest.param(
        lambda i: i._do_cursor_execute(_answer, Statement(TCP, "SELECT a FROM t"), (2,), {}),
        id="cursor",
    ),
    pytest.param(
        lambda i: i._do_cursor_execute(_end_of_rows, Statement(TCP, "SELECT a FROM t"), (), {}),
        id="cursor-end-of-rows",
    ),
    pytest.param(
        lambda i: i._do_cursor_execute(_fail, Statement(SOCKET, "SELECT a FROM nope"), (), {}),
        id="cursor-failing",
    ),
    pytest.param(
        lambda i: i._do_prepared_execute(
            _answer, Statement(TCP, "UPDATE t SET a = $1"), (SECRET,), {}
        ),
        id="prepared",
    ),
    pytest.param(
        lambda i: i._do_prepared_execute(_fail, Statement(BARE, "DELETE FROM t"), (), {}),
        id="prepared-failing",
    ),
    pytest.param(
        lambda i: i._do_prepared_execute(_answer, Statement(TCP, ""), (), {}),
        id="prepared-empty-statement",
    ),
]


def _shape(span: ReadableSpan) -> dict[str, Any]:
    """What the two must agree on (ids, times and the stack trace's frames differ)."""
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "kind": span.kind,
        "attributes": list((span.attributes or {}).items()),
        "status": (span.status.status_code, span.status.description),
        "events": [
            (e.name, {k: v for k, v in (e.attributes or {}).items() if k != "exception.stacktrace"})
            for e in span.events
        ],
        "scope": (scope.name, scope.version) if scope else None,
    }


async def _run(instrumentor: Any, call: Call, provider: TracerProvider) -> tuple[str, int]:
    """Make the call inside a recording span; what it returned or raised, and the span id
    of that parent."""
    with provider.get_tracer("test").start_as_current_span("request") as parent:
        try:
            outcome = repr(await call(instrumentor))
        except (Boom, StopAsyncIteration) as error:
            outcome = f"raised {type(error).__name__}"
    return outcome, parent.get_span_context().span_id


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("call", CASES)
async def test_spans_equal_the_stock_instrumentations(call: Call, mode: _StabilityMode) -> None:
    stock_provider, stock_spans = _provider()
    ours_provider, our_spans = _provider()
    stock = _instrumentor(AsyncPGInstrumentor, stock_provider, mode)
    ours = _instrumentor(WithinTraceAsyncPG, ours_provider, mode)
    for _ in range(2):  # the second time from the kept descriptions
        stock_spans.clear()
        our_spans.clear()
        stock_outcome, stock_parent = await _run(stock, call, stock_provider)
        our_outcome, our_parent = await _run(ours, call, ours_provider)
        assert our_outcome == stock_outcome
        (stock_span, _) = stock_spans.get_finished_spans()
        (our_span, _) = our_spans.get_finished_spans()
        assert _shape(our_span) == _shape(stock_span)
        assert our_span.parent is not None and our_span.parent.span_id == our_parent
        assert stock_span.parent is not None and stock_span.parent.span_id == stock_parent
        assert not any(SECRET in str(v) for v in (our_span.attributes or {}).values())


async def test_a_failing_statement_records_the_error() -> None:
    provider, spans = _provider()
    ours = _instrumentor(WithinTraceAsyncPG, provider, _StabilityMode.DATABASE_DUP)
    with provider.get_tracer("test").start_as_current_span("request"), pytest.raises(Boom):
        await ours._do_execute(_fail, TCP, ("SELECT * FROM nope",), {})
    (span, _) = spans.get_finished_spans()
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.status.description == 'Boom: relation "nope" does not exist'
    assert (span.attributes or {})["error.type"] == "Boom"
    (event,) = span.events
    assert event.name == "exception"
    assert str((event.attributes or {})["exception.type"]).endswith("Boom")


async def test_two_connections_keep_their_own_description() -> None:
    provider, spans = _provider()
    ours = _instrumentor(WithinTraceAsyncPG, provider, _StabilityMode.DEFAULT)
    one = Connection("ann", "jobs", ("10.0.0.1", 5432))
    other = Connection("bob", "billing", ("10.0.0.2", 6432))
    query = "SELECT 1"
    with provider.get_tracer("test").start_as_current_span("request"):
        for connection in (one, other, one, other):
            await ours._do_execute(_answer, connection, (query,), {})
    seen = [
        (a["db.user"], a["db.name"], a["net.peer.name"], a["net.peer.port"])
        for a in (s.attributes or {} for s in spans.get_finished_spans()[:-1])
    ]
    assert seen == [
        ("ann", "jobs", "10.0.0.1", 5432),
        ("bob", "billing", "10.0.0.2", 6432),
        ("ann", "jobs", "10.0.0.1", 5432),
        ("bob", "billing", "10.0.0.2", 6432),
    ]


@pytest.mark.parametrize("where", ["no-span", "not-recording", "suppressed"])
async def test_no_span_where_the_query_is_not_traced(where: str) -> None:
    provider, spans = _provider()
    ours = _instrumentor(WithinTraceAsyncPG, provider, _StabilityMode.DEFAULT)
    tracer = provider.get_tracer("test")

    async def query() -> Any:
        return await ours._do_execute(_answer, TCP, ("SELECT 1",), {})

    if where == "no-span":
        assert await query() == "rows"
    elif where == "not-recording":
        parent = trace.NonRecordingSpan(
            trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(0))
        )
        token = otel_context.attach(trace.set_span_in_context(parent))
        try:
            assert await query() == "rows"
        finally:
            otel_context.detach(token)
    else:
        with tracer.start_as_current_span("request"), suppress_instrumentation():
            assert await query() == "rows"
    assert [s.name for s in spans.get_finished_spans()] == (
        ["request"] if where == "suppressed" else []
    )


async def test_the_query_still_runs_in_its_own_task_context() -> None:
    """The span is current while the query runs and the context is restored after it, as
    with the library's ``with`` block."""
    provider, _ = _provider()
    ours = _instrumentor(WithinTraceAsyncPG, provider, _StabilityMode.DEFAULT)
    seen: list[str] = []

    async def look(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        seen.append(getattr(trace.get_current_span(), "name", "?"))

    with provider.get_tracer("test").start_as_current_span("request") as request:
        await ours._do_execute(look, TCP, ("SELECT 1",), {})
        assert trace.get_current_span() is request
    assert seen == ["SELECT"]
