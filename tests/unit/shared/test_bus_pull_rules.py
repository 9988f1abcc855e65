"""The consumer loop's own decisions (``Bus.consume`` and its durable pull), on a stand-in
JetStream: what the server is told about each message (the redelivery delay of a failure, a
message handed back on stop), what ``Bus.hearing`` says around full batches, fetch faults
and a second run, how a stop or an unexpected error ends ``consume``, when the consumer's
``max_ack_pending`` is lowered and restored, and how a gone durable consumer is told from
NATS being away. The server's side of these (redelivery, ordering, a lost stream) is in
tests/integration/shared/test_bus_*.py on a real NATS; here the bus is alone, so each
decision can be seen exactly."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest.mock import ANY

import asyncpg
import nats.errors
import nats.js.errors
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api
from nats.js.errors import NotFoundError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import trainyard_platform.shared.bus as bus_module
from trainyard_platform.shared.bus import (
    CONSUMER_HEADER,
    DEAD_LETTER_KINDS,
    ORIGINAL_SUBJECT_HEADER,
    REASON_HEADER,
    Bus,
    ConsumerLostError,
    Delivery,
    Hearing,
    NotNow,
    NotYet,
    Reject,
    _attrs,
    _DurablePull,
)
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.settings import NatsSettings

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NATS_AWAY = "NATS unavailable (NoRespondersError: nats: no responders available for request)"
GUARD_S = 20.0
"""Only turns a consumer that never returns into a failure instead of a hung test."""

Step = list[Any] | BaseException | Callable[[], Any]


class FakeMsg:
    """A fetched message: its data and subject, delivery count, and what it was told. It has
    none of nats-py's private state (``_ackd``): what the bus knows of a message it settled,
    it keeps itself."""

    def __init__(
        self, data: bytes, subject: str, delivered: int = 1, seq: int = 1, pending: int = 0
    ) -> None:
        self.data = data
        self.subject = subject
        self.headers: dict[str, str] | None = None
        self.metadata = SimpleNamespace(
            num_delivered=delivered,
            sequence=SimpleNamespace(stream=seq, consumer=seq),
            num_pending=pending,
        )
        self.told: list[tuple[str, float | None]] = []
        self.kept = asyncio.Event()
        self.kept_after_settled = 0
        self.ack_error: BaseException | None = None

    async def ack(self) -> None:
        if self.ack_error is not None:
            raise self.ack_error
        self._settle("ack")

    async def nak(self, delay: float | None = None) -> None:
        self._settle("nak", delay)

    async def term(self) -> None:
        self._settle("term")

    async def in_progress(self) -> None:
        self.kept.set()
        self.kept_after_settled += bool(self.told)

    def _settle(self, what: str, delay: float | None = None) -> None:
        self.told.append((what, delay))


class FakeSub:
    """A pull subscription that answers fetches from a script; when the script is done it
    asks the consumer to stop (and answers like an empty fetch)."""

    def __init__(self, js: FakeJetStream) -> None:
        self.js = js
        self.unsubscribed = False

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.js.fetches.append((batch, timeout))
        self.js.paused_at_fetch.append(dict(self.js.bus.paused) if self.js.bus else {})
        self.js.hearing_at_fetch.append(self.js.bus.hearing("c") if self.js.bus else None)
        if not self.js.script:
            self.js.stop.set()
            raise NatsTimeoutError
        step = self.js.script.pop(0)
        if callable(step):
            step = step()
        if isinstance(step, BaseException):
            raise step
        return list(step)

    @property
    def pending_msgs(self) -> int:
        """What waits in the client's buffer: messages, or status replies."""
        return self.js.buffered

    async def consumer_info(self) -> Any:
        """The server's count of messages pending delivery: the next of ``js.waiting``
        (0 when none is scripted), or its fault; and the last consumer sequence it
        delivered (``js.delivered``)."""
        self.js.infos += 1
        step = self.js.waiting.pop(0) if self.js.waiting else 0
        if isinstance(step, BaseException):
            raise step
        return SimpleNamespace(
            num_pending=step,
            num_ack_pending=self.js.pending,
            delivered=SimpleNamespace(consumer_seq=self.js.delivered),
        )

    async def unsubscribe(self) -> None:
        self.unsubscribed = True
        if self.js.unsubscribe_error is not None:
            raise self.js.unsubscribe_error


