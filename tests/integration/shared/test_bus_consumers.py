"""The bus's consumers on a real NATS JetStream (``shared.bus``): the durable consumer they
make, the spans of publishing and handling in one trace, a message abandoned too often
dead-lettered before it is handled again, and a failed batch handled one event at a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from nats.aio.msg import Msg
from nats.js import api
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.bus import REASON_HEADER, Bus, Delivery
from shared.events import Envelope, Payload, nats_subject
from shared.events.payloads import JobCancelRequested
from shared.events.trust import SUBMISSION
from shared.settings import NatsSettings

pytestmark = pytest.mark.integration

SUBJECT = nats_subject(JobCancelRequested)


def event(job_id: str) -> Envelope[Payload]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def consume_once(bus: Bus, consumer: str, redrive: bool = True, batch: int = 16) -> None:
    """Run ``consume`` until the first event is handled."""
    stop = asyncio.Event()

    async def handle(envelope: Envelope[Payload]) -> None:
        stop.set()

    async with asyncio.timeout(10):
        await bus.consume(consumer, [SUBJECT], handle, stop, batch, redrive=redrive)


async def test_the_durable_consumer_is_made_as_the_rules_say(bus: Bus) -> None:
    await bus.publish(event("j1"))
    await consume_once(bus, "with-redrive", batch=7)
    config = (await bus.jetstream.consumer_info("TRAINYARD", "with-redrive")).config
    assert config.durable_name == "with-redrive"
    assert config.filter_subject is None
    assert config.filter_subjects == [SUBJECT, "trainyard.redrive.with-redrive"]
    assert config.ack_policy == api.AckPolicy.EXPLICIT
    assert config.deliver_policy == api.DeliverPolicy.ALL
    assert config.max_deliver == -1
    assert config.ack_wait == 5.0  # the tests' settings
    assert config.max_ack_pending == 7

    await consume_once(bus, "without-redrive", redrive=False)
    config = (await bus.jetstream.consumer_info("TRAINYARD", "without-redrive")).config
    assert config.filter_subject == SUBJECT
    assert not config.filter_subjects


async def test_publishing_and_handling_are_spans_of_the_producers_trace(
    bus: Bus, spans: InMemorySpanExporter
) -> None:
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
        "TRAINYARD",
        api.ConsumerConfig(
            durable_name="abandoned",
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subject=SUBJECT,
            max_deliver=-1,
        ),
    )
    sub = await bus.jetstream.pull_subscribe_bind(durable="abandoned", stream="TRAINYARD")
    for _ in range(times - 1):
        [msg] = await sub.fetch(1, timeout=5)
        await msg.nak()
    [msg] = await sub.fetch(1, timeout=5)
    assert msg.metadata.num_delivered == times
    return msg


@pytest.mark.parametrize(("times", "dead"), [(3, True), (2, False)])
async def test_a_message_abandoned_too_often_is_dead_lettered_before_it_is_handled(
    nats_settings: NatsSettings, times: int, dead: bool
) -> None:
    settings = nats_settings.model_copy(update={"max_unfinished_deliveries": 2})
    async with Bus.connect(settings, "abandon-test") as bus:
        await bus.publish(event("again"))
        msg = await delivered(bus, times)
        handled: list[str] = []

        async def handle(deliveries: Sequence[Delivery]) -> None:
            handled.extend(d.envelope.subject for d in deliveries)

        await bus._handle_batch("abandoned", [msg], handle, asyncio.Event(), atomic=False)
        dead_letters = (await bus.jetstream.stream_info("TRAINYARD_DEADLETTER")).state.messages
        if dead:
            assert handled == [] and dead_letters == 1
            letter = await bus.jetstream.get_msg("TRAINYARD_DEADLETTER", 1)
            assert letter.headers is not None
            assert letter.headers[REASON_HEADER] == (
                "abandoned: delivered 3 times without an outcome (the consumer stopped or died "
                "while handling it, each time)"
            )
        else:
            assert handled == ["again"] and dead_letters == 0
        info = await bus.jetstream.consumer_info("TRAINYARD", "abandoned")
        assert info.num_ack_pending == 0  # settled either way: terminated or acknowledged


async def test_a_failed_batch_is_handled_again_one_event_at_a_time(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
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

    with caplog.at_level(logging.INFO, logger="shared.bus"):
        async with asyncio.timeout(10):
            await bus.consume_batches("batch-test", [SUBJECT], handle, stop)
    assert calls == [["a", "b", "c"], ["a"], ["b"], ["c"]]
    assert "batch of 3 failed (one of them is bad); handling them one at a time" in [
        r.getMessage() for r in caplog.records
    ]
    info = await bus.jetstream.consumer_info("TRAINYARD", "batch-test")
    assert info.num_ack_pending == 0 and info.num_pending == 0
