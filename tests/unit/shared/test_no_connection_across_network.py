"""No pooled database connection is held across a wait on the network (a NATS publish or
request, an HTTP call, the object store): while it waits, up to a publish, request or
store timeout when the other side is slow or stalled, that connection is one fewer for
the service's requests and handlers, and a pool of a few starves. The outbox relay held
one through every publish (``shared/outbox.py``, fixed: it claims, gives the connection
back, publishes, then marks).

A static check of ``shared/`` and ``services/``: in every ``async with`` block that holds
a connection (``.acquire(`` or ``.transaction(``), no awaited call may go to the bus, an
HTTP client or the object store, directly or through a thread (``asyncio.to_thread``,
``run_in_executor``). Work that must do both takes the connection before or after the
wait, never around it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ("shared", "services")

NETWORK_OBJECTS = frozenset(
    {
        "bus",
        "_bus",
        "nats",
        "nc",
        "_nc",
        "js",
        "_js",
        "jetstream",
        "_jetstream",
        "http",
        "_http",
        "http_client",
        "client",
        "_client",
        "transport",
        "_transport",
        "objects",
        "_objects",
        "_store",
        "object_store",
        "admission",
    }
)
"""Names a service gives its NATS connection, HTTP clients and object store."""
NETWORK_CALLS = frozenset({"publish", "publish_many", "publish_raw", "_publish", "request"})
"""Methods that wait on the bus whatever their object is called."""
THREAD_HOPS = frozenset({"to_thread", "run_in_executor"})


def _parts(node: ast.expr) -> list[str]:
    """``self._bus.publish`` -> ["self", "_bus", "publish"]; [] for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return []


def _goes_out(call: ast.Call) -> bool:
    callee = _parts(call.func)
    if not callee:
        return False
    if callee[-1] in THREAD_HOPS:  # the work is the first callable argument
        return any(set(_parts(arg)[:-1]) & NETWORK_OBJECTS for arg in call.args if _parts(arg))
    return bool(set(callee[:-1]) & NETWORK_OBJECTS) or callee[-1] in NETWORK_CALLS


def _holds_a_connection(node: ast.AsyncWith) -> bool:
    return any(
        ".acquire(" in ast.unparse(item.context_expr)
        or ".transaction(" in ast.unparse(item.context_expr)
        for item in node.items
    )


def _network_waits_holding_a_connection() -> Iterator[str]:
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.AsyncWith) or not _holds_a_connection(node):
                    continue
                for inner in node.body:
                    for sub in ast.walk(inner):
                        if (
                            isinstance(sub, ast.Await)
                            and isinstance(sub.value, ast.Call)
                            and _goes_out(sub.value)
                        ):
                            where = path.relative_to(ROOT)
                            yield f"{where}:{sub.lineno}: {ast.unparse(sub.value)[:100]}"


def test_no_pooled_connection_is_held_across_a_network_wait() -> None:
    found = list(_network_waits_holding_a_connection())
    assert found == [], "a connection held across a wait on the network:\n" + "\n".join(found)


def test_the_check_sees_a_publish_holding_a_connection() -> None:
    """The check itself: the relay's old round, and an object store call on a thread."""
    held = ast.parse(
        "async def f(self):\n"
        "    async with self._pool.acquire() as conn, conn.transaction():\n"
        "        rows = await conn.fetch('SELECT 1')\n"
        "        published = await self._publish(rows)\n"
        "        await asyncio.to_thread(self._store.put_bytes, 'k', b'')\n"
        "        await models.record(conn, storage(), what)\n"
    )
    calls = [
        ast.unparse(n.value)
        for n in ast.walk(held)
        if isinstance(n, ast.Await) and isinstance(n.value, ast.Call) and _goes_out(n.value)
    ]
    assert calls == [
        "self._publish(rows)",
        "asyncio.to_thread(self._store.put_bytes, 'k', b'')",
    ]
