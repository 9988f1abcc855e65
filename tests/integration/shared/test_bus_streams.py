"""The bus on a real NATS JetStream (``shared.bus``): the streams it makes (and how), a lost
stream made again or waited for, publishing once per event id and in order, and what a
dead letter carries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable

import nats
import pytest
from nats.js import api
from pydantic import SecretStr

import trainyard_platform.shared.bus as bus_module
from tests.fixtures.servers import lose_stream
from trainyard_platform.deploy.local.nats import NatsServer, NatsUser
from trainyard_platform.shared.bus import (
    CONSUMER_HEADER,
    DELIVERIES_HEADER,
    ORIGINAL_MSG_ID_HEADER,
    ORIGINAL_SEQUENCE_HEADER,
    ORIGINAL_SUBJECT_HEADER,
    REASON_HEADER,
    TTL_HEADER,
    Bus,
    Hearing,
    Reject,
    StreamMissingError,
)
from trainyard_platform.shared.events import Envelope, Payload, nats_subject
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

SUBJECTS = [nats_subject(JobCancelRequested)]


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


def service_settings(settings: NatsSettings, server: NatsServer, user: NatsUser) -> NatsSettings:
    return settings.model_copy(
        update={"url": server.address, "user": user.name, "password": SecretStr(user.password)}
    )


async def test_the_streams_are_made_as_the_settings_say(own_settings: NatsSettings) -> None:
    settings = own_settings.model_copy(
        update={
            "retention_hours": 2.0,
            "deadletter_max_age_days": 3.0,
            "deadletter_max_messages": 50,
            "duplicate_window_seconds": 30.0,
        }
    )
    async with Bus.connect(settings, "maker") as bus:
        events = (await bus.jetstream.stream_info(settings.stream)).config
        dead = (await bus.jetstream.stream_info(settings.deadletter_stream)).config
    assert events.subjects == ["trainyard.>"]
    assert dead.subjects == ["deadletter.>"]
    for config in (events, dead):
        assert config.storage == api.StorageType.FILE
        assert config.retention == api.RetentionPolicy.LIMITS
        assert config.duplicate_window == 30.0
    assert events.max_age == 2 * 3600
    assert dead.max_age == 3 * 86400
    assert events.max_msgs == -1  # unlimited
    assert dead.max_msgs == 50


async def test_only_the_event_stream_lets_a_message_expire_on_its_own(own_bus: Bus) -> None:
    bus = own_bus
    events = (await bus.jetstream.stream_info(bus.settings.stream)).config
    dead = (await bus.jetstream.stream_info(bus.settings.deadletter_stream)).config
    assert events.allow_msg_ttl is True
    assert not dead.allow_msg_ttl  # a dead letter stays for its retention, whatever it says
    # A short-lived fact (a runner's heartbeat) says its TTL; a stream without per-message
    # TTLs would refuse it.
    ack = await bus.publish_raw("trainyard.test.ttl", b"{}", "ttl-1", {TTL_HEADER: "600s"})
    assert ack.stream == bus.settings.stream


async def test_a_stream_made_with_another_configuration_is_updated(
    own_settings: NatsSettings,
) -> None:
    async with Bus.connect(own_settings, "first") as bus:
        assert (
            await bus.jetstream.stream_info(bus.settings.stream)
        ).config.duplicate_window == 120.0
    changed = own_settings.model_copy(update={"duplicate_window_seconds": 45.0})
    async with Bus.connect(changed, "second") as bus:
        info = await bus.jetstream.stream_info(bus.settings.stream)
        assert info.config.duplicate_window == 45.0
        dead = await bus.jetstream.stream_info(bus.settings.deadletter_stream)
        assert dead.config.duplicate_window == 45.0


async def test_a_lost_stream_is_made_again_with_a_new_identity(own_bus: Bus) -> None:
    bus = own_bus
    first = await bus.stream_created()
    info = await bus.jetstream.stream_info(bus.settings.stream)
    assert first is not None and first == info.created
    assert await bus.stream_created() == first
    await lose_stream(bus.jetstream, bus.settings.stream)
    await asyncio.sleep(0.01)  # stream creation times are kept to the nanosecond
    again = await bus.stream_created()
    assert again is not None and again != first
    assert again == (await bus.jetstream.stream_info(bus.settings.stream)).created
    await lose_stream(bus.jetstream, bus.settings.deadletter_stream)
    await bus._restore_streams()
    assert (await bus.jetstream.stream_info(bus.settings.deadletter_stream)).config.name


async def test_a_service_that_may_not_make_the_streams_waits_for_them(
    bus: Bus,
    nats_server: NatsServer,
    nats_settings: NatsSettings,
    nats_service_user: Callable[..., NatsUser],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = service_settings(nats_settings, nats_server, nats_service_user("submission"))
    async with Bus.connect(settings, "submission-under-test") as service:
        assert not service.makes_streams
        created = await service.stream_created()
        assert created == await bus.stream_created()
        await service._restore_streams()  # both there: nothing to say

        await lose_stream(bus.jetstream, "TRAINYARD_DEADLETTER")
        with pytest.raises(StreamMissingError, match="stream TRAINYARD_DEADLETTER does not exist"):
            await service._restore_streams()
        await lose_stream(bus.jetstream, "TRAINYARD")
        assert await service.stream_created() is None
        with pytest.raises(StreamMissingError) as missing:
            await service._restore_streams()
        assert str(missing.value) == (
            "stream TRAINYARD does not exist (NATS lost it?); the NATS user 'scheduler' makes "
            "it again"
        )
        with pytest.raises(nats.js.errors.NotFoundError):
            await service.jetstream.stream_info("TRAINYARD")

        # At start, a service waits for the streams (trying again with capped back-off).
        with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
            waiting = asyncio.create_task(service.ensure_streams())
            await asyncio.sleep(0.7)
            assert not waiting.done()
            await bus.ensure_streams()
            async with asyncio.timeout(10):
                await waiting
        said = "waiting for stream TRAINYARD: it does not exist yet (the NATS user 'scheduler' makes it); "
        assert any(r.getMessage().startswith(said) for r in caplog.records)
        assert await service.stream_created() == await bus.stream_created()


async def test_a_service_waits_for_the_dead_letter_stream_too(
    bus: Bus,
    nats_server: NatsServer,
    nats_settings: NatsSettings,
    nats_service_user: Callable[..., NatsUser],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = service_settings(nats_settings, nats_server, nats_service_user("submission"))
    async with Bus.connect(settings, "submission-under-test") as service:
        await lose_stream(bus.jetstream, "TRAINYARD_DEADLETTER")  # the event stream is there
        waiting_for_it = (
            "waiting for stream TRAINYARD_DEADLETTER: it does not exist yet (the NATS user "
            "'scheduler' makes it); "
        )
        with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
            waiting = asyncio.create_task(service.ensure_streams())
            async with asyncio.timeout(10):
                while not waiting.done() and not any(
                    m.startswith(waiting_for_it) for m in caplog.messages
                ):
                    await asyncio.sleep(0.02)
            assert not waiting.done()  # it did not start without its dead letters
            await bus.ensure_streams()
            async with asyncio.timeout(10):
                await waiting


async def test_ready_when_connected_and_the_stream_answers(own_bus: Bus) -> None:
    bus = own_bus
    assert await bus.ping() is True
    await lose_stream(bus.jetstream, bus.settings.stream)
    with pytest.raises(nats.js.errors.NotFoundError):
        await bus.ping()


async def test_an_event_id_is_published_once_and_a_batch_in_its_order(own_bus: Bus) -> None:
    bus = own_bus
    first = 1
    one = event("j1")
    await bus.publish(one)
    await bus.publish(one)
    batch = [event(f"b{i}") for i in range(5)]
    await bus.publish_many(
        [(e.nats_subject, e.to_json(), e.id, {"X-Mine": str(i)}) for i, e in enumerate(batch)]
    )
    await bus.publish_many([(one.nats_subject, one.to_json(), one.id, {})])
    info = await bus.jetstream.stream_info(bus.settings.stream)
    assert info.state.messages == 6
    stored = [
        await bus.jetstream.get_msg(bus.settings.stream, seq) for seq in range(first, first + 6)
    ]
    assert [m.headers["Nats-Msg-Id"] for m in stored if m.headers] == [
        bus.msg_id(e.nats_subject, e.id) for e in (one, *batch)
    ]
    assert [m.subject for m in stored] == [e.nats_subject for e in (one, *batch)]
    assert [m.data for m in stored] == [e.to_json() for e in (one, *batch)]
    assert [m.headers["X-Mine"] for m in stored[1:] if m.headers] == ["0", "1", "2", "3", "4"]
    ack = await bus.publish_raw(one.nats_subject, one.to_json(), "raw-id", {"X-Raw": "1"})
    assert ack.seq == first + 6 and ack.stream == bus.settings.stream
    raw = await bus.jetstream.get_msg(bus.settings.stream, first + 6)
    assert raw.headers == {"X-Raw": "1", "Nats-Msg-Id": bus.msg_id(one.nats_subject, "raw-id")}


async def test_a_dead_letter_carries_the_event_the_reason_and_where_it_came_from(
    own_bus: Bus,
) -> None:
    bus = own_bus
    first_dead = 1
    poison = event("poison")
    stored = await bus.publish_raw(
        poison.nats_subject,
        poison.to_json(),
        poison.id,
        {"X-Keep": "yes", "Trainyard-Old": "dropped"},
    )
    stop = asyncio.Event()
    handled: list[str] = []

    async def reject(envelope: Envelope[Payload]) -> None:
        handled.append(envelope.id)
        stop.set()
        raise Reject("the job is unknown\n  to this service")

    async with asyncio.timeout(10):
        await bus.consume("dl-test", SUBJECTS, reject, stop)
    assert handled == [poison.id]
    dead = await bus.jetstream.get_msg(bus.settings.deadletter_stream, first_dead)
    assert dead.subject == "deadletter.dl-test"
    assert dead.data == poison.to_json()
    assert dead.headers is not None
    headers = {k: v for k, v in dead.headers.items() if k != "Nats-Msg-Id"}
    assert headers == {
        "X-Keep": "yes",
        REASON_HEADER: "rejected: the job is unknown to this service",
        ORIGINAL_SUBJECT_HEADER: poison.nats_subject,
        CONSUMER_HEADER: "dl-test",
        ORIGINAL_SEQUENCE_HEADER: str(stored.seq),
        DELIVERIES_HEADER: "1",
        ORIGINAL_MSG_ID_HEADER: bus.msg_id(poison.nats_subject, poison.id),
    }
    assert dead.headers["Nats-Msg-Id"] == bus.msg_id(
        "deadletter.dl-test", f"deadletter:dl-test:{stored.seq}"
    )
    # Terminated: a consumer started again finds nothing to handle.
    await settled(bus, "dl-test")


async def test_a_failing_handler_is_retried_then_dead_lettered_with_its_error(
    own_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    bus = own_bus
    first_dead = 1
    one = event("flaky")
    await bus.publish(one)
    stop = asyncio.Event()
    deliveries: list[str] = []

    async def fail(envelope: Envelope[Payload]) -> None:
        deliveries.append(envelope.id)
        if len(deliveries) == 3:
            stop.set()
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.bus"):
        async with asyncio.timeout(20):
            await bus.consume("retry-test", SUBJECTS, fail, stop)
    assert len(deliveries) == 3  # max_deliver
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert messages[:2] == [
        f"retry-test: {one.id} failed (failure 1 of 3, delivery 1), will retry: RuntimeError: boom",
        f"retry-test: {one.id} failed (failure 2 of 3, delivery 2), will retry: RuntimeError: boom",
    ]
    assert (
        f"retry-test: giving up on {one.id} after 3 failures (delivery 3): RuntimeError: boom"
        in messages
    )
    dead = await bus.jetstream.get_msg(bus.settings.deadletter_stream, first_dead)
    assert dead.headers is not None
    assert dead.headers[REASON_HEADER] == "failed 3 times: RuntimeError: boom"
    assert dead.headers[DELIVERIES_HEADER] == "3"


async def test_a_consumer_that_caught_up_has_heard_everything_before_its_last_fetch(
    own_bus: Bus,
) -> None:
    bus = own_bus
    await bus.publish(event("heard"))
    stop = asyncio.Event()
    seen: list[str] = []

    async def handle(envelope: Envelope[Payload]) -> None:
        seen.append(envelope.subject)

    task = asyncio.create_task(bus.consume("hearing-test", SUBJECTS, handle, stop))
    try:
        async with asyncio.timeout(10):
            while bus.hearing("hearing-test") is None:
                await asyncio.sleep(0.02)
        hearing = bus.hearing("hearing-test")
        assert isinstance(hearing, Hearing) and hearing.since <= hearing.through
        assert seen == ["heard"]
    finally:
        stop.set()
        await task
    assert bus.hearing("hearing-test") is None


@pytest.mark.parametrize("lost", ["deadletter_stream", "attempts_stream"])
async def test_the_stream_check_makes_a_lost_dead_letter_or_attempts_stream_again(
    own_bus: Bus, lost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the dead-letter or the attempts stream is gone (deleted by hand): the scheduler's
    bus made it again only at its start or when one of its own consumers next needed it, so
    every other service that needed it stayed paused until the scheduler was restarted. The
    stream check its outbox relay makes every second (``stream_created``) now makes it again
    too, at most every ``OTHER_STREAMS_CHECK_S``."""
    monkeypatch.setattr(bus_module, "OTHER_STREAMS_CHECK_S", 0.0)
    bus = own_bus
    name = getattr(bus.settings, lost)
    await lose_stream(bus.jetstream, name)
    created = await bus.stream_created()
    assert created == (await bus.jetstream.stream_info(bus.settings.stream)).created
    assert (await bus.jetstream.stream_info(name)).config.name == name
