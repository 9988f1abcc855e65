"""The bus's consumers on a real NATS JetStream (``shared.bus``): the durable consumer they
make, the spans of publishing and handling in one trace, a message abandoned too often
dead-lettered before it is handled again, and a failed batch handled one event at a time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.msg import Msg
from nats.js import api
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

import trainyard_platform.shared.bus as bus_module
from tests.fixtures.servers import lose_stream
from trainyard_platform.deploy.local.nats import NatsServer, NatsUser
from trainyard_platform.shared.bus import (
    MAX_HEADERS_BYTES,
    ORIGINAL_SUBJECT_HEADER,
    REASON_HEADER,
    TRUNCATED_HEADER,
    Bus,
    Delivery,
    NotNow,
    NotYet,
    Reject,
)
from trainyard_platform.shared.deadletters import CannotRedrive, DeadLetters
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

SUBJECT = nats_subject(JobCancelRequested)


def event(job_id: str) -> Envelope[Payload]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


@pytest.fixture
async def own_settings(nats_settings: NatsSettings) -> AsyncIterator[NatsSettings]:
    """Bus settings with streams of this test's own (deleted at its end). The tests share one
    NATS server; a stream deleted and made again at once under the same name has been seen
    to hold, or take back, the previous test's messages, so tests that count messages use
    streams no other test has used."""
    tag = uuid.uuid4().hex[:12].upper()
    settings = nats_settings.model_copy(
        update={
            "stream": f"EVENTS_{tag}",
            "deadletter_stream": f"DEAD_{tag}",
            "attempts_stream": f"ATTEMPTS_{tag}",
        }
    )
    yield settings
    nc = await nats.connect(nats_settings.url)
    try:
        for stream in (settings.stream, settings.deadletter_stream, settings.attempts_stream):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await lose_stream(nc.jetstream(), stream)
    finally:
        await nc.close()


@pytest.fixture
async def own_bus(own_settings: NatsSettings) -> AsyncIterator[Bus]:
    """A connected bus on streams of this test's own."""
    async with Bus.connect(own_settings, "test") as connected:
        yield connected


async def settled(bus: Bus, consumer: str) -> api.ConsumerInfo:
    """The consumer's info once the server has every message of it settled and nothing more
    waiting (acknowledgements and terminations are sent without a reply, so the server may
    count them a moment later); fails after 10 s."""
    async with asyncio.timeout(10):
        while True:
            info: api.ConsumerInfo = await bus.jetstream.consumer_info(
                bus.settings.stream, consumer
            )
            if not info.num_ack_pending and not info.num_pending:
                return info
            await asyncio.sleep(0.02)


async def consume_once(bus: Bus, consumer: str, redrive: bool = True, batch: int = 16) -> None:
    """Run ``consume`` until the first event is handled."""
    stop = asyncio.Event()

    async def handle(envelope: Envelope[Payload]) -> None:
        stop.set()

    async with asyncio.timeout(10):
        await bus.consume(consumer, [SUBJECT], handle, stop, batch, redrive=redrive)


