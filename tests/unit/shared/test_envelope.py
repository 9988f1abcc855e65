"""The CloudEvents envelope: round trip, deterministic ids, reasons for bad bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from shared.events import EVENT_TYPES, Envelope, EventParseError, parse_envelope
from shared.events.payloads import JobSpec, JobSubmitted

SPEC = JobSpec(
    name="n",
    team="t",
    user="u",
    entrypoint="examples.digits_cnn",
    gpus=1,
    gpu_flavor="cpu",
    seed=1,
    max_runtime_seconds=60,
)


def test_round_trip_keeps_the_typed_payload() -> None:
    env = Envelope.wrap(
        JobSubmitted(job_id="j", spec=SPEC, submitted_at=datetime.now(UTC)),
        source="trainyard/submission",
        subject="j",
    )
    parsed = parse_envelope(env.to_json())
    assert parsed == env
    assert isinstance(parsed.data, JobSubmitted)
    assert parsed.nats_subject == "trainyard.job.submitted.v1.j"
    wire = json.loads(env.to_json())
    assert set(wire) == {
        "specversion",
        "id",
        "source",
        "type",
        "time",
        "subject",
        "datacontenttype",
        "data",
    }


def test_event_id_can_be_deterministic() -> None:
    payload = JobSubmitted(job_id="j", spec=SPEC, submitted_at=datetime.now(UTC))
    a = Envelope.wrap(payload, source="s", subject="j", event_id="fixed")
    assert a.id == "fixed"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"nope", "Invalid JSON"),
        (b'{"specversion": "1.0", "id": "1", "subject": "j"}', "type"),
        (
            b'{"specversion": "1.0", "id": "1", "subject": "j", "type": "x.v9"}',
            "unknown event type",
        ),
    ],
)
def test_bad_bytes_name_the_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(EventParseError, match=reason):
        parse_envelope(raw)


def test_bad_payload_names_the_field() -> None:
    env = Envelope.wrap(
        JobSubmitted(job_id="j", spec=SPEC, submitted_at=datetime.now(UTC)), source="s", subject="j"
    )
    wire = json.loads(env.to_json())
    wire["data"]["spec"]["gpus"] = "many"
    with pytest.raises(EventParseError, match=r"data\.spec\.gpus"):
        parse_envelope(json.dumps(wire).encode())


def test_every_type_is_versioned() -> None:
    assert all(
        t.startswith("trainyard.") and t.rsplit(".", 1)[1].startswith("v") for t in EVENT_TYPES
    )


def test_non_finite_metrics_survive_the_wire() -> None:
    from shared.events.payloads import JobProgress

    env = Envelope.wrap(
        JobProgress(
            job_id="j", allocation_id="a", step=3, metrics={"loss": float("nan"), "x": float("inf")}
        ),
        source="s",
        subject="j",
    )
    parsed = parse_envelope(env.to_json())
    assert isinstance(parsed.data, JobProgress)
    loss = parsed.data.metrics["loss"]
    assert loss != loss and parsed.data.metrics["x"] == float("inf")
