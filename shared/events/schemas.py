"""The event catalogue as a published contract: one JSON Schema per event type and version,
and an AsyncAPI 3.0 document of the NATS subjects they travel on, generated from the
payload models.

    python -m trainyard_platform.shared.events.schemas --write   # regenerate docs/events/
    python -m trainyard_platform.shared.events.schemas --check   # exit 1 naming each file that differs

Contract:
- ``docs/events/<type>.json`` is the JSON Schema (draft 2020-12) of an event's ``data``, with
  ``$id`` the URI every event of that type carries as ``dataschema`` (under the default base,
  ``envelope.DEFAULT_SCHEMA_BASE``). Non-finite floats are the strings ``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"`` on the wire, so every number in a schema also admits them.
- ``docs/events/asyncapi.yaml`` has one channel per type (address ``<type>.{routingKey}``),
  one message per channel whose payload is the CloudEvents envelope with ``data`` referring to
  that schema file, and the consumer's obligations in its description.
- The output is a pure function of the models: the committed files are compared to it by a
  test, so they never drift from the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainyard_platform.shared.events.envelope import DEFAULT_SCHEMA_BASE, schema_uri
from trainyard_platform.shared.events.payloads import EVENT_TYPES, Payload
from trainyard_platform.shared.events.trust import ALLOWED_SOURCES, OWNERS, delegate_key

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
NON_FINITE = ["NaN", "Infinity", "-Infinity"]
"""How a non-finite float is written on the wire (bare NaN is not JSON)."""

_ROUTING_KEYS: Mapping[str, str] = {
    "node_id": "the node id of the runner it concerns",
    "name": "the flavor's name",
    "team": "the team",
    "job_id": "the job id",
}


def payload_schema(payload: type[Payload]) -> dict[str, Any]:
    """The JSON Schema of the ``data`` of ``payload``'s events, as published."""
    body = payload.model_json_schema(mode="serialization")
    schema: dict[str, Any] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": schema_uri(payload.TYPE, DEFAULT_SCHEMA_BASE),
        **body,
        "title": payload.TYPE,
    }
    if payload.__doc__ and "description" not in body:
        schema["description"] = " ".join(payload.__doc__.split())
    admitted: dict[str, Any] = _admit_non_finite(schema)
    return admitted


def _admit_non_finite(node: Any) -> Any:
    """Every ``number`` also accepts the strings a non-finite float is written as."""
    if isinstance(node, list):
        return [_admit_non_finite(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _admit_non_finite(value) for key, value in node.items()}
    if out.get("type") == "number":
        number = {k: v for k, v in out.items() if k not in ("title", "description", "default")}
        rest = {k: v for k, v in out.items() if k in ("title", "description", "default")}
        return {**rest, "anyOf": [number, {"type": "string", "enum": NON_FINITE}]}
    return out


def routing_key_field(payload: type[Payload]) -> str:
    """The payload field whose value is the event's routing key (``trust.routing_key_of``)."""
    from trainyard_platform.shared.events import trust

    for kind, field, _ in trust._ROUTED_BY_OTHER:
        if payload is kind:
            return field
    return "node_id" if payload in trust._ROUTED_BY_NODE else "job_id"


ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A CloudEvents 1.0 event in structured JSON mode.",
    "required": ["specversion", "id", "source", "type", "time", "subject", "data"],
    "properties": {
        "specversion": {"const": "1.0"},
        "id": {
            "type": "string",
            "description": "Unique per event within its source; deduplicate by source and id.",
        },
        "source": {"type": "string", "description": "The service that said it."},
        "type": {"type": "string", "description": "The payload's type and version."},
        "time": {"type": "string", "format": "date-time"},
        "subject": {"type": "string", "description": "The routing key; order holds per subject."},
        "datacontenttype": {"const": "application/json"},
        "dataschema": {"type": "string", "format": "uri"},
        "data": {"type": "object"},
    },
}