class FakeJetStream:
    """The JetStream requests the consumer loop makes, answered from memory."""

    def __init__(self) -> None:
        self.script: list[Step] = []
        self.stop = asyncio.Event()
        self.bus: Bus | None = None
        self.consumers: dict[str, api.ConsumerConfig] = {}
        self.pending = 0
        self.waiting: list[int | BaseException] = []
        self.buffered = 0
        self.delivered = 0
        self.infos = 0
        self.configs: list[api.ConsumerConfig] = []
        self.subs: list[FakeSub] = []
        self.published: list[tuple[str, dict[str, str]]] = []
        self.publish_fault: Callable[[], BaseException | None] = lambda: None
        self.unsubscribe_error: BaseException | None = None
        self.hearing_at_fetch: list[Hearing | None] = []
        self.fetches: list[tuple[int, float]] = []
        self.paused_at_fetch: list[dict[str, str]] = []
        self.published_raw: list[tuple[str, bytes, float, dict[str, str]]] = []
        self.tallies: dict[str, tuple[int, bytes]] = {}
        """The attempts stream: each subject's last record, with its sequence."""
        self.tally_seq = 0

    async def consumer_info(self, stream: str, name: str) -> Any:
        assert stream == "TRAINYARD", stream  # the event stream, where the consumers are
        if name not in self.consumers:
            raise NotFoundError
        return SimpleNamespace(
            num_ack_pending=self.pending, delivered=SimpleNamespace(consumer_seq=self.delivered)
        )

    async def add_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        assert stream == "TRAINYARD", stream
        assert config.durable_name is not None
        self.configs.append(config)
        self.consumers[config.durable_name] = config

    async def pull_subscribe_bind(self, durable: str, stream: str) -> FakeSub:
        assert (durable, stream) == ("c", "TRAINYARD"), (durable, stream)
        sub = FakeSub(self)
        self.subs.append(sub)
        return sub

    async def stream_info(self, name: str) -> Any:
        return SimpleNamespace(created=T0)

    async def publish(
        self, subject: str, body: bytes, timeout: float, headers: dict[str, str]
    ) -> Any:
        fault = self.publish_fault()
        if fault is not None:
            raise fault
        if subject.startswith("attempts."):
            last = self.tallies.get(subject, (0, b""))[0]
            if headers.get("Nats-Expected-Last-Subject-Sequence") != str(last):
                raise nats.js.errors.APIError(err_code=10071, description="wrong last sequence")
            self.tally_seq += 1
            self.tallies[subject] = (self.tally_seq, body)
            return SimpleNamespace(seq=self.tally_seq)
        self.published.append((subject, headers))
        self.published_raw.append((subject, body, timeout, headers))

    async def get_msg(self, stream: str, subject: str | None = None, direct: bool = False) -> Any:
        assert (stream, direct) == ("TRAINYARD_ATTEMPTS", True), (stream, direct)
        assert subject is not None
        if subject not in self.tallies:
            raise NotFoundError
        seq, body = self.tallies[subject]
        return SimpleNamespace(seq=seq, data=body)

    def tally(self, seq: int = 1, consumer: str = "c") -> dict[str, Any] | None:
        """The outcomes recorded for the message ``seq`` of ``consumer``."""
        found = self.tallies.get(f"attempts.{consumer}.{seq}")
        return None if found is None else json.loads(found[1])

    def record(self, msg: FakeMsg, failures: int = 0, waits: int = 0, handed_back: int = 0) -> None:
        """Outcomes of earlier deliveries of ``msg``, as another process recorded them."""
        self.tally_seq += 1
        body = {
            "msg_id": (msg.headers or {}).get("Nats-Msg-Id", ""),
            "failures": failures,
            "waits": waits,
            "handed_back": handed_back,
        }
        subject = f"attempts.c.{msg.metadata.sequence.stream}"
        self.tallies[subject] = (self.tally_seq, json.dumps(body).encode())

    async def publish_async(self, subject: str, body: bytes, headers: dict[str, str]) -> Any:
        return asyncio.get_running_loop().create_future()  # an acknowledgement never comes


class FakeNats:
    def __init__(self, js: FakeJetStream) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}
        self._js = js

    def jetstream(self) -> FakeJetStream:
        return self._js


@pytest.fixture
def js() -> FakeJetStream:
    return FakeJetStream()


def make_bus(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, meter: Any = None, **settings: Any
) -> Bus:
    nc = FakeNats(js)
    bus = Bus(nc, NatsSettings(user="registry", **settings), meter=meter)  # type: ignore[arg-type]
    monkeypatch.setattr(bus, "_outage_delay", lambda failures: 0.001)
    js.bus = bus
    return bus


def an_event(job: str = "j1") -> Envelope[Payload]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job, team="t", user="u"), source=SUBMISSION, subject=job
    )


def event_msg(
    delivered: int = 1,
    envelope: Envelope[Payload] | None = None,
    subject: str | None = None,
    seq: int = 1,
) -> FakeMsg:
    envelope = envelope or an_event()
    return FakeMsg(
        envelope.to_json(), subject or envelope.nats_subject, delivered=delivered, seq=seq
    )


def dead_letters(js: FakeJetStream) -> list[tuple[str, str, str]]:
    """(subject, consumer, reason) of each dead letter written."""
    return [
        (subject, headers[CONSUMER_HEADER], headers[REASON_HEADER])
        for subject, headers in js.published
    ]


def bad_msg(seq: int = 1, pending: int = 0) -> FakeMsg:
    return FakeMsg(b"not an event", "trainyard.job.submitted.v1.j1", seq=seq, pending=pending)


