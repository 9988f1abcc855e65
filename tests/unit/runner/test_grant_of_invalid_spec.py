"""A grant whose spec the shared model refuses (a NUL in its argv, from a producer other
than the submission API) reaches the runner as ``GrantOfInvalidSpec``: the job fails as its
own error, naming the field, where the grant was dead-lettered (or, before the model
refused such specs, spawned and failed as the node's fault)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from trainyard_platform.services.runner import handlers
from trainyard_platform.shared.events import Envelope, EventParseError
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    GrantOfInvalidSpec,
    JobSpec,
)
from trainyard_platform.shared.events.trust import SCHEDULER, misrouted_because

SPEC = JobSpec(
    name="n",
    team="t",
    user="u",
    gpus=1,
    gpu_flavor="cpu",
    seed=1,
    max_runtime_seconds=60,
    command=["python", "train.py"],
)
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def raw_grant(spec: dict[str, Any], **fields: Any) -> bytes:
    """A grant's bytes as a producer other than the scheduler's models could write them."""
    grant = AllocationGranted(
        allocation_id="alloc-1",
        job_id="job-1",
        node_id="node-a",
        gpu_indices=[0],
        epoch=3,
        attempt=2,
        granted_at=NOW,
        spec=SPEC,
    )
    event = json.loads(Envelope.wrap(grant, source=SCHEDULER, subject="node-a").to_json())
    event["data"]["spec"].update(spec)
    event["data"].update(fields)
    return json.dumps(event).encode()


def test_a_grant_whose_spec_holds_a_nul_is_read_with_the_reason() -> None:
    envelope = handlers.parse_event(raw_grant({"command": ["python", "train\x00.py"]}))
    grant = envelope.data
    assert isinstance(grant, GrantOfInvalidSpec)
    assert (grant.allocation_id, grant.job_id, grant.node_id) == ("alloc-1", "job-1", "node-a")
    assert (grant.epoch, grant.attempt, grant.gpu_indices) == (3, 2, [0])
    assert grant.problem == (
        "spec.command[1]: must not contain control characters "
        "(found U+0000; allowed: tab, newline and carriage return only)"
    )
    # Routed like a grant: by its node.
    assert misrouted_because(grant, "node-a") is None
    assert misrouted_because(grant, "node-b") is not None


def test_every_bad_field_of_the_spec_is_named() -> None:
    envelope = handlers.parse_event(raw_grant({"args": ["\x00"], "labels": {"k": "\x1b"}}))
    assert isinstance(envelope.data, GrantOfInvalidSpec)
    assert envelope.data.problem.startswith("spec.args[0]: must not contain")
    assert "; spec.labels.k: must not contain control characters (found U+001B" in (
        envelope.data.problem
    )


def test_a_valid_grant_is_a_grant() -> None:
    envelope = handlers.parse_event(raw_grant({}))
    assert isinstance(envelope.data, AllocationGranted)


@pytest.mark.parametrize(
    "raw",
    [
        raw_grant({"command": ["\x00"]}, epoch="three"),  # more than the spec is wrong
        raw_grant({}, node_id=None),
        b"not json",
    ],
)
def test_anything_else_unreadable_stays_unparseable(raw: bytes) -> None:
    with pytest.raises(EventParseError):
        handlers.parse_event(raw)
