"""A runner's heartbeat is bounded on the wire, whoever sent it: a node taken over said it had
2**31 - 1 GPUs and the scheduler accepted it, then built a list of every one of its GPU
indices in each pass (``packing.NodeSlot``, ``first_fit._free``) and for ``GET /v1/nodes``,
which no scheduler survives. Every consumer (scheduler, billing) parses it with the payload
model, so an out-of-bounds heartbeat is dead-lettered naming the field, never applied."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from trainyard_platform.shared.events import EventParseError, parse_envelope
from trainyard_platform.shared.events.payloads import MAX_NODE_GPUS, RunnerHeartbeat

BASE: dict[str, Any] = {
    "node_id": "node-1",
    "hostname": "gpu-host-1",
    "gpu_flavor": "h100",
    "gpu_count": 8,
    "gpu_names": ["NVIDIA H100 80GB HBM3"] * 8,
    "running_allocations": [],
    "sent_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
    "topology": "rack-1",
    "address": "10.0.0.7",
}


def wire(**fields: Any) -> bytes:
    """A heartbeat of node-1 as it comes on the bus, ``fields`` changed in its payload."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": "beat-1",
            "source": "trainyard/runner",
            "type": RunnerHeartbeat.TYPE,
            "time": BASE["sent_at"],
            "subject": "node-1",
            "datacontenttype": "application/json",
            "data": BASE | fields,
        }
    ).encode()


def test_a_real_nodes_heartbeat_parses() -> None:
    beat = parse_envelope(wire()).data
    assert isinstance(beat, RunnerHeartbeat)
    assert beat.gpu_count == 8
    largest = parse_envelope(wire(gpu_count=MAX_NODE_GPUS, gpu_names=["g"] * MAX_NODE_GPUS)).data
    assert isinstance(largest, RunnerHeartbeat)
    assert largest.gpu_count == MAX_NODE_GPUS


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"gpu_count": 2**31 - 1}, "data.gpu_count"),
        ({"gpu_count": MAX_NODE_GPUS + 1}, "data.gpu_count"),
        ({"gpu_count": -1}, "data.gpu_count"),
        ({"gpu_names": ["g"] * (MAX_NODE_GPUS + 1)}, "data.gpu_names"),
        ({"gpu_names": ["x" * 201]}, "data.gpu_names[0]"),
        ({"running_allocations": ["a"] * 1001}, "data.running_allocations"),
        ({"running_allocations": ["a" * 101]}, "data.running_allocations[0]"),
        ({"hostname": "h" * 254}, "data.hostname"),
        ({"hostname": "host\x1b[2J"}, "data.hostname"),
        ({"gpu_flavor": "f" * 101}, "data.gpu_flavor"),
        ({"gpu_flavor": ""}, "data.gpu_flavor"),
        ({"topology": "t" * 101}, "data.topology"),
        ({"address": "a" * 254}, "data.address"),
        ({"address": "10.0.0.7\n"}, "data.address"),
    ],
)
def test_a_heartbeat_out_of_bounds_is_refused_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(EventParseError) as refused:
        parse_envelope(wire(**fields))
    assert str(refused.value).startswith(f"{field}: ")
