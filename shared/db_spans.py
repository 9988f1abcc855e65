"""Database spans: the asyncpg instrumentation's spans, each statement and connection
described once instead of on every query.

Contract: ``WithinTraceAsyncPG`` is ``opentelemetry-instrumentation-asyncpg``'s
instrumentor (it wraps the same asyncpg methods: ``Connection.execute``/``executemany``/
``fetch``/``fetchval``/``fetchrow``, the cursor's and the prepared statement's), and each
query inside a recording span makes the span the library's own per-query methods make: the
same name (the statement's first word, leading ``/* comment */`` removed; ``CURSOR: ``
before it for a cursor), kind ``CLIENT``, parent (the current span), attributes and values
(``db.system``, ``db.name``, ``db.user``, the peer and transport, the statement text as
given: placeholders ``$1``..., never the parameter values) in the same order, and a failing
statement records the error as the library's span does (the ``exception`` event, the ERROR
status ``Type: message``, ``error.type`` where the database semantic conventions opted in
ask for it), except that PostgreSQL's message and detail, which quote values, are withheld
(``shared.span_errors``). Two more differences, both the module's reason to exist:

- A query made outside any recording span (a background loop polling its table) makes no
  span and pays nothing: the asyncpg call itself is returned, not wrapped in a coroutine.
- The library describes the connection (database, user, peer) and the statement (its span
  name and statement attributes, a regular expression over the text) again for every
  query. Here a connection is described once (kept per connection object, weakly: a closed
  connection's entry goes with it, and two connections never share one) and a statement
  once per text (the last ``STATEMENTS`` texts kept). Queries the fast path does not cover
  (parameters captured, a statement that is not a non-empty string) go through the
  library's own method unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Mapping
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.instrumentation._semconv import (
    _report_new,
    _set_db_statement,
    _StabilityMode,
)
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor, _hydrate_span_from_args
from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY_PLAIN
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import SpanKind

from trainyard_platform.shared.span_errors import record_error

STATEMENTS = 1024
"""How many statement texts keep their description (least recently used dropped first)."""

_CLIENT = SpanKind.CLIENT
_Described = Mapping[str, Any]


class WithinTraceAsyncPG(AsyncPGInstrumentor):
    """The asyncpg instrumentation, making its spans only inside a recording span and from
    descriptions computed once (see the module)."""

    def __init__(self, capture_parameters: bool = False) -> None:
        super().__init__(capture_parameters)  # type: ignore[no-untyped-call]
        # What each connection's description is, per connection object (weak keys:
        # asyncpg's ``Connection`` has ``__weakref__``; its ``_params`` and ``_addr`` never
        # change).
        self._connections: weakref.WeakKeyDictionary[Any, _Described] = weakref.WeakKeyDictionary()

    def _instrument(self, **kwargs: Any) -> None:
        super()._instrument(**kwargs)  # type: ignore[no-untyped-call]
        # Descriptions follow the semantic conventions' mode read now: none from before.
        self._connections = weakref.WeakKeyDictionary()

    def _do_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        ctx = otel_context.get_current()
        if not _traced_here(ctx):
            return func(*args, **kwargs)
        query = args[0] if args else None
        if self.capture_parameters or not query or not isinstance(query, str):
            return super()._do_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]
        name, attributes = self._describe(instance, query)
        return self._span(func, args, kwargs, ctx, name, attributes, cursor=False)

    def _do_cursor_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        ctx = otel_context.get_current()
        if not _traced_here(ctx):
            return func(*args, **kwargs)
        query = instance._query
        if self.capture_parameters or not query or not isinstance(query, str):
            return super()._do_cursor_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]
        name, attributes = self._describe(instance._connection, query)
        return self._span(func, args, kwargs, ctx, f"CURSOR: {name}", attributes, cursor=True)

    def _do_prepared_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        ctx = otel_context.get_current()
        if not _traced_here(ctx):
            return func(*args, **kwargs)
        query = instance._query
        if self.capture_parameters or not query or not isinstance(query, str):
            return super()._do_prepared_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]
        name, attributes = self._describe(instance._connection, query)
        return self._span(func, args, kwargs, ctx, name, attributes, cursor=False)

    def _describe(self, connection: Any, query: str) -> tuple[str, dict[str, Any]]:
        """The span's name and attributes: the connection's, then the statement's (the
        library's order)."""
        mode: _StabilityMode = self._semconv_opt_in_mode
        try:
            described = self._connections.get(connection)
        except TypeError:  # not weakly referenceable: described every time
            described = None
        if described is None:
            described = _hydrate_span_from_args(connection, None, None, mode)
            with contextlib.suppress(TypeError):
                self._connections[connection] = described
        name, statement = _statement(query, mode)
        return name, {**described, **statement}

    async def _span(
        self,
        func: Any,
        args: Any,
        kwargs: Any,
        ctx: otel_context.Context,
        name: str,
        attributes: dict[str, Any],
        *,
        cursor: bool,
    ) -> Any:
        """Run the query in a current ``CLIENT`` span, as the library's ``with
        start_as_current_span`` block does (a cursor's end of rows is no error)."""
        span = cast(trace.Tracer, self._tracer).start_span(name, ctx, _CLIENT, attributes)
        token = otel_context.attach(trace.set_span_in_context(span, ctx))
        try:
            return await func(*args, **kwargs)
        except Exception as error:
            if not (cursor and isinstance(error, StopAsyncIteration)) and span.is_recording():
                if _report_new(self._semconv_opt_in_mode):
                    span.set_attribute(ERROR_TYPE, type(error).__qualname__)
                record_error(span, error)
            raise
        finally:
            otel_context.detach(token)
            span.end()


def _traced_here(ctx: otel_context.Context) -> bool:
    """Whether a query made now gets a span: inside a recording span, instrumentation not
    suppressed (the library's own check)."""
    return (
        trace.get_current_span(ctx).is_recording()
        and not ctx.get(_SUPPRESS_INSTRUMENTATION_KEY)
        and not ctx.get(_SUPPRESS_INSTRUMENTATION_KEY_PLAIN)
    )


@functools.lru_cache(maxsize=STATEMENTS)
def _statement(query: str, mode: _StabilityMode) -> tuple[str, _Described]:
    """A statement's span name and attributes, as the library derives them (never to be
    changed by a caller: shared by every query with this text)."""
    try:
        name = AsyncPGInstrumentor._leading_comment_remover.sub("", query).split()[0]
    except IndexError:
        name = ""
    attributes: dict[str, Any] = {}
    _set_db_statement(attributes, query, mode)
    return name, attributes
