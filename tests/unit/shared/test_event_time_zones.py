"""Every point in time of every event payload carries a time zone (``payloads.Instant``): a
timestamp without one is refused on the wire and in code, the error naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.integration.test_forged_events import SAMPLES, sample
from trainyard_platform.shared.events import Envelope, EventParseError, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import GrantOfInvalidSpec, JobPending
from trainyard_platform.shared.events.trust import ALLOWED_SOURCES, routing_key_of
from trainyard_platform.shared.http_errors import field_path

JOB = "0b6f1d6e-4c1e-4b55-9a43-6f7d0f0c7a10"
Path = tuple[str | int, ...]


def _time_fields(schema: dict[str, Any], defs: dict[str, Any], at: Path = ()) -> Iterator[Path]:
    """Every path of ``schema`` that holds a point in time (``format: date-time``); an item
    of a list is named by index 0."""
    if "$ref" in schema:
        yield from _time_fields(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, at)
        return
    if schema.get("format") == "date-time":
        yield at
    for choice in (*schema.get("anyOf", ()), *schema.get("allOf", ())):
        yield from _time_fields(choice, defs, at)
    for name, field in schema.get("properties", {}).items():
        yield from _time_fields(field, defs, (*at, name))
    if isinstance(schema.get("items"), dict):
        yield from _time_fields(schema["items"], defs, (*at, 0))


def time_fields(kind: type[Payload]) -> list[Path]:
    schema = kind.model_json_schema()
    return sorted(set(_time_fields(schema, schema.get("$defs", {}))), key=str)


def _set(data: dict[str, Any], path: Path, value: str) -> None:
    node: Any = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


def naive_cases() -> Iterator[tuple[type[Payload], Path]]:
    for kind in (*SAMPLES, GrantOfInvalidSpec):
        for path in time_fields(kind):
            yield kind, path


def _sample_data(kind: type[Payload]) -> dict[str, Any]:
    if kind is GrantOfInvalidSpec:
        from trainyard_platform.shared.events.payloads import AllocationGranted

        data = json.loads(sample(AllocationGranted, JOB).model_dump_json())
        data.pop("spec")
        return data
    data = json.loads(sample(kind, JOB).model_dump_json())
    if kind is JobPending:
        data["estimated_start"] = "2026-12-01T10:00:00Z"  # optional: None in the sample
    return data


def test_every_payload_type_has_its_times_found() -> None:
    """The cases below cover every type; a type with a time field none found would pass
    silently (the catalogue's samples say what each type holds)."""
    found = {kind for kind, _ in naive_cases()}
    assert found >= {
        kind for kind in SAMPLES if "date-time" in json.dumps(kind.model_json_schema())
    }
    assert ("time",) not in time_fields(JobPending)  # paths are the payload's own
    assert ("estimated_start",) in time_fields(JobPending)


@pytest.mark.parametrize(
    ("kind", "path"), list(naive_cases()), ids=lambda v: getattr(v, "__name__", None) or str(v)
)
def test_a_time_without_a_time_zone_is_refused_naming_the_field(
    kind: type[Payload], path: Path
) -> None:
    data = _sample_data(kind)
    _set(data, path, "2026-12-01T10:00:00")
    with pytest.raises(ValueError, match="must carry a time zone") as refused:
        kind.model_validate(data)
    assert f"\n{'.'.join(str(p) for p in path)}\n" in str(refused.value)
    # An offset other than UTC is a time zone: kept as given.
    _set(data, path, "2026-12-01T10:00:00+05:30")
    assert kind.model_validate(data)


@pytest.mark.parametrize("kind", [k for k in SAMPLES if time_fields(k)], ids=lambda k: k.__name__)
def test_on_the_wire_the_reason_names_the_field(kind: type[Payload]) -> None:
    paths = time_fields(kind)
    payload = sample(kind, JOB)
    source = sorted(ALLOWED_SOURCES[kind.TYPE])[0]
    wire = json.loads(
        Envelope.wrap(payload, source=source, subject=routing_key_of(payload)).to_json()
    )
    data = _sample_data(kind)
    _set(data, paths[0], "2026-12-01T10:00:00")
    wire["data"] = data
    with pytest.raises(EventParseError) as refused:
        parse_envelope(json.dumps(wire).encode())
    field = field_path(("data", *paths[0]))
    assert f"{field}: must carry a time zone" in str(refused.value)


def test_a_naive_datetime_in_code_is_refused_too() -> None:
    with pytest.raises(ValueError, match="estimated_start"):
        JobPending(
            job_id="j",
            reason="r",
            position=1,
            estimated_start=datetime(2026, 12, 1, 10),  # no time zone
        )
    ahead = datetime(2026, 12, 1, 10, tzinfo=timezone(timedelta(hours=2)))
    assert (
        JobPending(job_id="j", reason="r", position=1, estimated_start=ahead).estimated_start
        == ahead
    )