async def test_the_durable_consumer_is_made_as_the_rules_say(
    own_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    bus = own_bus
    await bus.publish(event("j1"))
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        await consume_once(bus, "with-redrive", batch=7)
    # A new consumer holds nothing back: nothing of an earlier one is unacknowledged.
    assert [
        r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"
    ] == []
    config = (await bus.jetstream.consumer_info(bus.settings.stream, "with-redrive")).config
    assert config.durable_name == "with-redrive"
    assert config.filter_subject is None
    assert config.filter_subjects == [SUBJECT, "trainyard.redrive.with-redrive"]
    assert config.ack_policy == api.AckPolicy.EXPLICIT
    assert config.deliver_policy == api.DeliverPolicy.ALL
    assert config.max_deliver == -1
    assert config.ack_wait == 5.0  # the tests' settings
    assert config.max_ack_pending == 7

    await consume_once(bus, "without-redrive", redrive=False)
    config = (await bus.jetstream.consumer_info(bus.settings.stream, "without-redrive")).config
    assert config.filter_subject == SUBJECT
    assert not config.filter_subjects


async def test_publishing_and_handling_are_spans_of_the_producers_trace(
    own_bus: Bus, spans: InMemorySpanExporter
) -> None:
    bus = own_bus
    one = event("traced")
    with trace.get_tracer("test").start_as_current_span("submit") as root:
        await bus.publish(one)
    await consume_once(bus, "traced-consumer")
    finished = {s.name: s for s in spans.get_finished_spans()}
    publish = finished[f"{one.type} publish"]
    process = finished[f"{one.type} process"]
    trace_id = root.get_span_context().trace_id
    assert publish.context.trace_id == trace_id and process.context.trace_id == trace_id
    assert publish.kind == trace.SpanKind.PRODUCER
    assert process.kind == trace.SpanKind.CONSUMER
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    expected = {
        "messaging.system": "nats",
        "messaging.destination.name": one.nats_subject,
        "messaging.message.id": one.id,
        "cloudevents.event_type": one.type,
        "cloudevents.event_subject": "traced",
    }
    assert dict(publish.attributes or {}) == expected
    assert dict(process.attributes or {}) == {
        **expected,
        "messaging.consumer.group.name": "traced-consumer",
    }


async def delivered(bus: Bus, times: int) -> Msg:
    """The stream's one message, delivered ``times`` times to the durable ``abandoned``
    without an outcome (each delivery handed back at once, as by a consumer that died)."""
    await bus.jetstream.add_consumer(
        bus.settings.stream,
        api.ConsumerConfig(
            durable_name="abandoned",
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subject=SUBJECT,
            max_deliver=-1,
        ),
    )
    sub = await bus.jetstream.pull_subscribe_bind(durable="abandoned", stream=bus.settings.stream)
    for _ in range(times - 1):
        [msg] = await sub.fetch(1, timeout=5)
        await msg.nak()
    [msg] = await sub.fetch(1, timeout=5)
    await sub.unsubscribe()  # the message is settled through its reply subject all the same
    assert msg.metadata.num_delivered == times
    return msg


@pytest.mark.parametrize(("times", "dead"), [(3, True), (2, False)])
async def test_a_message_abandoned_too_often_is_dead_lettered_before_it_is_handled(
    own_settings: NatsSettings, times: int, dead: bool
) -> None:
    settings = own_settings.model_copy(update={"max_unfinished_deliveries": 2})
    async with Bus.connect(settings, "abandon-test") as bus:
        first_dead = 1
        await bus.publish(event("again"))
        msg = await delivered(bus, times)
        handled: list[str] = []

        async def handle(deliveries: Sequence[Delivery]) -> None:
            handled.extend(d.envelope.subject for d in deliveries)

        await bus._handle_batch("abandoned", [msg], handle, asyncio.Event(), atomic=False)
        dead_letters = (
            await bus.jetstream.stream_info(bus.settings.deadletter_stream)
        ).state.messages
        if dead:
            assert handled == [] and dead_letters == 1
            letter = await bus.jetstream.get_msg(bus.settings.deadletter_stream, first_dead)
            assert letter.headers is not None
            assert letter.headers[REASON_HEADER] == (
                "abandoned: 2 of its 2 earlier deliveries ended without an outcome (the "
                "consumer died while handling it, each time)"
            )
        else:
            assert handled == ["again"] and dead_letters == 0
        await settled(bus, "abandoned")  # either way: terminated or acknowledged
        await bus.jetstream.delete_consumer(bus.settings.stream, "abandoned")


async def test_a_failed_batch_is_handled_again_one_event_at_a_time(
    own_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    bus = own_bus
    for job_id in ("a", "b", "c"):
        await bus.publish(event(job_id))
    stop = asyncio.Event()
    calls: list[list[str]] = []

    async def handle(deliveries: Sequence[Delivery]) -> None:
        calls.append([d.envelope.subject for d in deliveries])
        if len(deliveries) > 1:
            raise RuntimeError("one of them is bad")
        if sum(len(c) == 1 for c in calls) == 3:
            stop.set()

    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        async with asyncio.timeout(10):
            await bus.consume_batches("batch-test", [SUBJECT], handle, stop)
    assert calls == [["a", "b", "c"], ["a"], ["b"], ["c"]]
    assert "batch of 3 failed (one of them is bad); handling them one at a time" in [
        r.getMessage() for r in caplog.records
    ]
    await settled(bus, "batch-test")


def handled_metric(reader: InMemoryMetricReader) -> dict[str, float]:
    """``trainyard.events.handled`` by outcome, and how many handling times were recorded."""
    data = reader.get_metrics_data()
    found: dict[str, float] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for one in scope.metrics:
                for point in one.data.data_points:
                    labels = dict(point.attributes or {})
                    if one.name == "trainyard.events.handled":
                        outcome = str(labels["outcome"])
                        found[outcome] = found.get(outcome, 0) + point.value  # type: ignore[union-attr]
                    elif one.name == "trainyard.events.handling.duration":
                        found["timed"] = found.get("timed", 0) + point.count  # type: ignore[union-attr]
    return found


async def test_each_event_s_outcome_is_counted_once(own_settings: NatsSettings) -> None:
    """A batch of three failed, was handled again one event at a time (a, c applied; b failed
    twice, then dead-lettered), and a dependency was away for one attempt of a. Counted on
    the handler before: the failed batch as three events failed, the outage's attempt as a
    failure, and a and c a second time, as handled. Now each delivery counts its one outcome
    (a and c ok, b failed on its first delivery and dead-lettered on its second), and a
    handling time only for what was applied, once each."""
    settings = own_settings.model_copy(
        update={
            "max_deliver": 2,
            "retry_delay_seconds": 0.01,
            "outage_retry_initial_seconds": 0.01,
            "outage_retry_max_seconds": 0.02,
        }
    )
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    async with Bus.connect(settings, "outcomes", meter=meter) as bus:
        for job_id in ("a", "b", "c"):
            await bus.publish(event(job_id))
        stop = asyncio.Event()
        alone: list[str] = []

        async def handle(deliveries: Sequence[Delivery]) -> None:
            if len(deliveries) > 1:
                raise RuntimeError("one of them is bad")
            alone.append(deliveries[0].envelope.subject)
            if alone == ["a"]:
                raise ConnectionRefusedError(111, "PostgreSQL is down")
            if alone[-1] == "b":
                if alone.count("b") == 2:
                    stop.set()
                raise RuntimeError("b is bad")

        async with asyncio.timeout(10):
            await bus.consume_batches("outcomes", [SUBJECT], handle, stop)
    assert alone == ["a", "a", "b", "c", "b"]
    assert handled_metric(reader) == {"ok": 2, "failed": 1, "dead_lettered": 1, "timed": 2}


async def test_a_batch_that_succeeds_is_acknowledged_whole_and_handled_once(own_bus: Bus) -> None:
    bus = own_bus
    for job_id in ("a", "b", "c"):
        await bus.publish(event(job_id))
    stop = asyncio.Event()
    calls: list[list[str]] = []

    async def handle(deliveries: Sequence[Delivery]) -> None:
        calls.append([d.envelope.subject for d in deliveries])
        stop.set()

    async with asyncio.timeout(10):
        await bus.consume_batches("whole-batch", [SUBJECT], handle, stop)
    assert calls == [["a", "b", "c"]]
    info = await settled(bus, "whole-batch")
    assert info.config.max_ack_pending == 64  # the default batch


async def test_one_at_a_time_a_failure_costs_the_events_before_it_nothing(own_bus: Bus) -> None:
    bus = own_bus
    for job_id in ("a", "b", "c"):
        await bus.publish(event(job_id))
    stop = asyncio.Event()
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.subject)
        if handled.count("b") == 1 and envelope.subject == "b":
            raise RuntimeError("not yet")
        if envelope.subject == "b":
            stop.set()

    async with asyncio.timeout(10):
        await bus.consume("singles", [SUBJECT], handle, stop)
    assert handled[:3] == ["a", "b", "c"] and handled.count("a") == 1
    info = await bus.jetstream.consumer_info(bus.settings.stream, "singles")
    assert info.config.max_ack_pending == 16  # the default batch


async def test_a_batch_waits_out_an_outage_whole(
    own_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = own_settings.model_copy(
        update={"outage_retry_initial_seconds": 0.01, "outage_retry_max_seconds": 0.02}
    )
    async with Bus.connect(settings, "batch-outage") as bus:
        for job_id in ("a", "b"):
            await bus.publish(event(job_id))
        stop = asyncio.Event()
        calls: list[list[str]] = []
        paused: list[dict[str, str]] = []

        async def handle(deliveries: Sequence[Delivery]) -> None:
            calls.append([d.envelope.subject for d in deliveries])
            paused.append(dict(bus.paused))
            if len(calls) < 3:
                raise ConnectionRefusedError(111, "PostgreSQL is down")
            stop.set()

        with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"):
            async with asyncio.timeout(10):
                await bus.consume_batches("outage-batch", [SUBJECT], handle, stop)
    assert calls == [["a", "b"]] * 3
    fault = "unreachable or timed out (ConnectionRefusedError: [Errno 111] PostgreSQL is down)"
    assert paused == [{}, {"outage-batch": fault}, {"outage-batch": fault}]
    assert f"outage-batch: paused, waiting out an outage: {fault}" in [
        r.getMessage() for r in caplog.records
    ]


async def test_settling_a_message_on_a_closed_connection_is_left_to_ack_wait(
    own_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    async with Bus.connect(own_settings, "closing") as bus:
        await bus.publish(event("a"))
        await bus.publish(event("b"))
        await bus.jetstream.add_consumer(
            bus.settings.stream,
            api.ConsumerConfig(durable_name="closing", ack_policy=api.AckPolicy.EXPLICIT),
        )
        sub = await bus.jetstream.pull_subscribe_bind(durable="closing", stream=bus.settings.stream)
        first, second = await sub.fetch(2, timeout=5)
        await bus.nats.close()
        with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
            await bus._hand_back("closing", first)
            await bus._ack(second)
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert messages[0] == f"message {first.metadata.sequence.stream} goes back after ack_wait"
    assert messages[1] == (
        f"ack of message {second.metadata.sequence.stream} lost: nats: connection closed"
    )


async def test_settling_a_message_twice_is_a_bug_not_an_outage(own_bus: Bus) -> None:
    bus = own_bus
    await bus.publish(event("a"))
    await bus.publish(event("b"))
    await bus.jetstream.add_consumer(
        bus.settings.stream,
        api.ConsumerConfig(durable_name="twice", ack_policy=api.AckPolicy.EXPLICIT),
    )
    sub = await bus.jetstream.pull_subscribe_bind(durable="twice", stream=bus.settings.stream)
    first, second = await sub.fetch(2, timeout=5)
    await first.ack()
    await second.ack()
    with pytest.raises(nats.errors.MsgAlreadyAckdError):
        await bus._hand_back("twice", first)
    with pytest.raises(nats.errors.MsgAlreadyAckdError):
        await bus._ack(second)


async def test_what_a_dead_consumer_held_comes_back_before_anything_newer(
    own_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = own_settings.model_copy(update={"ack_wait_seconds": 1.0})
    async with Bus.connect(settings, "held") as bus:
        # The consumer exists (as a running service made it) ...
        await bus.publish(event("first"))
        await consume_once(bus, "held", batch=4)
        # ... and died holding two messages it never settled.
        await bus.publish(event("a"))
        await bus.publish(event("b"))
        sub = await bus.jetstream.pull_subscribe_bind(durable="held", stream=bus.settings.stream)
        held = await sub.fetch(2, timeout=5)
        assert [m.metadata.num_delivered for m in held] == [1, 1]
        await sub.unsubscribe()
        await bus.publish(event("newer"))

        stop = asyncio.Event()
        handled: list[str] = []

        async def handle(envelope: Envelope[Payload]) -> None:
            handled.append(envelope.subject)

        async def batch_limit() -> int:
            info = await bus.jetstream.consumer_info(bus.settings.stream, "held")
            return info.config.max_ack_pending or 0

        caplog.set_level(logging.INFO, logger="trainyard_platform.shared.bus")
        task = asyncio.create_task(bus.consume("held", [SUBJECT], handle, stop, 4))
        try:
            async with asyncio.timeout(20):
                while len(handled) < 3:
                    await asyncio.sleep(0.02)
                # Once they were settled the consumer takes whole batches again.
                while await batch_limit() != 4:
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await task
        assert handled == ["a", "b", "newer"]
    assert unsettled_line("held", 2) in [r.getMessage() for r in caplog.records]


def unsettled_line(consumer: str, count: int) -> str:
    """What a consumer logs when it starts with messages delivered before not yet settled."""
    return (
        f"{consumer}: {count} messages delivered before this start are not settled yet: "
        "nothing newer until they are (one handed back on a stop comes at once, one held by a "
        "consumer that died after ack_wait)"
    )


async def test_a_stop_while_nats_is_away_ends_the_consumer_cleanly(
    own_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = own_settings.model_copy(
        update={"outage_retry_initial_seconds": 0.01, "outage_retry_max_seconds": 0.02}
    )
    async with Bus.connect(settings, "cut-off-consumer") as bus:
        await bus.publish(event("one"))
        stop = asyncio.Event()
        handled: list[str] = []

        async def handle(envelope: Envelope[Payload]) -> None:
            handled.append(envelope.subject)

        with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
            task = asyncio.create_task(bus.consume("away", [SUBJECT], handle, stop))
            try:
                async with asyncio.timeout(10):
                    while bus.hearing("away") is None:
                        await asyncio.sleep(0.02)
                    await bus.nats.close()  # NATS away: every fetch fails
                    while "away" not in bus.paused:
                        await asyncio.sleep(0.02)
            finally:
                stop.set()
                async with asyncio.timeout(10):
                    await task  # returns: no error from the fetch, its gap, or the cleanup
        assert handled == ["one"]
        assert bus.hearing("away") is None and bus.paused == {}
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert any(
        m.startswith("away: paused, waiting out an outage: NATS unavailable") for m in messages
    )


async def test_a_service_waits_for_the_streams_however_long_and_says_who_makes_them(
    bus: Bus,
    nats_server: NatsServer,
    nats_settings: NatsSettings,
    nats_service_user: Callable[..., NatsUser],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A service whose NATS user may not make the streams waited 120 s for them and then
    exited: with the scheduler down a while (a deploy, a crash loop of its own), every other
    service stopped too, and a supervisor that gives up left them down. It waits now, with
    capped back-off, saying why, and goes on by itself once the scheduler made them."""
    user = nats_service_user("registry")
    settings = nats_settings.model_copy(
        update={
            "url": nats_server.address,
            "user": user.name,
            "password": SecretStr(user.password),
            "outage_retry_initial_seconds": 0.05,
            "outage_retry_max_seconds": 0.2,
        }
    )
    async with Bus.connect(settings, "registry-under-test") as service:
        await lose_stream(bus.jetstream, "TRAINYARD")
        with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"):
            waiting = asyncio.create_task(service.ensure_streams())
            async with asyncio.timeout(10):
                while not any("waiting for stream TRAINYARD" in m for m in caplog.messages):
                    assert not waiting.done(), waiting
                    await asyncio.sleep(0.05)
            assert not waiting.done()
            await bus.ensure_streams()  # the scheduler is back
            async with asyncio.timeout(10):
                await waiting
    said = [m for m in caplog.messages if "stream TRAINYARD" in m]
    assert said[0].startswith(
        "waiting for stream TRAINYARD: it does not exist yet (the NATS user 'scheduler' "
        "makes it); 0 s so far, next try in "
    )
    assert said[-1].startswith("stream TRAINYARD is there after ")


def dead_letter_metric(reader: InMemoryMetricReader) -> list[tuple[dict[str, Any], float]]:
    data = reader.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for one in scope.metrics:
                if one.name == "trainyard.consumer.dead_letters":
                    for point in one.data.data_points:
                        if point.value:  # type: ignore[union-attr]  # every kind starts at 0
                            found.append((dict(point.attributes or {}), point.value))  # type: ignore[union-attr]
    return found


async def test_a_dead_letter_is_counted_logged_and_its_reason_kept_to_one_line(
    own_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    async with Bus.connect(own_settings, "counted", meter=meter) as bus:
        poison = event("poison")
        # A header the dead-letter stream would refuse, were it copied over.
        stored = await bus.publish_raw(
            poison.nats_subject,
            poison.to_json(),
            poison.id,
            {"Nats-Expected-Stream": bus.settings.stream},
        )
        stop = asyncio.Event()

        async def reject(envelope: Envelope[Payload]) -> None:
            stop.set()
            raise Reject("the job " + "x" * 1500)

        with caplog.at_level(logging.ERROR, logger="trainyard_platform.shared.bus"):
            async with asyncio.timeout(10):
                await bus.consume("counted", [SUBJECT], reject, stop)
        letter = await bus.jetstream.get_msg(bus.settings.deadletter_stream, 1)
    assert letter.headers is not None
    reason = letter.headers[REASON_HEADER]
    assert reason == ("rejected: the job " + "x" * 1500)[:1000]
    assert "Nats-Expected-Stream" not in letter.headers
    assert dead_letter_metric(reader) == [({"consumer": "counted", "kind": "rejected"}, 1)]
    assert [
        r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"
    ] == [f"counted: dead-lettered message {stored.seq} from {poison.nats_subject}: {reason}"]


async def test_a_redrive_without_its_origin_is_dead_lettered_keeping_the_subject_it_came_on(
    own_bus: Bus,
) -> None:
    """A redrive is judged by the subject it first came on, which the dead letter it was
    made from names: one that names none is not believed (its handler never runs), and its
    dead letter names the redrive subject it came on."""
    bus = own_bus
    poison = event("redriven")
    redrive = "trainyard.redrive.again"
    await bus.publish_raw(redrive, poison.to_json(), poison.id, {})
    stop = asyncio.Event()
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.id)

    task = asyncio.create_task(bus.consume("again", [SUBJECT], handle, stop))
    try:
        async with asyncio.timeout(10):
            stream = bus.settings.deadletter_stream
            while (await bus.jetstream.stream_info(stream)).state.messages == 0:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    letter = await bus.jetstream.get_msg(bus.settings.deadletter_stream, 1)
    assert letter.headers is not None
    assert letter.headers[ORIGINAL_SUBJECT_HEADER] == redrive
    assert letter.headers[REASON_HEADER] == (
        "forged event: a redrive that does not name the subject it first came on"
    )
    assert handled == []


async def test_a_stop_while_the_dead_letter_cannot_be_written_hands_the_message_back(
    own_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = own_settings.model_copy(
        update={"outage_retry_initial_seconds": 0.01, "outage_retry_max_seconds": 0.02}
    )
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    async with Bus.connect(settings, "cut-off", meter=meter) as bus:
        await bus.publish(event("poison"))
        await bus.jetstream.add_consumer(
            bus.settings.stream,
            api.ConsumerConfig(durable_name="cut", ack_policy=api.AckPolicy.EXPLICIT),
        )
        sub = await bus.jetstream.pull_subscribe_bind(durable="cut", stream=bus.settings.stream)
        [msg] = await sub.fetch(1, timeout=5)
        stop = asyncio.Event()
        bus._stops["cut"] = stop  # as a running consumer registers its stop
        await bus.nats.close()  # NATS away: the dead letter cannot be written

        async def stop_once_paused() -> None:
            while "cut" not in bus.paused:
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.create_task(stop_once_paused())
        with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
            async with asyncio.timeout(10):
                await bus._dead_letter("cut", msg, "rejected: unknown job")
        await stopper
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert messages[0].startswith("cut: paused, waiting out an outage: NATS unavailable")
    assert f"message {msg.metadata.sequence.stream} goes back after ack_wait" in messages
    assert not any("dead-lettered" in m for m in messages)
    assert dead_letter_metric(reader) == []


async def test_a_stop_while_a_batch_waits_out_an_outage_hands_the_batch_back(
    own_settings: NatsSettings,
) -> None:
    settings = own_settings.model_copy(
        update={"outage_retry_initial_seconds": 0.01, "outage_retry_max_seconds": 0.02}
    )
    async with Bus.connect(settings, "batch-stop") as bus:
        for job_id in ("a", "b"):
            await bus.publish(event(job_id))
        stop = asyncio.Event()
        calls: list[list[str]] = []

        async def handle(deliveries: Sequence[Delivery]) -> None:
            calls.append([d.envelope.subject for d in deliveries])
            if len(calls) == 2:
                stop.set()
            raise ConnectionRefusedError(111, "PostgreSQL is down")

        async with asyncio.timeout(10):
            await bus.consume_batches("stopped-batch", [SUBJECT], handle, stop)
        # Handed back whole, neither applied one at a time nor dead-lettered.
        assert calls == [["a", "b"], ["a", "b"]]
        dead = await bus.jetstream.stream_info(bus.settings.deadletter_stream)
        assert dead.state.messages == 0


async def test_a_consumer_whose_stream_was_lost_makes_it_again_and_goes_on(
    own_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    bus = own_bus
    await bus.publish(event("before"))
    stop = asyncio.Event()
    handled: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.subject)
        if envelope.subject == "after":
            stop.set()

    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        task = asyncio.create_task(bus.consume("survivor", [SUBJECT], handle, stop))
        try:
            async with asyncio.timeout(20):
                while handled != ["before"]:
                    await asyncio.sleep(0.02)
                first = await bus.stream_created()
                await lose_stream(bus.jetstream, bus.settings.stream)  # NATS lost its store
                while (
                    "survivor: the durable consumer is gone (stream lost?); making it again"
                    not in [r.getMessage() for r in caplog.records]
                ):
                    await asyncio.sleep(0.02)
                while True:  # made again: the stream, then the consumer
                    try:
                        await bus.jetstream.consumer_info(bus.settings.stream, "survivor")
                        break
                    except nats.js.errors.NotFoundError:
                        await asyncio.sleep(0.02)
                await bus.publish(event("after"))
                await task
        finally:
            stop.set()
            await task
    assert handled == ["before", "after"]
    assert await bus.stream_created() != first
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert any(
        m.startswith("survivor: paused, waiting out an outage: NATS unavailable (ConsumerLostError")
        for m in messages
    )


async def test_a_full_batch_is_not_yet_caught_up(own_bus: Bus) -> None:
    bus = own_bus
    await bus.publish(event("one"))
    await bus.publish(event("two"))
    stop = asyncio.Event()
    heard: dict[str, object] = {}

    async def handle(envelope: Envelope[Payload]) -> None:
        # Each fetch brings one message, a full batch: nothing says the stream is drained.
        heard[envelope.subject] = bus.hearing("one-by-one")
        if envelope.subject == "two":
            stop.set()

    async with asyncio.timeout(10):
        await bus.consume("one-by-one", [SUBJECT], handle, stop, 1)
    assert heard == {"one": None, "two": None}


async def test_hearing_starts_again_with_each_run_of_a_consumer(own_bus: Bus) -> None:
    bus = own_bus
    for run in ("first", "second"):
        await bus.publish(event(run))
        stop = asyncio.Event()
        started = datetime.now(UTC)
        task = asyncio.create_task(bus.consume("again-and-again", [SUBJECT], _noop, stop))
        try:
            async with asyncio.timeout(10):
                while bus.hearing("again-and-again") is None:
                    await asyncio.sleep(0.02)
            hearing = bus.hearing("again-and-again")
            assert hearing is not None and hearing.since >= started
        finally:
            stop.set()
            await task


async def _noop(envelope: Envelope[Payload]) -> None:
    return None


async def next_consumer_gets(settings: NatsSettings, consumer: str, batch: int) -> list[str]:
    """What a consumer started now on ``consumer`` handles first; fails after 20 s (the
    tests' ``ack_wait`` is 60 s: a message left to it would not come in time)."""
    async with Bus.connect(settings, "next") as bus:
        again = asyncio.Event()
        got: list[str] = []

        async def up(deliveries: Sequence[Delivery]) -> None:
            got.extend(d.envelope.subject for d in deliveries)
            again.set()

        task = asyncio.create_task(bus.consume_batches(consumer, [SUBJECT], up, again, batch))
        try:
            async with asyncio.timeout(20):
                await again.wait()
        finally:
            again.set()
            await task
    return got


HANDING_BACK = {
    "ack_wait_seconds": 60.0,
    "outage_retry_initial_seconds": 0.01,
    "outage_retry_max_seconds": 0.02,
}


@pytest.mark.parametrize("batch", [1, 16])
async def test_a_message_held_when_a_consumer_stops_goes_at_once_to_the_next(
    own_settings: NatsSettings, batch: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer stopped while it waits out an outage with a message in hand hands it back:
    the next consumer gets it at once, not after ``ack_wait``, and its start says that it
    may (the server counts the message unacknowledged until it is delivered again)."""
    settings = own_settings.model_copy(update=HANDING_BACK)
    async with Bus.connect(settings, "handing-back") as bus:
        await bus.publish(event("held"))
        stop = asyncio.Event()

        async def down(deliveries: Sequence[Delivery]) -> None:
            if "handed" in bus.paused:
                stop.set()
            raise ConnectionRefusedError(111, "PostgreSQL is down")

        async with asyncio.timeout(10):
            await bus.consume_batches("handed", [SUBJECT], down, stop, batch)
    caplog.set_level(logging.INFO, logger="trainyard_platform.shared.bus")
    assert await next_consumer_gets(settings, "handed", batch) == ["held"]
    said = [r.getMessage() for r in caplog.records if "before this start" in r.getMessage()]
    # A batch of 1 is its limit already: nothing to lower, nothing said.
    assert said == ([] if batch == 1 else [unsettled_line("handed", 1)])


@pytest.mark.parametrize("batch", [1, 16])
async def test_a_message_held_when_a_consumer_is_cancelled_goes_at_once_to_the_next(
    own_settings: NatsSettings, batch: int
) -> None:
    """A consumer cancelled with a message in hand (its service's stop grace ran out while
    an attempt waited on PostgreSQL) hands it back too."""
    settings = own_settings.model_copy(update=HANDING_BACK)
    async with Bus.connect(settings, "cancelled") as bus:
        await bus.publish(event("held"))
        waiting = asyncio.Event()

        async def hangs(deliveries: Sequence[Delivery]) -> None:
            waiting.set()
            await asyncio.Event().wait()  # a connect that does not answer

        task = asyncio.create_task(
            bus.consume_batches("cancelled", [SUBJECT], hangs, asyncio.Event(), batch)
        )
        async with asyncio.timeout(10):
            await waiting.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert await next_consumer_gets(settings, "cancelled", batch) == ["held"]


async def test_an_event_that_follows_one_a_dead_replica_held_waits_for_it(
    own_settings: NatsSettings,
) -> None:
    """Two replicas share a durable consumer. The one that took the earlier event hangs and
    dies without settling it, so that event comes back only after ``ack_wait``; meanwhile
    the other takes the event that follows it (billing: a release after its grant; the
    registry: a success after its start), whose handler says the earlier one is not applied
    yet. Retried ``max_deliver`` times in a fraction of ``ack_wait``, it was dead-lettered:
    a bill or a model version lost. It must wait for the earlier event and be applied."""
    settings = own_settings.model_copy(
        update={"ack_wait_seconds": 2.0, "retry_delay_seconds": 0.05, "max_deliver": 3}
    )
    applied: list[str] = []
    holder: list[str] = []
    held = asyncio.Event()

    def handler(replica: str) -> Callable[[Envelope[Payload]], Any]:
        async def handle(envelope: Envelope[Payload]) -> None:
            if envelope.subject == "first" and not holder:
                holder.append(replica)
                held.set()
                await asyncio.Event().wait()  # hangs with it in hand, until it dies
            if envelope.subject == "second" and "first" not in applied:
                raise NotYet("the first event is not applied yet")
            applied.append(envelope.subject)

        return handle

    async with (
        Bus.connect(settings, "replica-a") as bus_a,
        Bus.connect(settings, "replica-b") as bus_b,
    ):
        buses = {"a": bus_a, "b": bus_b}
        stops = {name: asyncio.Event() for name in buses}
        tasks = {
            name: asyncio.create_task(
                bus.consume("pair", [SUBJECT], handler(name), stops[name], batch=4)
            )
            for name, bus in buses.items()
        }
        try:
            async with asyncio.timeout(10):  # both replicas bound and asking for messages
                while await _waiting_pulls(bus_a, settings.stream, "pair") < 2:
                    await asyncio.sleep(0.05)
            await bus_a.publish(event("first"))
            async with asyncio.timeout(10):
                await held.wait()
            (dead,) = holder
            live = "b" if dead == "a" else "a"
            # It dies: its connection is gone, so it neither acknowledges nor hands back.
            await buses[dead].nats.close()
            tasks[dead].cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await tasks[dead]
            await asyncio.sleep(0.6)  # its last pull request has expired: the live one takes
            await buses[live].publish(event("second"))
            async with asyncio.timeout(30):
                while "second" not in applied:
                    dead_letters = await buses[live].jetstream.stream_info(
                        settings.deadletter_stream
                    )
                    assert dead_letters.state.messages == 0, "the second event dead-lettered"
                    await asyncio.sleep(0.05)
        finally:
            for name in buses:
                stops[name].set()
            for task in tasks.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    assert applied == ["first", "second"]


@pytest.mark.parametrize("large", ["body", "headers"])
async def test_a_message_too_large_to_copy_with_its_reason_is_dead_lettered_and_the_rest_go_on(
    own_settings: NatsSettings, large: str
) -> None:
    """Garbage as large as NATS takes (by a publisher allowed the subject) is unparseable, so
    it goes to the dead letters with its reason and origin in headers. A body near the
    server's ``max_payload`` made the copy exceed it: NATS refused the publish and closed
    the connection, the bus took the unanswered publish for an outage and tried again for
    ever, and every event after the garbage stuck behind it. Headers near JetStream's 64 KiB
    made the copy's exceed it: the refusal ended the consumer, at every start again."""
    async with Bus.connect(own_settings, "large") as bus:
        limit = bus.nats.max_payload
        if large == "body":
            garbage, extra = b"{" + b"x" * (limit - 200), {}
        else:
            # As large as JetStream takes a message's headers (64 KiB): with the dead
            # letter's own, more than it takes.
            garbage, extra = b"{", {"X-Garbage": "x" * (MAX_HEADERS_BYTES - 200)}
        await bus.publish_raw(SUBJECT.replace("*", "big"), garbage, "garbage", extra)
        await bus.publish(event("after"))
        stop = asyncio.Event()
        handled: list[str] = []

        async def handle(envelope: Envelope[Payload]) -> None:
            handled.append(envelope.subject)
            stop.set()

        async with asyncio.timeout(30):
            await bus.consume("large", [SUBJECT], handle, stop)
        assert handled == ["after"]
        letter = await bus.jetstream.get_msg(bus.settings.deadletter_stream, 1)
        # Cut to fit, it is no longer the message: it can be read, not redriven.
        with pytest.raises(CannotRedrive, match="cut to fit"):
            await DeadLetters(bus, "large").redrive(1)
        assert await DeadLetters(bus, "large").count() == 1
    assert letter.headers is not None
    assert letter.headers[TRUNCATED_HEADER] == str(len(garbage))
    assert (letter.data or b"") == garbage[: len(letter.data or b"")]
    assert letter.headers[REASON_HEADER].startswith("unparseable event")
    assert letter.headers[ORIGINAL_SUBJECT_HEADER] == SUBJECT.replace("*", "big")
    assert "X-Garbage" not in letter.headers  # dropped: the dead letter would not fit with it
    assert len(letter.data or b"") + sum(len(k) + len(v) for k, v in letter.headers.items()) <= (
        limit
    )


async def _waiting_pulls(bus: Bus, stream: str, durable: str) -> int:
    """The pull requests waiting on consumer ``durable``; 0 until a replica has made it (the
    replicas' tasks create it as they start, which a poll right after may come before)."""
    try:
        return (await bus.jetstream.consumer_info(stream, durable)).num_waiting
    except nats.js.errors.NotFoundError:
        return 0


class Restarted(Exception):
    """The consumer's process was stopped with the event in hand (a deploy, a restart)."""


async def until_settled_or_restarted(
    settings: NatsSettings, consumer: str, handle: Callable[[str], Any]
) -> bool:
    """Run ``consumer`` in a process of its own (a ``Bus`` of its own) until its event is
    settled (True) or ``handle`` says ``Restarted``: the process is then cancelled with the
    event in hand, as a service whose stop grace ran out (False)."""
    async with Bus.connect(settings, consumer) as bus:
        stop = asyncio.Event()
        restarted = asyncio.Event()

        async def handler(envelope: Envelope[Payload]) -> None:
            try:
                handle(envelope.subject)
            except Restarted:
                restarted.set()
                await asyncio.Event().wait()  # held until the process goes
            stop.set()

        task = asyncio.create_task(bus.consume(consumer, [SUBJECT], handler, stop))

        async def settled_or_restarted() -> None:
            # Applied (the consumer stopped after it), dead-lettered, or held for a restart.
            while not (task.done() or restarted.is_set()):
                dead = await bus.jetstream.stream_info(settings.deadletter_stream)
                if dead.state.messages:
                    return
                await asyncio.sleep(0.05)

        async with asyncio.timeout(30):
            await settled_or_restarted()
        stop.set()
        if restarted.is_set():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return not restarted.is_set()


async def test_hand_backs_and_restarts_never_count_toward_the_failures_that_give_up(
    own_settings: NatsSettings,
) -> None:
    """JetStream's delivery count has every delivery, and the bus gave up at
    ``max_deliver`` of them: an event handed back by a deposed leader (``NotNow``) and
    redelivered after two restarts was dead-lettered at its first real failure, though its
    handler had failed once. Only real failures count now, in a tally that outlives the
    process: handed back four times, restarted twice, failed twice, it is applied."""
    settings = own_settings  # max_deliver=3
    consumer = "patient"
    outcomes = iter(
        [NotNow("not the leader")] * 4
        + [Restarted(), Restarted()]
        + [ValueError("first"), ValueError("second"), None]
    )
    applied: list[str] = []

    def handle(subject: str) -> None:
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        applied.append(subject)

    async with Bus.connect(settings, "publisher") as publisher:
        await publisher.publish(event("patient"))
    runs = 0
    while not await until_settled_or_restarted(settings, consumer, handle):
        runs += 1
    assert runs == 2
    assert applied == ["patient"]
    async with Bus.connect(settings, "reader") as bus:
        info = await bus.jetstream.consumer_info(settings.stream, consumer)
        assert info.num_ack_pending == 0
        assert (await bus.jetstream.stream_info(settings.deadletter_stream)).state.messages == 0
        tally = await bus.jetstream.get_msg(
            settings.attempts_stream, subject=bus_module.attempts_subject(consumer, 1)
        )
        assert tally.data is not None
        recorded = json.loads(tally.data)
        assert recorded | {"msg_id": "", "deliveries": []} == {
            "msg_id": "",
            "failures": 2,
            "waits": 0,
            "handed_back": 6,
            "deliveries": [],
        }
        assert len(set(recorded["deliveries"])) == 8  # each counted once; the 9th applied it


async def test_an_event_that_keeps_failing_is_dead_lettered_at_its_last_real_failure(
    own_settings: NatsSettings,
) -> None:
    """Hand-backs and restarts before do not spare an event that fails for real: it is
    dead-lettered at its ``max_deliver``-th real failure, neither before nor after."""
    settings = own_settings  # max_deliver=3
    consumer = "doomed"
    failures: list[str] = []
    outcomes = iter([NotNow("not the leader")] * 4 + [Restarted()])

    def handle(subject: str) -> None:
        outcome = next(outcomes, None)
        if outcome is not None:
            raise outcome
        failures.append(subject)
        raise ValueError("no such flavor")

    async with Bus.connect(settings, "publisher") as publisher:
        await publisher.publish(event("doomed"))
    while not await until_settled_or_restarted(settings, consumer, handle):
        pass
    assert failures == ["doomed"] * 3
    async with Bus.connect(settings, "reader") as bus:
        letter = await bus.jetstream.get_msg(settings.deadletter_stream, 1)
        assert letter.headers is not None
        assert letter.headers[REASON_HEADER] == "failed 3 times: ValueError: no such flavor"
        assert letter.headers[bus_module.DELIVERIES_HEADER] == "8"  # JetStream's own count


async def test_a_lost_attempts_stream_is_made_again_and_the_tally_goes_on(
    own_settings: NatsSettings,
) -> None:
    """Only the attempts stream is gone (deleted by hand): a bus that makes the streams
    makes it again when a failure is to be recorded or a tally read, instead of waiting
    for ever as for NATS away; the event is retried and applied."""
    consumer = "tally-lost"
    tries: list[str] = []
    stop = asyncio.Event()

    async with Bus.connect(own_settings, consumer) as bus:

        async def handle(envelope: Envelope[Payload]) -> None:
            tries.append(envelope.subject)
            if len(tries) == 1:
                await lose_stream(bus.jetstream, own_settings.attempts_stream)
                raise ValueError("the first try fails")
            stop.set()

        await bus.publish(event("again"))
        async with asyncio.timeout(20):
            await bus.consume(consumer, [SUBJECT], handle, stop)
        assert tries == ["again", "again"]
        info = await bus.jetstream.stream_info(own_settings.attempts_stream)
        assert info.state.messages == 1  # the first failure, recorded after it was made again


async def test_a_failure_whose_record_s_acknowledgement_was_lost_counts_once(
    own_settings: NatsSettings,
) -> None:
    """JetStream stored a failure's record but its acknowledgement never came (a NATS
    failover, a slow server): the write was retried as an outage, found the record changed
    under it, read it again and added the failure a second time. With ``max_deliver`` 3, an
    event whose handler failed twice was dead-lettered at its second real failure as
    "failed 3 times". Each failure now counts once: the event is applied at its third try."""
    settings = own_settings  # max_deliver=3
    consumer = "ack-lost"
    tries: list[str] = []
    lost: set[int] = set()
    stop = asyncio.Event()

    async with Bus.connect(settings, consumer) as bus:
        stored = bus.jetstream.publish

        async def ack_lost(subject: str, payload: bytes = b"", **kwargs: Any) -> api.PubAck:
            ack = await stored(subject, payload, **kwargs)
            if subject.startswith(f"{bus_module.ATTEMPTS_PREFIX}.") and len(tries) not in lost:
                lost.add(len(tries))  # the first record written in each try
                raise nats.errors.TimeoutError
            return ack

        bus.jetstream.publish = ack_lost  # type: ignore[method-assign]

        async def handle(envelope: Envelope[Payload]) -> None:
            tries.append(envelope.subject)
            if len(tries) < 3:
                raise ValueError(f"try {len(tries)} fails")
            stop.set()

        async def stop_when_dead_lettered() -> None:
            while not (await bus.jetstream.stream_info(settings.deadletter_stream)).state.messages:
                await asyncio.sleep(0.05)
            stop.set()

        await bus.publish(event("once"))
        watcher = asyncio.create_task(stop_when_dead_lettered())
        try:
            async with asyncio.timeout(30):
                await bus.consume(consumer, [SUBJECT], handle, stop)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        dead = await bus.jetstream.stream_info(settings.deadletter_stream)
        assert (tries, dead.state.messages) == (["once"] * 3, 0)
        tally = await bus.jetstream.get_msg(
            settings.attempts_stream, subject=bus_module.attempts_subject(consumer, 1)
        )
        assert tally.data is not None
        recorded = json.loads(tally.data)
        assert (recorded["failures"], len(set(recorded["deliveries"]))) == (2, 2)


async def test_a_lost_dead_letter_stream_is_made_again_and_the_dead_letter_written(
    own_settings: NatsSettings,
) -> None:
    """Only the dead-letter stream is gone (deleted by hand): no stream took the dead letter
    (``NoStreamResponseError``), which read as NATS away, and the consumer, the scheduler's
    too, whose bus makes the streams, paused for ever with the event in hand. Now the bus
    that makes the streams makes them again and the dead letter is written."""
    consumer = "letter-lost"
    stop = asyncio.Event()

    async with Bus.connect(own_settings, consumer) as bus:

        async def reject(envelope: Envelope[Payload]) -> None:
            await lose_stream(bus.jetstream, own_settings.deadletter_stream)
            raise Reject("never valid")

        async def stop_when_dead_lettered() -> None:
            while True:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    info = await bus.jetstream.stream_info(own_settings.deadletter_stream)
                    if info.state.messages:
                        break
                await asyncio.sleep(0.05)
            stop.set()

        await bus.publish(event("rejected"))
        watcher = asyncio.create_task(stop_when_dead_lettered())
        try:
            async with asyncio.timeout(20):
                await bus.consume(consumer, [SUBJECT], reject, stop)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        letter = await bus.jetstream.get_msg(own_settings.deadletter_stream, 1)
        assert letter.headers is not None
        assert letter.headers[REASON_HEADER] == "rejected: never valid"


async def test_a_cancellation_the_nats_client_swallowed_still_stops_the_consumer(
    own_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's ``asyncio.wait_for``, which nats-py's fetch awaits, loses a cancellation
    that comes as the message it waited for arrives (CPython gh-86296, fixed in 3.12): the
    fetch returns as if never cancelled. A consumer cancelled there (its service's stop
    grace over, or an ``asyncio.timeout`` around it) went on fetching for good: a test so
    bounded once hung to pytest's own timeout. It now stops at the fetch's return."""
    real = bus_module._DurablePull.fetch
    fetching = asyncio.Event()

    async def swallowing(self: Any, batch: int, timeout: float) -> list[Msg]:
        fetching.set()
        try:
            return await real(self, batch, timeout)
        except asyncio.CancelledError:
            return []  # as wait_for does when what it awaits is done as the cancel comes

    monkeypatch.setattr(bus_module._DurablePull, "fetch", swallowing)
    stop = asyncio.Event()
    consuming = asyncio.create_task(own_bus.consume("swallowed", [SUBJECT], _noop, stop))
    try:
        await asyncio.wait_for(fetching.wait(), 30)
        consuming.cancel()
        done, _ = await asyncio.wait({consuming}, timeout=10)
        assert done == {consuming} and consuming.cancelled()
    finally:
        stop.set()  # the old loop ends only so
        with contextlib.suppress(asyncio.CancelledError):
            await consuming
