"""Wire events: the CloudEvents envelope and one versioned payload model per event type."""

from trainyard_platform.shared.events.envelope import Envelope, EventParseError, parse_envelope
from trainyard_platform.shared.events.payloads import EVENT_TYPES, Payload, nats_subject

__all__ = [
    "EVENT_TYPES",
    "Envelope",
    "EventParseError",
    "Payload",
    "nats_subject",
    "parse_envelope",
]
