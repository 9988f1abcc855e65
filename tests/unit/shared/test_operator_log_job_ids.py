"""A log line made while a service handles (or the runner reports) a job's event carries the
job id. The spans of events carry it only as the event's routing key, so no line of a real
stack had a ``job_id``: the docs promised one "when known"."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from trainyard_platform.shared.logs import JsonFormatter

_tracer = TracerProvider().get_tracer("test")
JOB = "1ab12276-8c03-4adc-b1c9-fd50448a013c"


def _line(attributes: dict[str, str]) -> dict[str, str]:
    record = logging.LogRecord("svc.mod", logging.INFO, __file__, 1, "handled", (), None)
    with _tracer.start_as_current_span("work", attributes=attributes):
        return dict(json.loads(JsonFormatter("submission").format(record)))


@pytest.mark.parametrize(
    "attributes",
    [
        # A consumer's process span (shared.bus), for an event routed by its job.
        {"cloudevents.event_type": "trainyard.job.started.v1", "cloudevents.event_subject": JOB},
        {"cloudevents.event_type": "trainyard.cost.recorded.v1", "cloudevents.event_subject": JOB},
        # The runner's report span.
        {"cloudevents.event_type": "trainyard.job.progress.v1", "trainyard.subject": JOB},
    ],
)
def test_the_routing_key_of_a_job_s_event_is_the_job_id(attributes: dict[str, str]) -> None:
    assert _line(attributes)["job_id"] == JOB


@pytest.mark.parametrize(
    ("event_type", "key"),
    [
        ("trainyard.allocation.granted.v1", "node-7"),
        ("trainyard.runner.heartbeat.v1", "node-7"),
        ("trainyard.job.metrics.v1", "node-7"),
        ("trainyard.flavor.declared.v1", "h200"),
        ("trainyard.budget.updated.v1", "vision"),
    ],
)
def test_a_node_flavor_or_team_routing_key_is_no_job_id(event_type: str, key: str) -> None:
    line = _line({"cloudevents.event_type": event_type, "cloudevents.event_subject": key})
    assert "job_id" not in line and "trace_id" in line
