"""The published event contract (docs/events/): the committed schemas and AsyncAPI document
are what the models generate, every event the services publish validates against its schema
and parses with the official CloudEvents SDK, and a schema changes within its version only by
adding optional fields.

Compatibility is checked against a frozen copy of each schema as first published
(``event_schemas_baseline/``), not against docs/events/ at HEAD: a baseline that moved with
every regeneration would accept any change once committed. A new event type adds its file to
the baseline when it is first published; a new version (``...v2``) gets a file of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cloudevents.core.formats.json import JSONFormat
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from tests.integration.test_forged_events import SAMPLES, sample
from trainyard_platform.shared.events import EVENT_TYPES, Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.envelope import DEFAULT_SCHEMA_BASE
from trainyard_platform.shared.events.payloads import JobMetrics, JobProgress, MetricPoint
from trainyard_platform.shared.events.schemas import (
    DOCS,
    ENVELOPE_SCHEMA,
    asyncapi_document,
    differences,
)
from trainyard_platform.shared.events.trust import ALLOWED_SOURCES, routing_key_of

BASELINE = Path(__file__).parent / "event_schemas_baseline"


def published() -> Iterator[Envelope[Payload]]:
    """One event of every type from every source allowed to say it, as ``Bus.publish``
    writes them, and events carrying NaN and infinities."""
    for kind in SAMPLES:
        payload = sample(kind, "0b6f1d6e-4c1e-4b55-9a43-6f7d0f0c7a10")
        for source in sorted(ALLOWED_SOURCES[kind.TYPE]):
            yield Envelope.wrap(payload, source=source, subject=routing_key_of(payload))
    now = datetime.now(UTC)
    odd = [float("nan"), float("inf"), float("-inf")]
    yield Envelope.wrap(
        JobMetrics(
            job_id="j",
            allocation_id="a",
            node_id="n",
            seq=0,
            points=[MetricPoint(key="loss", step=i, time=now, value=v) for i, v in enumerate(odd)],
        ),
        source="trainyard/runner",
        subject="n",
    )
    yield Envelope.wrap(
        JobProgress(
            job_id="j", allocation_id="a", step=1, metrics=dict(zip("abc", odd, strict=True))
        ),
        source="trainyard/runner",
        subject="j",
    )


def schema_of(event_type: str) -> dict[str, Any]:
    return json.loads((DOCS / f"{event_type}.json").read_text())


def test_the_committed_files_are_what_the_models_generate() -> None:
    """Run ``python -m trainyard_platform.shared.events.schemas --write`` after changing a payload model."""
    assert differences() == [], "run: python -m trainyard_platform.shared.events.schemas --write"


def test_every_schema_is_a_valid_2020_12_schema_named_by_its_dataschema() -> None:
    for event_type in EVENT_TYPES:
        schema = schema_of(event_type)
        Draft202012Validator.check_schema(schema)
        assert schema["$id"].endswith(f"/{event_type}.json")
        assert schema["title"] == event_type


@pytest.mark.parametrize("envelope", list(published()), ids=lambda e: f"{e.type}@{e.source}")
def test_every_published_event_validates_and_parses_with_the_cloudevents_sdk(
    envelope: Envelope[Payload],
) -> None:
    raw = envelope.to_json()

    def no_bare_constants(token: str) -> None:
        raise AssertionError(f"bare {token} is not JSON")

    wire = json.loads(raw, parse_constant=no_bare_constants)
    schema = schema_of(envelope.type)
    assert wire["dataschema"] == schema["$id"]
    checker = FormatChecker()
    Draft202012Validator(ENVELOPE_SCHEMA, format_checker=checker).validate(wire)
    Draft202012Validator(schema, format_checker=checker).validate(wire["data"])

    event = JSONFormat().read(None, raw)
    assert event.get_id() == envelope.id
    assert event.get_type() == envelope.type
    assert event.get_source() == envelope.source
    assert event.get_subject() == envelope.subject
    assert event.get_dataschema() == schema["$id"]
    assert event.get_data() == wire["data"]
    assert parse_envelope(raw).id == envelope.id


def test_every_type_is_published_by_the_sample_catalogue() -> None:
    assert {e.type for e in published()} == set(EVENT_TYPES)


def test_a_schema_rejects_data_that_breaks_it() -> None:
    """The schemas are not vacuous: a missing required field and a wrong type fail."""
    validator = Draft202012Validator(schema_of(JobProgress.TYPE))
    assert not validator.is_valid({"job_id": "j", "allocation_id": "a", "step": 1})
    assert not validator.is_valid(
        {"job_id": "j", "allocation_id": "a", "step": 1, "metrics": {"loss": "high"}}
    )
    assert validator.is_valid(
        {"job_id": "j", "allocation_id": "a", "step": 1, "metrics": {"loss": "NaN"}}
    )


# --- AsyncAPI ----------------------------------------------------------------------------


def test_the_asyncapi_document_parses_and_names_every_subject_and_schema() -> None:
    doc = yaml.safe_load((DOCS / "asyncapi.yaml").read_text())
    assert doc == json.loads(json.dumps(asyncapi_document()))
    assert doc["asyncapi"] == "3.0.0"
    assert "deduplicate by `id`" in doc["info"]["description"]
    assert "order only per `subject`" in doc["info"]["description"]
    addresses = {c["address"] for c in doc["channels"].values()}
    assert addresses == {f"{t}.{{routingKey}}" for t in EVENT_TYPES}
    for channel in doc["channels"].values():
        # Every reference resolves inside the document, or to a schema file beside it.
        (ref,) = [m["$ref"] for m in channel["messages"].values()]
        message = doc["components"]["messages"][ref.rsplit("/", 1)[1]]
        data_ref = message["payload"]["allOf"][1]["properties"]["data"]["$ref"]
        assert (DOCS / data_ref).is_file()
        assert data_ref == f"./{message['name']}.json"
        assert set(channel["parameters"]) == {"routingKey"}
    for operation in doc["operations"].values():
        assert operation["action"] == "receive"
        assert operation["channel"]["$ref"].removeprefix("#/channels/") in doc["channels"]


def test_every_published_event_is_its_asyncapi_message() -> None:
    """Each message's payload, its references resolved (the envelope in the document, the
    data's schema file beside it), accepts the events published with that type and no other."""
    doc = yaml.safe_load((DOCS / "asyncapi.yaml").read_text())
    here = f"{DEFAULT_SCHEMA_BASE}/asyncapi.yaml"
    registry: Registry[Any] = Registry().with_resources(
        [(here, DRAFT202012.create_resource(doc))]
        + [(schema_of(t)["$id"], DRAFT202012.create_resource(schema_of(t))) for t in EVENT_TYPES]
    )
    by_type = {m["name"]: key for key, m in doc["components"]["messages"].items()}
    events = list(published())
    for envelope in events:
        wire = json.loads(envelope.to_json())
        pointer = f"{here}#/components/messages/{by_type[envelope.type]}/payload"
        Draft202012Validator({"$ref": pointer}, registry=registry).validate(wire)
        other = next(e for e in events if e.type != envelope.type)
        wrong = {**wire, "type": other.type}
        assert not Draft202012Validator({"$ref": pointer}, registry=registry).is_valid(wrong)