async def until_stopped(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.create_task(work)
    done, _ = await asyncio.wait({task}, timeout=GUARD_S)
    if task not in done:
        task.cancel()
        pytest.fail("the consumer did not return once stopped")
    task.result()


async def consume(
    bus: Bus, js: FakeJetStream, handler: Any = None, batch: int = 2, **options: Any
) -> None:
    async def ignore(envelope: Envelope[Payload]) -> None:
        pass

    await until_stopped(
        bus.consume("c", ["trainyard.job.>"], handler or ignore, js.stop, batch=batch, **options)
    )


# --- what the server is told about a message ------------------------------------------------


@pytest.mark.parametrize(("delivered", "delay"), [(1, 0.5), (2, 1.0), (3, 2.0)])
async def test_a_failed_event_comes_back_after_a_delay_that_doubles_with_each_failure(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, delivered: int, delay: float
) -> None:
    bus = make_bus(js, monkeypatch, retry_delay_seconds=0.5, max_deliver=5)
    msg = event_msg(delivered)
    js.record(msg, failures=delivered - 1)  # each earlier delivery failed
    js.script = [[msg]]

    async def fail(envelope: Envelope[Payload]) -> None:
        raise ValueError("not yet")

    await consume(bus, js, fail)
    assert msg.told == [("nak", delay)]
    assert js.tally() == {
        "msg_id": "",
        "failures": delivered,
        "waits": 0,
        "handed_back": 0,
        "deliveries": [ANY],  # the id of the one whose outcome the record added
    }


@pytest.mark.parametrize(
    ("failures", "settings", "delay"),
    [
        (39, {}, 600.0),  # 0.5 s x 2^39: over 8,000 years, past 64 bits in nanoseconds
        (1999, {}, 600.0),  # 2^1999: no float holds it
        (20, {"retry_delay_max_seconds": 60}, 60.0),
        (3, {"retry_delay_max_seconds": 60}, 4.0),  # below the cap it still doubles
    ],
)
async def test_the_delay_before_a_failed_event_comes_back_is_capped(
    js: FakeJetStream,
    monkeypatch: pytest.MonkeyPatch,
    failures: int,
    settings: dict[str, Any],
    delay: float,
) -> None:
    """With a large ``MAX_DELIVER`` the doubled delay ran to days, then years, and a nak
    delay past 2^63 nanoseconds (about the 35th failure) or no float at all failed the
    handling of the event; it stops at ``retry_delay_max_seconds`` (10 minutes unless set)."""
    bus = make_bus(js, monkeypatch, retry_delay_seconds=0.5, max_deliver=5000, **settings)
    msg = event_msg(failures + 1)
    js.record(msg, failures=failures)
    js.script = [[msg]]

    async def fail(envelope: Envelope[Payload]) -> None:
        raise ValueError("not yet")

    await consume(bus, js, fail)
    assert msg.told == [("nak", delay)]
    assert dead_letters(js) == []


@pytest.mark.parametrize("outcome", ["handed_back", "unfinished"])
async def test_deliveries_that_were_no_failure_of_the_handler_count_toward_no_limit(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """JetStream's delivery count has every delivery: those handed back (``NotNow``, a stop)
    and those a crash or a restart ended. The limit was on it, so an event redelivered by
    four restarts was dead-lettered at its first real failure; only real failures count
    now, and the delay grows with them alone."""
    bus = make_bus(js, monkeypatch, retry_delay_seconds=0.5, max_deliver=5)
    msg = event_msg(12)
    if outcome == "handed_back":
        js.record(msg, failures=1, handed_back=10)
    else:
        js.record(msg, failures=1)  # the other ten ended with no outcome told
    js.script = [[msg]]

    async def fail(envelope: Envelope[Payload]) -> None:
        raise ValueError("not yet")

    await consume(bus, js, fail)
    assert msg.told == [("nak", 1.0)]  # the second failure of five
    assert dead_letters(js) == []
    assert js.tally() == {
        "msg_id": "",
        "failures": 2,
        "waits": 0,
        "handed_back": 10 if outcome == "handed_back" else 0,
        "deliveries": [ANY],
    }


async def test_a_tally_of_another_message_at_that_sequence_is_not_counted(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream made again (NATS lost its store) numbers its messages from 1 again: a tally
    left of the lost stream's message is of another event, and is written over."""
    bus = make_bus(js, monkeypatch, retry_delay_seconds=0.5, max_deliver=5)
    msg = event_msg(2)
    js.record(msg, failures=4)
    msg.headers = {"Nats-Msg-Id": "another-event"}
    js.script = [[msg]]

    async def fail(envelope: Envelope[Payload]) -> None:
        raise ValueError("not yet")

    await consume(bus, js, fail)
    assert msg.told == [("nak", 0.5)]
    assert js.tally() == {
        "msg_id": "another-event",
        "failures": 1,
        "waits": 0,
        "handed_back": 0,
        "deliveries": [ANY],
    }


async def test_a_dead_letter_waiting_out_an_outage_is_handed_back_on_stop(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = bad_msg()
    js.script = [[msg]]
    tries: list[int] = []

    def nats_away() -> BaseException:
        tries.append(1)
        if len(tries) == 2:
            js.stop.set()  # the service stops while the dead letter cannot be written
        return nats.errors.NoRespondersError()

    js.publish_fault = nats_away
    await consume(bus, js)
    assert msg.told == [("nak", None)]  # for the next process: neither lost nor terminated
    assert js.published == []
    assert bus.paused == {}


# --- hearing ------------------------------------------------------------------------------


async def test_hearing_waits_for_a_fetch_that_leaves_nothing_waiting(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    js.script = [[bad_msg(1), bad_msg(2, pending=1)], [bad_msg(3)], []]
    await consume(bus, js, batch=2)
    before_first, after_more_waiting, after_drained, *_ = js.hearing_at_fetch
    assert before_first is None
    assert after_more_waiting is None
    assert after_drained is not None


async def test_a_short_fetch_is_no_proof_of_a_drained_stream(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch a busy event loop kept from reading in time comes back short, or empty,
    while messages wait: only the server's count of those pending says it is drained."""
    bus = make_bus(js, monkeypatch)
    js.script = [[bad_msg(1, pending=900)], [], [], []]
    js.waiting = [900, nats.errors.TimeoutError()]  # the empty fetches: still waiting, no answer
    await consume(bus, js, batch=1024)
    _, after_short, after_empty_waiting, after_unanswered, after_drained = js.hearing_at_fetch
    assert after_short is None
    assert after_empty_waiting is None
    assert after_unanswered is None
    assert after_drained is not None


async def test_messages_delivered_and_not_yet_handed_over_are_still_waiting(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages the server delivered for a fetch that gave up (in the client's buffer, or on
    their way) are waiting, though the server has none undelivered; those delivered before
    the consumer was bound (to a process that stopped) are not this subscription's."""
    js.delivered = 5
    bus = make_bus(js, monkeypatch)

    def delivered_late() -> list[Any]:
        js.delivered, js.pending = 8, 2  # 7 and 8: delivered, not handed over nor acknowledged
        return []

    def handed_over() -> list[Any]:
        js.pending = 0
        return [bad_msg(7), bad_msg(8)]

    js.script = [[bad_msg(6)], delivered_late, handed_over, []]
    await consume(bus, js, batch=8)
    _, after_handed_over, after_late, after_read, after_drained = js.hearing_at_fetch
    assert after_handed_over is not None
    assert after_late == after_handed_over  # not moved on: 7 and 8 were waiting
    assert after_read is not None and after_read != after_late
    assert after_drained is not None


async def test_what_another_subscriber_was_delivered_and_acknowledged_is_heard(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deposed leader still fetching after this one bound was delivered 6-8: while any is
    unacknowledged it may be unhandled (waiting); once none is, the silent stream is caught
    up (else no node would be judged until a newer message came)."""
    js.delivered = 5
    bus = make_bus(js, monkeypatch)

    def elsewhere(unacknowledged: int) -> Callable[[], list[Any]]:
        def step() -> list[Any]:
            js.delivered, js.pending = 8, unacknowledged
            return []

        return step

    js.script = [[], elsewhere(2), elsewhere(0), []]
    await consume(bus, js, batch=8)
    _, heard, while_unacknowledged, once_acknowledged, _ = js.hearing_at_fetch
    assert heard is not None
    assert while_unacknowledged == heard  # not moved on
    assert once_acknowledged is not None and once_acknowledged != heard


async def test_a_status_reply_in_the_buffer_is_no_message_waiting(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty fetch's pull request expires on the server just after the fetch gave up:
    its ``408`` reply lands in the buffer (on a real NATS, after about half of an idle
    consumer's fetches). It is no message: the idle consumer is caught up."""
    bus = make_bus(js, monkeypatch)
    js.buffered = 1
    js.script = [[], []]
    await consume(bus, js, batch=8)
    _, after_empty, *_ = js.hearing_at_fetch
    assert after_empty is not None


async def test_a_fetch_that_began_with_a_buffer_asks_the_server(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages the fetch took from the buffer were sent before it began: their
    ``num_pending`` says nothing of what was published since; the server's count does."""
    bus = make_bus(js, monkeypatch)
    js.buffered = 2
    js.waiting = [3, 0]
    js.script = [[bad_msg(1)], [bad_msg(2)], []]
    await consume(bus, js, batch=8)
    _, after_stale, after_asked, *_ = js.hearing_at_fetch
    assert after_stale is None
    assert after_asked is not None


async def test_a_consumer_whose_hearing_no_one_asks_is_not_judged(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging an empty fetch costs a JetStream API request: a runner's consumer, idle most
    of the time and heard by no one, makes none."""
    bus = make_bus(js, monkeypatch)
    js.bus = None  # the fetches do not ask for hearing
    js.script = [[], [bad_msg(1)], [], []]
    await consume(bus, js, batch=8)
    assert js.infos == 0
    assert bus.hearing("c") is None


async def test_a_fetch_fault_is_a_gap_in_hearing(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    js.script = [[], nats.errors.NoRespondersError(), [], []]
    await consume(bus, js)
    _, heard, after_fault, after_drained, *_ = js.hearing_at_fetch
    assert heard is not None
    assert after_fault is None
    assert after_drained is not None and after_drained.since > heard.since
    assert after_drained.since.tzinfo is UTC and after_drained.through.tzinfo is UTC
    assert js.paused_at_fetch[2] == {"c": NATS_AWAY}  # retrying the fetch: paused
    assert js.paused_at_fetch[3] == {}


async def test_a_second_run_on_the_same_bus_hears_from_its_own_start(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [T0]
    monkeypatch.setattr(bus_module, "_utc_now", lambda: now[0])
    bus = make_bus(js, monkeypatch)
    js.script = [[]]
    await consume(bus, js)
    assert bus.hearing("c") is None  # not running

    now[0] = T0 + timedelta(seconds=10)
    js.stop.clear()
    js.hearing_at_fetch.clear()
    js.script = [[], []]
    await consume(bus, js)
    assert js.hearing_at_fetch[1] == Hearing(now[0], now[0])


# --- how consume ends ---------------------------------------------------------------------


async def test_an_error_that_is_no_outage_reaches_the_caller_as_it_was(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    js.script = [RuntimeError("boom")]
    with pytest.raises(RuntimeError, match=r"^boom$"):
        await consume(bus, js)
    assert js.subs[0].unsubscribed


async def test_a_consumer_stopped_while_nats_is_away_returns_quietly(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)

    def away_then_stop() -> BaseException:
        js.stop.set()
        return nats.errors.NoRespondersError()

    js.script = [nats.errors.NoRespondersError(), away_then_stop]
    await consume(bus, js)
    assert bus.paused == {}
    assert bus.hearing("c") is None


async def test_stopping_on_a_connection_already_closed_returns_quietly(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    js.unsubscribe_error = nats.errors.ConnectionClosedError()
    js.script = [[]]
    await consume(bus, js)
    assert js.subs[0].unsubscribed


# --- the durable pull: held messages, a gone consumer ------------------------------------


def consumer_config(batch: int = 16) -> api.ConsumerConfig:
    return api.ConsumerConfig(name="c", durable_name="c", max_ack_pending=batch)


async def test_binding_with_nothing_unacknowledged_keeps_the_batch_as_the_limit(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    pull = await _DurablePull.bind(bus, consumer_config(16))
    assert [c.max_ack_pending for c in js.configs] == [16]
    js.script = [[], []]
    await pull.fetch(16, timeout=0.5)
    await pull.fetch(16, timeout=0.5)
    assert len(js.configs) == 1  # fetching does not touch the consumer's configuration


async def test_a_dead_consumers_pending_messages_hold_back_newer_ones_until_settled(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus = make_bus(js, monkeypatch)
    js.consumers["c"] = consumer_config(16)
    js.pending = 3
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        pull = await _DurablePull.bind(bus, consumer_config(16))
    assert [c.max_ack_pending for c in js.configs] == [16, 3]
    assert (
        "c: 3 messages delivered before this start are not settled yet: nothing newer until "
        "they are (one handed back on a stop comes at once, one held by a consumer that died "
        "after ack_wait)"
    ) in caplog.messages
    js.script = [[], [], []]
    await pull.fetch(16, timeout=0.5)  # still pending: still held
    assert [c.max_ack_pending for c in js.configs] == [16, 3]
    js.pending = 0
    await pull.fetch(16, timeout=0.5)  # settled: the batch is the limit again
    assert [c.max_ack_pending for c in js.configs] == [16, 3, 16]
    await pull.fetch(16, timeout=0.5)
    assert len(js.configs) == 3  # and stays so without another update


async def test_nobody_answering_for_a_consumer_that_exists_is_nats_away(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    pull = await _DurablePull.bind(bus, consumer_config())
    js.script = [nats.js.errors.ServiceUnavailableError()]
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        await pull.fetch(16, timeout=0.5)
    assert len(js.subs) == 1  # not bound anew
    assert len(js.configs) == 1


async def test_a_gone_consumer_is_made_again_and_its_loss_reported(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus = make_bus(js, monkeypatch)
    pull = await _DurablePull.bind(bus, consumer_config())
    del js.consumers["c"]  # NATS lost its store
    js.unsubscribe_error = nats.errors.ConnectionClosedError()  # the old one: already gone
    js.script = [nats.js.errors.ServiceUnavailableError(), [event_msg()]]
    with (
        caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"),
        pytest.raises(ConsumerLostError, match="consumer c was gone and is made again"),
    ):
        await pull.fetch(16, timeout=0.5)
    assert "c: the durable consumer is gone (stream lost?); making it again" in caplog.messages
    assert [c.durable_name for c in js.configs] == ["c", "c"]
    old, new = js.subs
    assert old.unsubscribed and not new.unsubscribed
    assert len(await pull.fetch(16, timeout=0.5)) == 1  # from the new subscription
    assert js.fetches == [(16, 0.5), (16, 0.5)]


async def test_acknowledgements_that_never_come_make_publish_many_fail(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch, publish_timeout_seconds=0.05)
    task = asyncio.create_task(bus.publish_many([("trainyard.x", b"{}", "e1", {})]))
    done, _ = await asyncio.wait({task}, timeout=GUARD_S)
    if task not in done:
        task.cancel()
        pytest.fail("publish_many waited for acknowledgements that never come")
    with pytest.raises(TimeoutError):
        task.result()


# --- handling: outcomes, dead letters, batches -----------------------------------------------


async def test_a_handled_event_is_acknowledged_and_reached_the_handler_whole(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    envelope = an_event()
    msg = event_msg(envelope=envelope)
    js.script = [[msg]]
    seen: list[Envelope[Payload]] = []

    async def handle(got: Envelope[Payload]) -> None:
        seen.append(got)

    await consume(bus, js, handle)
    assert seen == [envelope]
    assert msg.told == [("ack", None)]


async def test_a_rejected_event_is_dead_lettered_at_once_with_the_reason(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    js.script = [[msg]]

    async def reject(envelope: Envelope[Payload]) -> None:
        raise Reject("no such job")

    await consume(bus, js, reject)
    assert dead_letters(js) == [("deadletter.c", "c", "rejected: no such job")]
    assert msg.told == [("term", None)]


async def test_an_event_failing_at_its_last_delivery_is_dead_lettered_and_logged(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus = make_bus(js, monkeypatch, max_deliver=5)
    envelope = an_event()
    last, before_last = event_msg(5, envelope), event_msg(4, envelope)
    js.record(before_last, failures=3)
    js.script = [[before_last], [last]]

    async def fail(got: Envelope[Payload]) -> None:
        raise ValueError("not yet")

    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"):
        await consume(bus, js, fail)
    assert before_last.told == [("nak", 4.0)]
    assert last.told == [("term", None)]
    assert dead_letters(js) == [("deadletter.c", "c", "failed 5 times: ValueError: not yet")]
    assert (
        f"c: {envelope.id} failed (failure 4 of 5, delivery 4), will retry: ValueError: not yet"
        in caplog.messages
    )
    assert (
        f"c: giving up on {envelope.id} after 5 failures (delivery 5): ValueError: not yet"
        in caplog.messages
    )


@pytest.mark.parametrize(
    ("delivered", "told"),
    [(4, ("nak", 4.0)), (5, ("nak", 30.0)), (6, ("nak", 30.0)), (7, ("term", None))],
)
async def test_an_event_that_follows_one_not_applied_yet_waits_past_ack_wait_then_dead_letters(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, delivered: int, told: tuple[str, Any]
) -> None:
    """The event it follows may be held by a replica that died: it comes back after
    ack_wait, so the last delivery (5) is followed by two more, ack_wait apart."""
    bus = make_bus(js, monkeypatch, max_deliver=5, retry_delay_seconds=0.5, ack_wait_seconds=30)
    msg = event_msg(delivered)
    js.record(msg, waits=delivered - 1)
    js.script = [[msg]]

    async def fail(got: Envelope[Payload]) -> None:
        raise NotYet("the grant is not recorded yet")

    await consume(bus, js, fail)
    assert msg.told == [told]
    expected = (
        []
        if told[0] == "nak"
        else [("deadletter.c", "c", "failed 7 times: NotYet: the grant is not recorded yet")]
    )
    assert dead_letters(js) == expected


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batches"])
async def test_events_a_process_may_not_apply_now_go_back_whole_never_dead_lettered(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """A scheduler deposed while it held a batch refuses it (``NotLeader``): that says
    nothing of the events. They were nak'ed as failures, one at a time, with growing delays,
    and one at its last delivery (redelivered before by crashes and stops) was dead-lettered:
    a submission or a job's end lost. Now the whole batch goes back at once, for the leader."""
    bus = make_bus(js, monkeypatch, max_deliver=5)
    last, newer = event_msg(5, an_event("j1"), seq=1), event_msg(1, an_event("j2"), seq=2)
    js.record(last, failures=4)
    js.script = [[last, newer]]
    tried: list[str] = []

    async def refuse(got: Envelope[Payload]) -> None:
        tried.append(got.subject)
        js.stop.set()  # the term ends as it is refused
        raise NotNow("this scheduler is not the leader")

    if batched:

        async def refuse_all(deliveries: Sequence[Delivery]) -> None:
            for delivery in deliveries:
                await refuse(delivery.envelope)

        await until_stopped(bus.consume_batches("c", ["trainyard.job.>"], refuse_all, js.stop))
    else:
        await consume(bus, js, refuse)
    assert tried == ["j1"]
    assert last.told == [("nak", None)]
    assert newer.told == [("nak", None)]
    assert dead_letters(js) == []
    # Recorded as handed back: no failure, nor a delivery without an outcome.
    assert js.tally(1) == {
        "msg_id": "",
        "failures": 4,
        "waits": 0,
        "handed_back": 1,
        "deliveries": [ANY],
    }
    assert js.tally(2) == {
        "msg_id": "",
        "failures": 0,
        "waits": 0,
        "handed_back": 1,
        "deliveries": [ANY],
    }


async def test_a_message_handed_back_often_is_handled_not_abandoned(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries handed back (``NotNow``, stops) have an outcome: they are not the ones a
    consumer died in, which alone count toward ``max_unfinished_deliveries``."""
    bus = make_bus(js, monkeypatch, max_unfinished_deliveries=20)
    msg = event_msg(41)
    js.record(msg, handed_back=25, failures=2, waits=2)  # and 11 with no outcome
    js.script = [[msg]]

    await consume(bus, js)
    assert msg.told == [("ack", None)]
    assert dead_letters(js) == []


async def test_a_message_delivered_too_often_without_an_outcome_is_dead_lettered_unhandled(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch, max_unfinished_deliveries=20)
    abandoned = event_msg(21, an_event("j1"), seq=1)
    at_the_limit = event_msg(20, an_event("j2"), seq=2)
    js.script = [[abandoned, at_the_limit]]
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.subject)

    await consume(bus, js, handle)
    assert handled == ["j2"]
    assert abandoned.told == [("term", None)]
    assert at_the_limit.told == [("ack", None)]
    assert dead_letters(js) == [
        (
            "deadletter.c",
            "c",
            "abandoned: 20 of its 20 earlier deliveries ended without an outcome (the "
            "consumer died while handling it, each time)",
        )
    ]


async def test_an_outage_in_the_handler_pauses_the_consumer_then_the_event_is_acknowledged(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    js.script = [[msg]]
    paused: list[dict[str, str]] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        paused.append(dict(bus.paused))
        if len(paused) == 1:
            raise nats.errors.NoRespondersError

    await consume(bus, js, handle)
    assert paused == [
        {},
        {"c": "NATS unavailable (NoRespondersError: nats: no responders available for request)"},
    ]
    assert msg.told == [("ack", None)]


async def test_a_stop_during_an_outage_in_the_handler_hands_the_event_back(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    js.script = [[msg]]

    async def handle(envelope: Envelope[Payload]) -> None:
        js.stop.set()
        raise nats.errors.NoRespondersError

    await consume(bus, js, handle)
    assert msg.told == [("nak", None)]
    assert js.published == []


async def test_events_are_tried_once_each_per_delivery_one_at_a_time(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    failing, fine = event_msg(envelope=an_event("j1")), event_msg(envelope=an_event("j2"))
    js.script = [[failing, fine]]
    tried: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        tried.append(envelope.subject)
        if envelope.subject == "j1":
            raise ValueError("not yet")

    await consume(bus, js, handle)
    assert tried == ["j1", "j2"]
    assert failing.told == [("nak", 0.5)]
    assert fine.told == [("ack", None)]


async def consume_batches(
    bus: Bus, js: FakeJetStream, handler: Callable[[Sequence[Delivery]], Any]
) -> None:
    await until_stopped(bus.consume_batches("c", ["trainyard.job.>"], handler, js.stop, batch=4))


async def test_a_batch_is_handed_over_whole_and_acknowledged(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msgs = [event_msg(envelope=an_event("j1")), event_msg(envelope=an_event("j2"))]
    js.script = [msgs]
    calls: list[list[str]] = []

    async def handle(deliveries: Sequence[Delivery]) -> None:
        calls.append([d.envelope.subject for d in deliveries])

    await consume_batches(bus, js, handle)
    assert calls == [["j1", "j2"]]
    assert [m.told for m in msgs] == [[("ack", None)], [("ack", None)]]


async def test_a_failed_batch_is_handled_again_one_event_at_a_time(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    bad, fine = event_msg(envelope=an_event("j1")), event_msg(envelope=an_event("j2"))
    js.script = [[bad, fine]]
    calls: list[list[str]] = []

    async def handle(deliveries: Sequence[Delivery]) -> None:
        calls.append([d.envelope.subject for d in deliveries])
        if any(d.envelope.subject == "j1" for d in deliveries):
            raise ValueError("bad")

    await consume_batches(bus, js, handle)
    assert calls == [["j1", "j2"], ["j1"], ["j2"]]
    assert bad.told == [("nak", 0.5)]
    assert fine.told == [("ack", None)]


async def test_a_batch_of_one_is_tried_once(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    js.script = [[msg]]
    calls: list[int] = []

    async def handle(deliveries: Sequence[Delivery]) -> None:
        calls.append(len(deliveries))
        raise ValueError("bad")

    await consume_batches(bus, js, handle)
    assert calls == [1]
    assert msg.told == [("nak", 0.5)]


async def test_a_batch_is_kept_in_progress_while_in_hand(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch, ack_wait_seconds=0.15)
    msg = event_msg()
    js.script = [[msg]]

    async def slow(envelope: Envelope[Payload]) -> None:
        await msg.kept.wait()  # returns once the bus told JetStream it is still at work

    await consume(bus, js, slow)
    assert msg.told == [("ack", None)]


async def test_a_settled_message_is_neither_kept_in_progress_nor_handed_back(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bus read nats-py's private ``msg._ackd`` to know which messages of a batch were
    settled; it now keeps that itself. The first message, acknowledged, is told nothing
    more while the second is still in hand (no in-progress beat, no hand-back); the second
    is kept in progress, then acknowledged."""
    bus = make_bus(js, monkeypatch, ack_wait_seconds=0.15)
    first, second = event_msg(envelope=an_event("j1")), event_msg(envelope=an_event("j2"))
    js.script = [[first, second]]

    async def slow_second(envelope: Envelope[Payload]) -> None:
        if envelope.subject == "j2":
            await second.kept.wait()
            second.kept.clear()
            await second.kept.wait()  # two beats: the first message had its chance too

    await consume(bus, js, slow_second)
    assert first.told == [("ack", None)] and first.kept_after_settled == 0
    assert second.told == [("ack", None)]


# --- what arrives: forged, redriven, traced -----------------------------------------------


async def test_an_event_on_another_subject_than_its_own_is_dead_lettered_as_forged(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg(subject="trainyard.job.cancel_requested.v1.other")
    js.script = [[msg]]
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.id)

    await consume(bus, js, handle)
    assert handled == []
    assert msg.told == [("term", None)]
    [(subject, consumer, reason)] = dead_letters(js)
    assert (subject, consumer) == ("deadletter.c", "c")
    assert reason.startswith("forged event: ")


async def test_a_redriven_event_on_the_consumers_redrive_subject_is_handled(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg(subject="trainyard.redrive.c")
    # As a redrive carries it: the subject its dead letter came on, its own.
    msg.headers = {ORIGINAL_SUBJECT_HEADER: an_event().nats_subject}
    js.script = [[msg]]
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.subject)

    await consume(bus, js, handle)
    assert handled == ["j1"]
    assert msg.told == [("ack", None)]


async def test_a_redrive_is_judged_by_the_subject_it_first_came_on(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forgery dead-lettered for its subject is as forged once redriven: the redrive
    subject is the consumer's own, but what vouched for the event was where it first came."""
    bus = make_bus(js, monkeypatch)
    first = "trainyard.job.cancel_requested.v1.other"
    redriven = event_msg(subject="trainyard.redrive.c")
    redriven.headers = {ORIGINAL_SUBJECT_HEADER: first}
    unnamed = event_msg(subject="trainyard.redrive.c", seq=2)
    js.script = [[redriven, unnamed]]
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.id)

    await consume(bus, js, handle)
    assert handled == []
    assert redriven.told == unnamed.told == [("term", None)]
    [(_, _, forged), (_, _, nameless)] = dead_letters(js)
    assert forged.startswith("forged event: ") and forged.endswith(f"not on {first}")
    assert nameless == "forged event: a redrive that does not name the subject it first came on"


async def test_the_handler_runs_inside_the_producers_trace(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace

    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    msg.headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    js.script = [[msg]]
    seen: list[int] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        seen.append(trace.get_current_span().get_span_context().trace_id)

    await consume(bus, js, handle)
    assert seen == [int(trace_id, 16)]


# --- the consumer asked for, acknowledgements lost ----------------------------------------


async def test_the_consumer_reads_its_subjects_and_its_redrive_subject_with_the_batch_as_limit(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch, ack_wait_seconds=7.0)
    await consume(bus, js, batch=3)
    [config] = js.configs
    assert config.durable_name == "c"
    assert config.filter_subject is None
    assert config.filter_subjects == ["trainyard.job.>", "trainyard.redrive.c"]
    assert config.ack_wait == 7.0
    assert config.max_ack_pending == 3
    # Unlimited deliveries (negative, or the server's default, which is unlimited): the
    # bus decides when to give up, with a reason.
    assert config.max_deliver is None or config.max_deliver < 0
    assert js.fetches and all(batch == 3 and timeout for batch, timeout in js.fetches)


async def test_without_redrive_one_subject_stays_one_filter(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    await consume(bus, js, redrive=False)
    [config] = js.configs
    assert config.filter_subject == "trainyard.job.>"
    assert config.filter_subjects is None


async def test_a_lost_acknowledgement_is_logged_and_the_consumer_goes_on(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    msg.metadata.sequence.stream = 7
    msg.ack_error = nats.errors.ConnectionClosedError()
    js.script = [[msg], []]
    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"):
        await consume(bus, js)
    assert "ack of message 7 lost: nats: connection closed" in caplog.messages


async def test_an_acknowledgement_refused_for_another_reason_ends_the_consumer(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    msg = event_msg()
    msg.ack_error = ValueError("refused")
    js.script = [[msg]]
    with pytest.raises(ValueError, match="refused"):
        await consume(bus, js)


# --- publishing ---------------------------------------------------------------------------


async def test_publish_sends_the_event_with_its_id_trace_and_headers_in_a_producer_span(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, spans: Any
) -> None:
    from opentelemetry import trace

    bus = make_bus(js, monkeypatch, publish_timeout_seconds=3.0)
    envelope = an_event()
    await bus.publish(envelope, {"Trainyard-Extra": "x"})
    [(subject, body, timeout, headers)] = js.published_raw
    assert (subject, body, timeout) == (envelope.nats_subject, envelope.to_json(), 3.0)
    assert headers["Nats-Msg-Id"] == envelope.id
    assert headers["Trainyard-Extra"] == "x"
    [span] = [s for s in spans.get_finished_spans() if s.name == f"{envelope.type} publish"]
    assert span.kind == trace.SpanKind.PRODUCER
    assert dict(span.attributes or {}) == _attrs(envelope)
    assert headers["traceparent"].split("-")[1] == f"{span.context.trace_id:032x}"


async def test_a_batch_waits_out_an_outage_whole_paused_and_goes_back_whole_on_stop(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)
    first = [event_msg(envelope=an_event("j1")), event_msg(envelope=an_event("j2"))]
    second = [event_msg(envelope=an_event("j3")), event_msg(envelope=an_event("j4"))]
    js.script = [first, second]
    paused: list[dict[str, str]] = []

    async def handle(deliveries: Sequence[Delivery]) -> None:
        paused.append(dict(bus.paused))
        if deliveries[0].envelope.subject == "j3":
            js.stop.set()  # the service stops during the second batch's outage
            raise nats.errors.NoRespondersError
        if len(paused) == 1:
            raise nats.errors.NoRespondersError

    await consume_batches(bus, js, handle)
    assert paused[:2] == [{}, {"c": NATS_AWAY}]
    assert [m.told for m in first] == [[("ack", None)], [("ack", None)]]
    assert [m.told for m in second] == [[("nak", None)], [("nak", None)]]


async def test_a_batch_consumer_reads_its_redrive_subject_too(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = make_bus(js, monkeypatch)

    async def handle(deliveries: Sequence[Delivery]) -> None:
        pass

    await consume_batches(bus, js, handle)
    [config] = js.configs
    assert config.filter_subjects == ["trainyard.job.>", "trainyard.redrive.c"]


def test_a_bus_made_around_a_client_that_reconnected_before_counts_from_when_it_was_made(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [T0]
    monkeypatch.setattr(bus_module, "_utc_now", lambda: now[0])
    nc = FakeNats(js)
    nc.stats["reconnects"] = 2  # before this bus was made around it
    bus = Bus(nc, NatsSettings())  # type: ignore[arg-type]
    now[0] = T0 + timedelta(seconds=5)
    assert bus.connected_since == T0


async def test_each_dead_letter_is_counted_by_consumer_and_kind(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = InMemoryMetricReader()
    bus = make_bus(js, monkeypatch, meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    js.script = [[bad_msg(1), event_msg()]]

    async def reject(envelope: Envelope[Payload]) -> None:
        raise Reject("no such job")

    await consume(bus, js, reject)
    counted: dict[tuple[str, str], float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "trainyard.consumer.dead_letters":
                    for point in metric.data.data_points:
                        attrs = dict(point.attributes or {})
                        counted[(str(attrs["consumer"]), str(attrs["kind"]))] = point.value  # type: ignore[union-attr]
    # Every kind is reported from the consumer's start (shared.bus.DEAD_LETTER_KINDS).
    assert counted == {("c", k): 0 for k in DEAD_LETTER_KINDS} | {
        ("c", "unparseable"): 1,
        ("c", "rejected"): 1,
    }


async def test_a_dead_letter_withholds_the_values_a_database_error_quotes(
    js: FakeJetStream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus = make_bus(js, monkeypatch, max_deliver=1)
    js.script = [[event_msg(1, an_event())]]
    error = asyncpg.InvalidTextRepresentationError('invalid input syntax for type uuid: "alice"')
    error.column_name = "owner"

    async def fail(got: Envelope[Payload]) -> None:
        raise error

    with caplog.at_level(logging.ERROR, logger="trainyard_platform.shared.bus"):
        await consume(bus, js, fail)
    ((_, _, reason),) = dead_letters(js)
    assert reason == (
        "failed 1 times: InvalidTextRepresentationError: "
        "SQLSTATE 22P02 on column owner (message withheld)"
    )
    assert any('type uuid: "alice"' in m for m in caplog.messages)  # the log keeps it
