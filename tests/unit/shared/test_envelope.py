"""The CloudEvents envelope: round trip, deterministic ids, reasons for bad bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from trainyard_platform.shared.events import EVENT_TYPES, Envelope, EventParseError, parse_envelope
from trainyard_platform.shared.events.envelope import EventSchemaSettings, schema_uri
from trainyard_platform.shared.events.payloads import JobSpec, JobSubmitted

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
        "dataschema",
        "data",
    }
    assert (
        wire["dataschema"] == "https://trainyard.dev/schemas/events/trainyard.job.submitted.v1.json"
    )


def test_an_event_without_dataschema_parses_and_is_written_without_it() -> None:
    """Events stored before ``dataschema`` existed stay readable, and never gain a null."""
    env = Envelope.wrap(
        JobSubmitted(job_id="j", spec=SPEC, submitted_at=datetime.now(UTC)),
        source="trainyard/submission",
        subject="j",
    )
    old = json.loads(env.to_json())
    del old["dataschema"]
    parsed = parse_envelope(json.dumps(old).encode())
    assert parsed.dataschema is None
    assert "dataschema" not in json.loads(parsed.to_json())


def test_the_schema_base_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_EVENTS_SCHEMA_BASE", "https://events.example.org/v")
    assert EventSchemaSettings().schema_base == "https://events.example.org/v"
    assert (
        schema_uri("t.v1", "https://events.example.org/v")
        == "https://events.example.org/v/t.v1.json"
    )
    monkeypatch.setenv("TRAINYARD_EVENTS_SCHEMA_BASE", "not a uri/")
    with pytest.raises(ValueError, match="schema_base"):
        EventSchemaSettings()


def test_event_id_can_be_deterministic() -> None:
    payload = JobSubmitted(job_id="j", spec=SPEC, submitted_at=datetime.now(UTC))
    a = Envelope.wrap(payload, source="s", subject="j", event_id="fixed")
    assert a.id == "fixed"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"nope", "event: must be valid JSON"),
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
    from trainyard_platform.shared.events.payloads import JobProgress

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


def test_non_finite_floats_are_strings_on_the_wire() -> None:
    """Bare NaN is not JSON: a strict parser (json.loads refusing the constants, as Node's
    JSON.parse does) reads every event, and the strings come back as floats."""
    from trainyard_platform.shared.events.payloads import JobMetrics, MetricPoint

    def strict(token: str) -> None:
        raise AssertionError(f"bare {token} on the wire")

    now = datetime.now(UTC)
    points = [
        MetricPoint(key="loss", step=i, time=now, value=v)
        for i, v in enumerate([float("nan"), float("inf"), float("-inf"), 1.5])
    ]
    env = Envelope.wrap(
        JobMetrics(job_id="j", allocation_id="a", node_id="n", seq=0, points=points),
        source="s",
        subject="n",
    )
    wire = json.loads(env.to_json(), parse_constant=strict)
    assert [p["value"] for p in wire["data"]["points"]] == ["NaN", "Infinity", "-Infinity", 1.5]
    parsed = parse_envelope(env.to_json())
    assert isinstance(parsed.data, JobMetrics)
    values = [p.value for p in parsed.data.points]
    assert values[0] != values[0] and values[1:] == [float("inf"), float("-inf"), 1.5]
