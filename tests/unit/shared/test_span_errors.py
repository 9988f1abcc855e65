"""``shared.span_errors``: an error recorded on a span as the SDK records it, except that
PostgreSQL's and asyncpg's errors, anywhere in the chain, never bring the values they quote."""

from __future__ import annotations

import asyncpg
import pytest
from asyncpg.exceptions import _base as asyncpg_base
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.span_errors import record_error, safe_message, safe_stacktrace

SECRET = "tok_3f9a1c77e2"


def _unique_violation() -> asyncpg.PostgresError:
    return asyncpg.PostgresError.new(
        {
            "C": "23505",
            "M": 'duplicate key value violates unique constraint "tokens_value_key"',
            "D": f"Key (value)=({SECRET}) already exists.",
            "t": "tokens",
            "n": "tokens_value_key",
        }
    )


def _recorded(error: BaseException) -> ReadableSpan:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span(
        "work", record_exception=False, set_status_on_exception=False
    ) as span:
        record_error(span, error)
    (finished,) = exporter.get_finished_spans()
    return finished


def _texts(span: ReadableSpan) -> list[str]:
    return [span.status.description or ""] + [
        str(v) for e in span.events for v in (e.attributes or {}).values()
    ]


def _raised(
    make: type[BaseException] | BaseException, cause: BaseException | None
) -> BaseException:
    try:
        try:
            raise cause if cause is not None else RuntimeError("no cause")
        except BaseException as inner:
            raise (make if isinstance(make, BaseException) else make()) from inner
    except BaseException as outer:
        return outer


def test_a_postgres_error_is_recorded_without_its_message_or_detail() -> None:
    error = _raised(_unique_violation(), None)
    assert SECRET in str(error)  # what PostgreSQL says
    span = _recorded(error)
    assert not any(SECRET in t for t in _texts(span))
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.status.description == (
        "UniqueViolationError: SQLSTATE 23505 on table tokens, constraint tokens_value_key"
        " (message withheld)"
    )
    (event,) = span.events
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "asyncpg.exceptions.UniqueViolationError"
    assert "test_span_errors.py" in str(attributes["exception.stacktrace"])  # frames kept


def test_a_wrapper_of_a_postgres_error_withholds_it_in_the_chain() -> None:
    """A service error raised from a database error: the wrapper's own message stays, the
    stack trace shows the cause's SQLSTATE, not its text."""
    error = _raised(LookupError("job not stored"), _unique_violation())
    span = _recorded(error)
    assert not any(SECRET in t for t in _texts(span))
    assert span.status.description == "LookupError: job not stored"
    stack = safe_stacktrace(error)
    assert "SQLSTATE 23505" in stack
    assert "The above exception was the direct cause of the following exception" in stack
    assert stack.rstrip().endswith("LookupError: job not stored")


def test_asyncpg_client_side_encoding_error_is_withheld() -> None:
    error = asyncpg_base.DataError(f"invalid input for query argument $1: '{SECRET}' (bad)")
    assert SECRET not in safe_message(error)
    assert not any(SECRET in t for t in _texts(_recorded(_raised(error, None))))


@pytest.mark.parametrize("error", [ValueError("bad spec: gpus"), KeyError("flavor")])
def test_other_errors_are_recorded_as_the_sdk_records_them(error: Exception) -> None:
    raised = _raised(error, None)
    ours = _recorded(raised)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with pytest.raises(type(error)), provider.get_tracer("test").start_as_current_span("work"):
        raise raised
    (theirs,) = exporter.get_finished_spans()
    assert ours.status.description == theirs.status.description
    (our_event,) = ours.events
    (their_event,) = theirs.events
    assert (our_event.attributes or {})["exception.message"] == str(error)
    assert (their_event.attributes or {})["exception.message"] == str(error)


def test_a_group_of_errors_brings_none_of_its_members_values() -> None:
    """A ``TaskGroup`` (or anyio's) raises an ``ExceptionGroup``: the SDK's stack trace of it
    prints each member's message, a unique violation's detail included."""
    try:
        raise ExceptionGroup("unhandled errors in a TaskGroup", [_unique_violation()])
    except ExceptionGroup as group:
        wrapped = _raised(RuntimeError("submission failed"), group)
    span = _recorded(wrapped)
    texts = _texts(span)
    assert not [t for t in texts if SECRET in t]
    (event,) = span.events
    trace_text = str((event.attributes or {})["exception.stacktrace"])
    assert "UniqueViolationError: SQLSTATE 23505 on table tokens" in trace_text
    assert "ExceptionGroup: unhandled errors in a TaskGroup" in trace_text


def test_a_chain_that_loops_back_is_recorded_once_round() -> None:
    first, second = ValueError("a"), _unique_violation()
    first.__context__, second.__context__ = second, first
    span = _recorded(first)
    assert not [t for t in _texts(span) if SECRET in t]
