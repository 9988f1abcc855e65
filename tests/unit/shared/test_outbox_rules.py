"""The outbox relay's rules without servers (found by mutation testing, ``bench/mutation.py``):
the payload limit it obeys, how it tells a refusal for good from a passing failure, how it
finds the culprit in a refused batch, and the headers it reads back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from nats.errors import BadSubjectError, MaxPayloadError
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from trainyard_platform.shared.outbox import (
    DEFAULT_MAX_PAYLOAD,
    OutboxRelay,
    _headers,
    _Message,
    permanent_failure,
)


@dataclass
class _Nats:
    max_payload: int | None = None
    last_error: BaseException | None = None


@dataclass
class _Bus:
    """What the relay uses of a bus: ``nats`` and ``publish_many``."""

    nats: _Nats = field(default_factory=_Nats)
    refuse: dict[str, BaseException] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)

    async def publish_many(
        self, messages: Iterable[tuple[str, bytes, str, dict[str, str]]]
    ) -> None:
        batch = list(messages)
        self.calls.append([event_id for _, _, event_id, _ in batch])
        for subject, _, _, _ in batch:
            if subject in self.refuse:
                raise self.refuse[subject]
        self.stored += [event_id for _, _, event_id, _ in batch]


def _relay(bus: _Bus, max_payload: int | None = None) -> OutboxRelay:
    return OutboxRelay(pool=None, bus=bus, max_payload=max_payload)  # type: ignore[arg-type]


def _message(seq: int, subject: str = "trainyard.job.cancel_requested.j") -> _Message:
    return _Message(seq, f"e{seq}", subject, b"{}", {})


# --- the payload limit ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "configured", "limit"),
    [
        (2048, None, 2048),  # the server's
        (2048, 4096, 2048),  # the smaller of both
        (2048, 1, 1),  # however small
        (None, 4096, 4096),
        (None, None, DEFAULT_MAX_PAYLOAD),  # neither: NATS's default
        (0, 0, DEFAULT_MAX_PAYLOAD),  # 0 means none
        (-1, None, DEFAULT_MAX_PAYLOAD),
    ],
)
def test_the_payload_limit(server: int | None, configured: int | None, limit: int) -> None:
    assert _relay(_Bus(_Nats(max_payload=server)), configured).max_payload() == limit


# --- refused for good, or not ---------------------------------------------------------------


def test_which_refusals_are_for_good() -> None:
    assert permanent_failure(BadSubjectError()) == "BadSubjectError: nats: invalid subject"
    too_big = APIError(code=400, err_code=10054, description="too big")
    assert permanent_failure(too_big) == f"refused by JetStream: {too_big}"
    assert permanent_failure(APIError(code=503, err_code=10008, description="busy")) is None
    long = "nats: maximum payload exceeded " + "x" * 600
    assert permanent_failure(NatsError(long)) == long[:500]
    assert permanent_failure(NatsError("nats: timeout")) is None


def test_a_permissions_violation_is_for_good_only_for_its_subject_and_only_as_a_timeout() -> None:
    violation = NatsError('nats: permissions violation for publish to "trainyard.a.b"')
    text = str(violation)
    assert permanent_failure(TimeoutError(), "trainyard.a.b", violation) == text
    assert permanent_failure(TimeoutError(), last_error=violation) == text  # subject unknown
    assert permanent_failure(TimeoutError(), "trainyard.other", violation) is None
    assert permanent_failure(TimeoutError(), "trainyard.a.b", None) is None
    # Another failure while an old violation is on record is not a refusal.
    assert permanent_failure(ConnectionError("reset"), "trainyard.a.b", violation) is None
    long = NatsError('nats: permissions violation for publish to "s" ' + "y" * 600)
    assert permanent_failure(TimeoutError(), "s", long) == str(long)[:500]


def test_a_violation_of_a_longer_subject_is_not_this_ones() -> None:
    """The subject is named in quotes; a subject that is only the start of the one refused
    (job ``j1`` of ``j12``) timed out for another reason (NATS slow or away): parked, its
    event was never published."""
    violation = NatsError('nats: permissions violation for publish to "trainyard.a.j12"')
    assert permanent_failure(TimeoutError(), "trainyard.a.j1", violation) is None
    assert permanent_failure(TimeoutError(), "a.j12", violation) is None


# --- finding the culprit --------------------------------------------------------------------


async def test_a_single_message_refused_for_good_is_parked_after_one_try() -> None:
    bus = _Bus(refuse={"bad": MaxPayloadError()})
    parked: dict[int, str] = {}
    published, error = await _relay(bus)._publish([_message(1, "bad")], parked)
    assert (published, error, parked) == ([], None, {1: "maximum payload exceeded"})
    assert bus.calls == [["e1"]]


async def test_in_a_batch_of_two_the_culprit_is_parked_and_the_other_published() -> None:
    bus = _Bus(refuse={"bad": MaxPayloadError()})
    parked: dict[int, str] = {}
    published, error = await _relay(bus)._publish([_message(1, "bad"), _message(2)], parked)
    assert (published, error, parked) == ([2], None, {1: "maximum payload exceeded"})
    assert bus.calls == [["e1", "e2"], ["e1"], ["e2"]]
    assert bus.stored == ["e2"]


async def test_a_permissions_violation_on_the_messages_subject_parks_it() -> None:
    violation = NatsError('nats: permissions violation for publish to "trainyard.x"')
    bus = _Bus(nats=_Nats(last_error=violation), refuse={"trainyard.x": TimeoutError()})
    parked: dict[int, str] = {}
    assert await _relay(bus)._publish([_message(1, "trainyard.x")], parked) == ([], None)
    assert parked == {1: str(violation)}


async def test_a_timeout_with_a_violation_of_another_subject_is_a_passing_failure() -> None:
    violation = NatsError('nats: permissions violation for publish to "trainyard.y"')
    bus = _Bus(nats=_Nats(last_error=violation), refuse={"trainyard.x": TimeoutError()})
    parked: dict[int, str] = {}
    published, error = await _relay(bus)._publish([_message(1, "trainyard.x")], parked)
    assert published == [] and isinstance(error, TimeoutError) and parked == {}


# --- headers as stored ----------------------------------------------------------------------


def test_headers_read_back_from_a_pool_with_or_without_the_jsonb_codec() -> None:
    assert _headers({"traceparent": "00-a-b-01"}) == {"traceparent": "00-a-b-01"}
    assert _headers('{"traceparent": "00-a-b-01"}') == {"traceparent": "00-a-b-01"}
    assert _headers(None) == {}
    assert _headers({}) == {}


def test_a_row_becomes_a_message_with_its_headers() -> None:
    row: dict[str, Any] = {
        "seq": 7,
        "event_id": "e7",
        "subject": "trainyard.s",
        "body": b"{}",
        "headers": '{"traceparent": "t"}',
    }
    message = _Message.of(row)  # type: ignore[arg-type]
    assert message == _Message(7, "e7", "trainyard.s", b"{}", {"traceparent": "t"})
    assert message.publishable() == ("trainyard.s", b"{}", "e7", {"traceparent": "t"})
