"""How an error is recorded on a span: as OpenTelemetry's ``record_exception`` and ERROR
status do, without the values a database error quotes.

Spans leave the process for trace backends an operator may share more widely than the
services' own logs, and a statement's parameter values are never recorded on them. But
PostgreSQL's errors quote the values they stumbled on: a unique violation's detail (``Key
(id)=(...) already exists``), an invalid input's message (``invalid input syntax for type
uuid: "..."``), and asyncpg's client-side ``DataError`` the argument it could not encode.

Contract of ``record_error(span, error)``:
- an ``exception`` event and the ERROR status, as the SDK records them (type, message,
  stack trace, ``Type: message`` as the status), except that
- an error from PostgreSQL or asyncpg's argument encoding, wherever it is in the chain
  (``__cause__``/``__context__``: a wrapper's stack trace shows its cause) or in the chain
  of a member of an exception group there (a ``TaskGroup``'s), is described by
  ``safe_message``: its SQLSTATE, condition and the schema objects it names (table, column,
  constraint), never its message or detail. The service's log keeps the whole text.
"""

from __future__ import annotations

import traceback

import asyncpg
from asyncpg.exceptions import _base as asyncpg_base
from opentelemetry import trace

_QUOTING: tuple[type[BaseException], ...] = (asyncpg.PostgresError, asyncpg_base.DataError)
"""Errors whose text can quote a statement's data."""


def quotes_data(error: BaseException) -> bool:
    return isinstance(error, _QUOTING)


def safe_message(error: BaseException) -> str:
    """``str(error)``, or for an error that can quote data (module docstring) what it is
    without any value: SQLSTATE and the table, column and constraint it names."""
    if not quotes_data(error):
        return str(error)
    if not isinstance(error, asyncpg.PostgresError):
        return "invalid input for a query argument (value withheld)"
    named = [
        f"{what} {name}"
        for what, name in (
            ("table", getattr(error, "table_name", None)),
            ("column", getattr(error, "column_name", None)),
            ("constraint", getattr(error, "constraint_name", None)),
        )
        if name
    ]
    where = f" on {', '.join(named)}" if named else ""
    return f"SQLSTATE {error.sqlstate or 'unknown'}{where} (message withheld)"


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from, oldest first, as Python prints."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return chain[::-1]


def safe_stacktrace(error: BaseException) -> str:
    """The stack trace Python prints for ``error`` (its chain included, and each member of
    an exception group in it, indented), each error's line made by ``safe_message``."""
    return _safe_stacktrace(error, set())


def _safe_stacktrace(error: BaseException, shown: set[int]) -> str:
    """``safe_stacktrace``; ``shown``: the groups whose members are printed already (a
    group that holds itself, however deep, is printed once)."""
    parts: list[str] = []
    for older, newer in zip(_chain(error), [*_chain(error)[1:], None], strict=True):
        if older.__traceback__ is not None:  # never raised: Python prints no trace either
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(older.__traceback__))
        kind = type(older)
        name = kind.__qualname__
        if kind.__module__ not in ("builtins", "__main__"):
            name = f"{kind.__module__}.{name}"
        message = safe_message(older)
        parts.append(f"{name}: {message}\n" if message else f"{name}\n")
        if isinstance(older, BaseExceptionGroup) and id(older) not in shown:
            shown.add(id(older))
            for number, member in enumerate(older.exceptions, 1):
                parts.append(f"  +---------------- {number} ----------------\n")
                text = _safe_stacktrace(member, shown)
                parts.extend(f"    | {line}\n" for line in text.splitlines())
        if newer is not None:
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if newer.__cause__ is older
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
    return "".join(parts)


def _quoting_in_chain(error: BaseException, looked: set[int] | None = None) -> bool:
    """Whether an error that can quote data is in ``error``'s chain, or in the chain of a
    member of an exception group there (whose stack trace prints its members')."""
    looked = set() if looked is None else looked
    for each in _chain(error):
        if quotes_data(each):
            return True
        if isinstance(each, BaseExceptionGroup) and id(each) not in looked:
            looked.add(id(each))
            if any(_quoting_in_chain(member, looked) for member in each.exceptions):
                return True
    return False


def record_error(
    span: trace.Span, error: BaseException, *, record: bool = True, set_status: bool = True
) -> None:
    """Record ``error`` on ``span`` (module contract): the ``exception`` event when
    ``record``, the ERROR status when ``set_status``."""
    if not _quoting_in_chain(error):
        if record:
            span.record_exception(error)
        if set_status:
            span.set_status(
                trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
            )
        return
    message = safe_message(error)
    if record:
        span.record_exception(
            error,
            attributes={
                "exception.message": message,
                "exception.stacktrace": safe_stacktrace(error),
            },
        )
    if set_status:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {message}"))