# --- compatibility -----------------------------------------------------------------------


def incompatibilities(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How ``new`` breaks a consumer written against ``old`` within one version: a property
    removed, a property newly required, or a property's type changed (top level and every
    ``$defs`` object of the same name)."""
    problems: list[str] = []
    pairs = [("(root)", old, new)]
    for name, old_def in old.get("$defs", {}).items():
        new_def = new.get("$defs", {}).get(name)
        if new_def is None:
            problems.append(f"$defs.{name}: removed")
        else:
            pairs.append((name, old_def, new_def))
    for where, a, b in pairs:
        a_props, b_props = a.get("properties", {}), b.get("properties", {})
        for prop, spec in a_props.items():
            if prop not in b_props:
                problems.append(f"{where}.{prop}: removed")
            elif shape(spec) != shape(b_props[prop]):
                problems.append(f"{where}.{prop}: type changed")
        for prop in set(b.get("required", [])) - set(a.get("required", [])):
            problems.append(f"{where}.{prop}: newly required")
    return sorted(problems)


def shape(spec: Any) -> Any:
    """What a property's values may be, without titles, descriptions and defaults."""
    if isinstance(spec, dict):
        return {
            k: shape(v) for k, v in spec.items() if k not in ("title", "description", "default")
        }
    if isinstance(spec, list):
        return [shape(v) for v in spec]
    return spec


@pytest.mark.parametrize("path", sorted(BASELINE.glob("*.json")), ids=lambda p: p.stem)
def test_within_a_version_a_schema_only_gains_optional_fields(path: Path) -> None:
    event_type = path.stem
    assert event_type in EVENT_TYPES, f"{event_type} was published and is gone: keep it"
    assert incompatibilities(json.loads(path.read_text()), schema_of(event_type)) == []


def test_every_published_type_has_a_baseline() -> None:
    """A new type's first schema is frozen beside the others when it is published."""
    missing = sorted(set(EVENT_TYPES) - {p.stem for p in BASELINE.glob("*.json")})
    assert missing == [], f"copy docs/events/<type>.json into {BASELINE.name}/ for {missing}"


def test_the_compatibility_check_sees_each_kind_of_break() -> None:
    old = schema_of(JobProgress.TYPE)
    added = json.loads(json.dumps(old))
    added["properties"]["note"] = {"type": "string"}
    assert incompatibilities(old, added) == []
    broken = json.loads(json.dumps(old))
    del broken["properties"]["step"]
    broken["properties"]["job_id"] = {"type": "integer"}
    broken["required"].append("note")
    assert incompatibilities(old, broken) == [
        "(root).job_id: type changed",
        "(root).note: newly required",
        "(root).step: removed",
    ]
