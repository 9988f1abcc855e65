"""A line logged while a consumer handles an event about one job carries that job's id, also
when the event is routed by its node: a grant, a revocation, a batch of a job's metrics.
Their spans name the node (the routing key), so the registry's, the billing's and the
runner's consumers logged such lines, and the bus's own, without a ``job_id``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import pytest

from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationRevoked,
    JobMetrics,
    MetricPoint,
)
from trainyard_platform.shared.logs import JsonFormatter

JOB = "1ab12276-8c03-4adc-b1c9-fd50448a013c"
NOW = datetime(2026, 12, 6, tzinfo=UTC)


def _line() -> dict[str, Any]:
    record = logging.LogRecord("svc.mod", logging.INFO, __file__, 1, "handled", (), None)
    return dict(json.loads(JsonFormatter("registry").format(record)))


EVENTS: list[Payload] = [
    AllocationRevoked(allocation_id="a", job_id=JOB, node_id="node-7", epoch=1, reason="cancelled"),
    JobMetrics(
        job_id=JOB,
        allocation_id="a",
        node_id="node-7",
        seq=0,
        points=[MetricPoint(key="loss", step=1, time=NOW, value=0.5)],
    ),
]
HANDLING: dict[str, Callable[[Delivery], AbstractContextManager[Any]]] = {
    "in its span": lambda delivery: delivery.span("consumer"),
    "continued (a batch)": lambda delivery: delivery.continued(),
}


@pytest.mark.parametrize("payload", EVENTS, ids=lambda p: p.TYPE)
@pytest.mark.parametrize("handling", list(HANDLING))
def test_a_node_routed_event_about_a_job_names_the_job(payload: Payload, handling: str) -> None:
    delivery = Delivery(Envelope.wrap(payload, source="trainyard/runner", subject="node-7"))
    with HANDLING[handling](delivery):
        assert _line().get("job_id") == JOB
    assert "job_id" not in _line()