CONSUMER_OBLIGATIONS = """\
Every Trainyard event is a CloudEvents 1.0 event in structured JSON mode, published on NATS
JetStream on the subject `<type>.<routing key>`. A consumer of its own (a durable JetStream
consumer on the stream named in docs/events.md) must:

- deduplicate by `id` within its `source`: delivery is at least once (a redelivery, or an outbox
  relay retrying after a crash, repeats an event with the same `id`); record the (`source`,
  `id`) pairs you have handled. An id is unique only within its source, and some can be
  foreseen: another source's event under an id you have seen is another event. Every runner
  node says one source: keep a runner's events apart by its `node_id` too;
- rely on order only per `subject` (one job, one node, one flavor or one team): events about
  different subjects interleave in any order;
- ignore fields it does not know: within a version (`...v1`) new optional fields are added;
  a change that is not compatible is a new type (`...v2`) published beside the old one;
- read non-finite numbers as the strings "NaN", "Infinity" and "-Infinity";
- believe an event only from the `source` its type allows (`x-trainyard-sources`).
"""


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of every event type (as a plain mapping)."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for event_type, payload in sorted(EVENT_TYPES.items()):
        key = _channel_key(event_type)
        field = routing_key_field(payload)
        delegates = sorted(ALLOWED_SOURCES[event_type] - {OWNERS[event_type]})
        address_note = (
            f" Said on the owner's behalf by {', '.join(delegates)}: on"
            f" `{event_type}.{', '.join(delegate_key(d) for d in delegates)}` instead."
            if delegates
            else ""
        )
        if payload.SAID_BY_A_NODE:
            address_note += (
                f" From a runner: on `{event_type}.{{routingKey}}.{{nodeId}}`, the node that"
                " says it (its `node_id`, the only node whose user may publish there)."
            )
        messages[key] = {
            "name": event_type,
            "title": event_type,
            "contentType": "application/cloudevents+json",
            "headers": {
                "type": "object",
                "properties": {
                    "Nats-Msg-Id": {
                        "type": "string",
                        "description": "The publisher's keyed hash of the subject and the"
                        " event's id: JetStream drops duplicates by it. Read the id from the"
                        " event, not from this header.",
                    },
                    "traceparent": {"type": "string", "description": "W3C trace context."},
                },
            },
            "payload": {
                "allOf": [
                    {"$ref": "#/components/schemas/CloudEvent"},
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": event_type},
                            "source": {"enum": sorted(ALLOWED_SOURCES[event_type])},
                            "dataschema": {"const": schema_uri(event_type, DEFAULT_SCHEMA_BASE)},
                            "data": {"$ref": f"./{event_type}.json"},
                        },
                    },
                ]
            },
        }
        channels[key] = {
            "address": f"{event_type}.{{routingKey}}",
            "description": (
                f"Events of `{event_type}`, routed by `{field}` ({_ROUTING_KEYS[field]})."
                + address_note
            ),
            "parameters": {"routingKey": {"description": f"The `{field}` of the payload."}},
            "messages": {key: {"$ref": f"#/components/messages/{key}"}},
            "x-trainyard-sources": sorted(ALLOWED_SOURCES[event_type]),
        }
        operations[f"receive_{key}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": [{"$ref": f"#/channels/{key}/messages/{key}"}],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Trainyard events",
            "version": "1.0.0",
            "description": CONSUMER_OBLIGATIONS,
        },
        "defaultContentType": "application/cloudevents+json",
        "servers": {
            "nats": {
                "host": "localhost:4222",
                "protocol": "nats",
                "description": "The deployment's NATS with JetStream (each service's own user).",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": {"CloudEvent": ENVELOPE_SCHEMA}, "messages": messages},
    }


def _channel_key(event_type: str) -> str:
    # trainyard.job.submitted.v1 -> job_submitted_v1: a key without dots, readable.
    return event_type.removeprefix("trainyard.").replace(".", "_").replace("-", "_")


def generated() -> dict[str, str]:
    """Every file of docs/events/ by name, as the models make it."""
    import yaml

    files = {
        f"{event_type}.json": json.dumps(payload_schema(payload), indent=2) + "\n"
        for event_type, payload in sorted(EVENT_TYPES.items())
    }
    files["asyncapi.yaml"] = (
        "# Generated by `python -m trainyard_platform.shared.events.schemas --write`; do not edit.\n"
        + yaml.safe_dump(asyncapi_document(), sort_keys=False, width=100, allow_unicode=True)
    )
    return files


def differences(folder: Path = DOCS) -> list[str]:
    """The names of files in ``folder`` that are missing, stale or no longer generated."""
    want = generated()
    have = {p.name for p in folder.glob("*") if p.suffix in (".json", ".yaml")}
    stale = [
        name
        for name, text in want.items()
        if not (folder / name).is_file() or (folder / name).read_text() != text
    ]
    return sorted(stale + sorted(have - set(want)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.shared.events.schemas", description=__doc__
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate docs/events/")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/events/ is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = differences()
        for name in stale:
            print(f"docs/events/{name} differs from the models", file=sys.stderr)
        return 1 if stale else 0
    DOCS.mkdir(parents=True, exist_ok=True)
    want = generated()
    for name, text in want.items():
        (DOCS / name).write_text(text)
    for path in DOCS.glob("*"):
        if path.suffix in (".json", ".yaml") and path.name not in want:
            path.unlink()
    print(f"wrote {len(want)} files to docs/events/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
