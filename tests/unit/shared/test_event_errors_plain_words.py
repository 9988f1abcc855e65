"""An event that fails validation is refused (and dead-lettered) with a reason in plain
words, each bad field named by its path (``data.spec.gpus: must be an integer``,
``data.points[0].time: ...``), as the API says a bad field: never pydantic's phrasing
(``Input should be a valid integer``, ``Value error, ...``, ``Field required``).

Every field of every event type's payload, and the envelope's own attributes, are given bad
values of every JSON type."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_forged_events import SAMPLES, sample
from tests.integration.test_openapi_fuzz import NOT_PLAIN
from trainyard_platform.shared.events import Envelope, EventParseError, Payload, parse_envelope
from trainyard_platform.shared.events.trust import ALLOWED_SOURCES, routing_key_of

JOB = "0b6f1d6e-4c1e-4b55-9a43-6f7d0f0c7a10"
BAD: list[Any] = [None, True, -1, 1.5, 2**70, "", "x", "2026-12-01T10:00:00", [], [None], {}]


def _wire(kind: type[Payload]) -> dict[str, Any]:
    payload = sample(kind, JOB)
    source = sorted(ALLOWED_SOURCES[kind.TYPE])[0]
    wrapped = Envelope.wrap(payload, source=source, subject=routing_key_of(payload))
    wire: dict[str, Any] = json.loads(wrapped.to_json())
    return wire


def _reason(wire: Any) -> str | None:
    try:
        parse_envelope(json.dumps(wire).encode())
    except EventParseError as refused:
        return str(refused)
    return None


def _unplain(reason: str | None) -> bool:
    return reason is not None and any(phrase in reason for phrase in NOT_PLAIN)


@pytest.mark.parametrize("kind", SAMPLES, ids=lambda k: k.__name__)
def test_every_bad_field_of_every_event_is_said_in_plain_words(kind: type[Payload]) -> None:
    wire = _wire(kind)
    found = []
    for name in [*wire["data"], "missing"]:
        for bad in BAD:
            for value in (bad, [bad], {"k": bad}):
                changed = json.loads(json.dumps(wire))
                changed["data"][name] = value
                if _unplain(reason := _reason(changed)):
                    found.append(f"data.{name}={value!r}: {reason}")
    for name in ("id", "type", "subject", "time", "source", "specversion", "data"):
        for bad in BAD:
            changed = json.loads(json.dumps(wire))
            changed[name] = bad
            if _unplain(reason := _reason(changed)):
                found.append(f"{name}={bad!r}: {reason}")
            del changed[name]
            if _unplain(reason := _reason(changed)):
                found.append(f"no {name}: {reason}")
    assert not found, "\n".join(found)


def test_the_words_name_each_field_by_its_path() -> None:
    from trainyard_platform.shared.events.payloads import JobSubmitted

    wire = _wire(JobSubmitted)
    wire["data"]["spec"]["gpus"] = "many"
    wire["data"]["spec"]["args"] = ["ok", 3]
    del wire["data"]["job_id"]
    wire["data"]["submitted_at"] = "2026-12-01T10:00:00"
    reason = _reason(wire)
    assert reason is not None
    assert "data.spec.gpus: must be an integer" in reason
    assert "data.spec.args[1]: must be a string" in reason
    assert "data.job_id: field required" in reason
    assert "data.submitted_at: must carry a time zone" in reason
    assert _reason("nope") is not None
    assert (_reason("nope") or "").startswith("event: must be a JSON object")
    assert (_reason({"specversion": "1.0", "id": "1", "subject": "j"}) or "") == (
        "type: field required"
    )
