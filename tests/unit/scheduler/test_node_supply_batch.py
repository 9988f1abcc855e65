"""The herald says a batch of nodes' supplies under the scheduling lock: the batch's events
are stored in one statement. Before, one ``INSERT`` a node: at 10,000 nodes (20 batches of
500) each batch held the lock for about 0.3 s on a loopback database, passes and the event
consumer waiting meanwhile."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from trainyard_platform.services.scheduler.node_supply import say_unsaid_since


class Recording:
    """A connection that answers the herald's pick with ``rows`` and records each statement."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.executed: list[tuple[str, tuple[Any, ...]]] = []

    async def fetch(self, query: str, *args: Any) -> list[dict[str, Any]]:
        return self.rows

    async def execute(self, query: str, *args: Any) -> str:
        self.executed.append((query, args))
        return "INSERT"

    def get_server_pid(self) -> int:
        return 1


async def test_a_batch_s_supplies_are_stored_in_one_statement() -> None:
    rows = [
        {"node_id": f"n{i}", "gpu_flavor": "a100", "gpu_count": 8, "supply_version": i}
        for i in range(1, 4)
    ]
    conn = Recording(rows)
    now = datetime(2026, 12, 7, tzinfo=UTC)
    said = await say_unsaid_since(conn, now, now, 500)  # type: ignore[arg-type]
    assert said == ["n1", "n2", "n3"]
    ((query, args),) = conn.executed
    assert query.startswith("INSERT INTO outbox")
    subjects, bodies = args[1], args[2]
    assert subjects == [f"trainyard.node.supplied.v1.n{i}" for i in range(1, 4)]
    assert [json.loads(b)["data"]["sequence"] for b in bodies] == [1, 2, 3]
