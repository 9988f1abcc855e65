"""Every exception an error stands for: itself, what it was raised from or during, and the
members of exception groups.

Contract: ``exception_chain(exc)`` yields ``exc`` first, then each exception reachable from
it through ``__cause__``, ``__context__`` (unless suppressed by ``raise ... from``) and
``BaseExceptionGroup.exceptions``, each once (a cycle ends there). Classifiers of faults
(``shared.bus.infrastructure_fault``, the runner's ``node_fault``) look along it, since
libraries wrap the error that matters (an ``OSError`` inside a client's own exception)."""

from __future__ import annotations

from collections.abc import Iterator


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it (see the module), each once."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        if current.__cause__ is not None:
            pending.append(current.__cause__)
        if current.__context__ is not None and not current.__suppress_context__:
            pending.append(current.__context__)
