"""The bus's rules that need no server (``shared.bus``): how each infrastructure fault is
named, where the search for one looks, the outage back-off, waiting out an outage (paused,
resumed, stopped; logged and counted), what a consumer has been able to hear, and the small
helpers (subjects, credentials, span attributes).

A stand-in NATS client replaces the connection here: these are the bus's own decisions,
not NATS behaviour (tests/integration/shared/test_bus_*.py run them on a real server)."""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats.errors
import nats.js.errors
import pytest
import urllib3.exceptions
from minio.error import S3Error, ServerError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import SecretStr
from urllib3 import HTTPResponse

import trainyard_platform.shared.bus as bus_module
from trainyard_platform.shared.bus import (
    Bus,
    Hearing,
    StreamMissingError,
    _attrs,
    _auth,
    _reconnects,
    _Stopped,
    deadletter_subject,
    infrastructure_fault,
    redrive_subject,
)
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.settings import NatsSettings

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def s3_error(code: str) -> S3Error:
    return S3Error(HTTPResponse(status=503), code, "msg", "/b/k", "req", "host")


# --- naming the fault ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            asyncpg.CannotConnectNowError("starting up"),
            "PostgreSQL unavailable (CannotConnectNowError: starting up)",
        ),
        (
            asyncpg.InterfaceError("cannot call fetch(): connection is closed"),
            "PostgreSQL connection lost (InterfaceError: cannot call fetch(): connection is "
            "closed)",
        ),
        (
            asyncpg.InterfaceError("pool is closing"),
            "PostgreSQL connection lost (InterfaceError: pool is closing)",
        ),
        (
            nats.errors.NoRespondersError(),
            "NATS unavailable (NoRespondersError: nats: no responders available for request)",
        ),
        (StreamMissingError("gone"), "NATS unavailable (StreamMissingError: gone)"),
        (
            urllib3.exceptions.ProtocolError("Connection aborted."),
            "object store unreachable (ProtocolError: Connection aborted.)",
        ),
        (
            ServerError("bad gateway", 502),
            "object store unreachable (ServerError: bad gateway)",
        ),
        (TimeoutError(), "unreachable or timed out (TimeoutError)"),
        (nats.errors.TimeoutError(), "NATS not answering (TimeoutError: nats: timeout)"),
        (
            ConnectionRefusedError(111, "refused"),
            "unreachable or timed out (ConnectionRefusedError: [Errno 111] refused)",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_each_kind_of_fault_is_named_with_the_error(error: BaseException, reason: str) -> None:
    assert infrastructure_fault(error) == reason


def test_an_unavailable_object_store_is_named_with_its_code() -> None:
    reason = infrastructure_fault(s3_error("SlowDown"))
    assert reason is not None
    assert reason.startswith(
        "object store unavailable (S3Error: S3 operation failed; code: SlowDown"
    )


def test_an_interface_error_about_anything_else_is_not_a_fault() -> None:
    assert infrastructure_fault(asyncpg.InterfaceError("another operation is in progress")) is None


def test_the_error_itself_is_named_before_what_caused_it() -> None:
    try:
        try:
            raise asyncpg.CannotConnectNowError("starting up")
        except asyncpg.PostgresError as inner:
            raise ConnectionResetError(104, "reset") from inner
    except OSError as outer:
        reason = infrastructure_fault(outer)
    assert reason == "unreachable or timed out (ConnectionResetError: [Errno 104] reset)"


def test_a_fault_is_found_in_the_context_of_another_error() -> None:
    try:
        try:
            raise asyncpg.CannotConnectNowError("starting up")
        except asyncpg.PostgresError:
            raise ValueError("while loading")  # noqa: B904 - the implicit context is the point
    except ValueError as outer:
        assert outer.__context__ is not None
        reason = infrastructure_fault(outer)
    assert reason == "PostgreSQL unavailable (CannotConnectNowError: starting up)"


def test_a_suppressed_context_is_not_looked_at() -> None:
    outer = ValueError("bad event")
    outer.__context__ = ConnectionResetError(104, "reset")
    outer.__suppress_context__ = True
    assert infrastructure_fault(outer) is None


def test_faults_inside_nested_groups_are_found() -> None:
    inner = ExceptionGroup("inner", [KeyError("x"), asyncpg.AdminShutdownError("shutdown")])
    group = ExceptionGroup("outer", [ValueError("v"), inner])
    assert infrastructure_fault(group) == "PostgreSQL unavailable (AdminShutdownError: shutdown)"


def test_a_cycle_of_causes_ends_the_search() -> None:
    first, second = ValueError("a"), KeyError("b")
    first.__cause__, second.__cause__ = second, first
    first.__context__, second.__context__ = second, first
    assert infrastructure_fault(first) is None


# --- helpers -------------------------------------------------------------------------------


def test_subjects_of_dead_letters_and_redrives() -> None:
    assert deadletter_subject("registry") == "deadletter.registry"
    assert redrive_subject("registry") == "trainyard.redrive.registry"


def test_credentials_and_the_users_own_inbox_prefix() -> None:
    assert _auth(NatsSettings()) == {}
    assert _auth(NatsSettings(user="registry", password=SecretStr("pw"))) == {
        "user": "registry",
        "password": "pw",
        "inbox_prefix": "_INBOX.registry",
    }
    assert _auth(NatsSettings(user="runner-1"))["password"] == ""


def test_span_attributes_name_the_event() -> None:
    envelope: Envelope[Payload] = Envelope.wrap(
        JobCancelRequested(job_id="j1", team="t", user="u"), source=SUBMISSION, subject="j1"
    )
    assert _attrs(envelope) == {
        "messaging.system": "nats",
        "messaging.destination.name": envelope.nats_subject,
        "messaging.message.id": envelope.id,
        "cloudevents.event_type": envelope.type,
        "cloudevents.event_subject": "j1",
    }


class FakeNats:
    """What ``Bus`` reads of a NATS client outside I/O: connected or not, reconnects."""

    def __init__(self, connected: bool = True, reconnects: int = 0) -> None:
        self.is_connected = connected
        self.stats: dict[str, int] = {"reconnects": reconnects}

    def jetstream(self) -> Any:
        return None


def test_reconnects_are_read_from_the_clients_stats() -> None:
    assert _reconnects(FakeNats(reconnects=3)) == 3  # type: ignore[arg-type]
    assert _reconnects(object()) == 0  # type: ignore[arg-type]


# --- the outage back-off -------------------------------------------------------------------


def make_bus(nc: FakeNats | None = None, meter: Any = None, **settings: Any) -> Bus:
    return Bus(nc or FakeNats(), NatsSettings(**settings), meter=meter)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("failures", "step"), [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (500, 30.0)]
)
def test_the_outage_back_off_doubles_up_to_its_cap_with_up_to_half_of_it_as_jitter(
    monkeypatch: pytest.MonkeyPatch, failures: int, step: float
) -> None:
    bus = make_bus(outage_retry_initial_seconds=0.5, outage_retry_max_seconds=30.0)
    asked: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        asked.append((low, high))
        return high

    monkeypatch.setattr(random, "uniform", uniform)
    assert bus._outage_delay(failures) == step
    assert asked == [(0, step / 2)]


# --- waiting out an outage -----------------------------------------------------------------


def metric(reader: InMemoryMetricReader, name: str) -> float:
    data = reader.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for one in scope.metrics:
                if one.name == name:
                    for point in one.data.data_points:
                        assert dict(point.attributes or {}) == {"consumer": "c"}
                        total += point.value  # type: ignore[union-attr]
    return total


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def quick_bus(reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch) -> Bus:
    bus = make_bus(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    monkeypatch.setattr(bus, "_outage_delay", lambda failures: 0.001 * failures)
    return bus


async def test_an_outage_pauses_the_consumer_until_the_attempt_succeeds(
    quick_bus: Bus, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[dict[str, str]] = []
    paused_metric: list[float] = []

    async def attempt() -> str:
        seen.append(dict(quick_bus.paused))
        paused_metric.append(metric(reader, "trainyard.consumer.paused"))
        if len(seen) <= 2:
            raise ConnectionRefusedError(111, "refused")
        return "done"

    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        assert await quick_bus._through_outages("c", attempt, asyncio.Event()) == "done"
    fault = "unreachable or timed out (ConnectionRefusedError: [Errno 111] refused)"
    assert seen == [{}, {"c": fault}, {"c": fault}]
    assert paused_metric == [0, 1, 1]
    assert quick_bus.paused == {}
    assert metric(reader, "trainyard.consumer.paused") == 0
    assert metric(reader, "trainyard.consumer.outage_retries") == 2
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert messages[0] == f"c: paused, waiting out an outage: {fault}"
    assert messages[1] == f"c: still paused (attempt 1 failed: {fault}); next try in 0.0 s"
    assert messages[2] == f"c: still paused (attempt 2 failed: {fault}); next try in 0.0 s"
    assert messages[3].startswith("c: resumed after ") and messages[3].endswith(" and 2 retries")
    assert len(messages) == 4
    levels = [r.levelno for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert levels == [logging.WARNING, logging.INFO, logging.INFO, logging.WARNING]


async def test_a_consumer_stopped_while_paused_says_so_not_that_it_resumed(
    quick_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM during an outage: the consumer's last line said 'resumed after 50.9 s and 5
    retries' (seen on a local stack with PostgreSQL paused), though nothing had resumed."""
    stop = asyncio.Event()
    tries: list[int] = []

    async def attempt() -> str:
        tries.append(1)
        if len(tries) == 2:
            stop.set()  # the service is told to stop while the outage lasts
        raise ConnectionRefusedError(111, "refused")

    with (
        caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"),
        pytest.raises(Exception) as stopped,
    ):
        await quick_bus._through_outages("c", attempt, stop)
    assert type(stopped.value).__name__ == "_Stopped"
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert not any("resumed" in m for m in messages), messages
    assert messages[-1].startswith("c: stopped while paused, after "), messages
    assert quick_bus.paused == {}


@pytest.mark.parametrize("where", ["waiting", "trying"])
async def test_a_consumer_cancelled_while_paused_says_so_not_that_it_resumed(
    quick_bus: Bus, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A task cancelled during an outage (between tries, or in a try that hangs): its last
    line said 'resumed after ... s and N retries', though nothing had resumed."""
    tries: list[int] = []
    hung = asyncio.Event()

    async def attempt() -> str:
        tries.append(1)
        if len(tries) == 3 and where == "trying":
            hung.set()
            await asyncio.Event().wait()  # the third try hangs until cancelled
        raise ConnectionRefusedError(111, "refused")

    delay = 3600.0 if where == "waiting" else 0.001  # waiting: cancelled between tries
    monkeypatch.setattr(quick_bus, "_outage_delay", lambda failures: delay)
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        task = asyncio.create_task(quick_bus._through_outages("c", attempt, asyncio.Event()))
        if where == "trying":
            await hung.wait()
        else:
            while quick_bus.paused == {}:
                await asyncio.sleep(0)
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert not any("resumed" in m for m in messages), messages
    retries = 2 if where == "trying" else 1
    assert messages[-1].startswith("c: cancelled while paused, after "), messages
    assert messages[-1].endswith(f" and {retries} retries"), messages
    assert quick_bus.paused == {}


async def test_an_error_of_its_own_after_an_outage_is_no_resumption(
    quick_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """The outage ends but the try then fails for a reason of its own: the line says the
    outage is over and that try failed, not that the consumer resumed."""
    tries: list[int] = []

    async def attempt() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionRefusedError(111, "refused")
        raise ValueError("bad row")

    with (
        caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"),
        pytest.raises(ValueError, match="bad row"),
    ):
        await quick_bus._through_outages("c", attempt, asyncio.Event())
    messages = [r.getMessage() for r in caplog.records if r.name == "trainyard_platform.shared.bus"]
    assert not any("resumed" in m for m in messages), messages
    assert messages[-1].startswith("c: outage over, the next try failed (ValueError), after ")
    assert quick_bus.paused == {}


async def test_the_paused_map_is_a_copy(quick_bus: Bus) -> None:
    quick_bus._paused["c"] = "down"
    view = quick_bus.paused
    assert view == {"c": "down"}
    view["d"] = "x"  # type: ignore[index]
    assert quick_bus.paused == {"c": "down"}


async def test_an_attempt_that_succeeds_at_once_pauses_and_logs_nothing(
    quick_bus: Bus, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    async def attempt() -> int:
        return 7

    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.bus"):
        assert await quick_bus._through_outages("c", attempt, asyncio.Event()) == 7
    assert [r for r in caplog.records if r.name == "trainyard_platform.shared.bus"] == []
    assert metric(reader, "trainyard.consumer.outage_retries") == 0


async def test_an_error_that_is_not_a_fault_propagates_at_once_without_a_pause(
    quick_bus: Bus, reader: InMemoryMetricReader
) -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad event")

    with pytest.raises(ValueError, match="bad event"):
        await quick_bus._through_outages("c", attempt, asyncio.Event())
    assert calls == 1 and quick_bus.paused == {}
    assert metric(reader, "trainyard.consumer.outage_retries") == 0


async def test_a_stop_during_an_outage_ends_the_wait_and_unpauses(
    quick_bus: Bus, reader: InMemoryMetricReader
) -> None:
    stop = asyncio.Event()
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            stop.set()
        raise TimeoutError

    with pytest.raises(_Stopped):
        await quick_bus._through_outages("c", attempt, stop)
    assert calls == 2
    assert quick_bus.paused == {}
    assert metric(reader, "trainyard.consumer.paused") == 0


async def test_a_stop_asked_before_the_fault_gives_up_without_retrying(
    quick_bus: Bus, reader: InMemoryMetricReader
) -> None:
    stop = asyncio.Event()
    stop.set()

    async def attempt() -> None:
        raise TimeoutError

    with pytest.raises(_Stopped):
        await quick_bus._through_outages("c", attempt, stop)
    assert metric(reader, "trainyard.consumer.outage_retries") == 0


async def test_a_stop_wakes_the_wait_before_its_delay_is_over(
    reader: InMemoryMetricReader,
) -> None:
    bus = make_bus(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    bus._outage_delay = lambda failures: 3600.0  # type: ignore[method-assign]
    stop = asyncio.Event()

    async def attempt() -> None:
        asyncio.get_running_loop().call_soon(stop.set)
        raise TimeoutError

    # Ends once ``stop`` is set, not after the hour (the test's own timeout would fail it).
    async with asyncio.timeout(60):
        with pytest.raises(_Stopped):
            await bus._through_outages("c", attempt, stop)


# --- what a consumer has heard -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(bus_module, "_utc_now", clock)
    return clock


def test_connected_since_is_when_the_connection_was_made_or_last_came_back(clock: Clock) -> None:
    nc = FakeNats()
    bus = make_bus(nc)
    clock.at(10)
    assert bus.connected_since == T0
    nc.is_connected = False
    assert bus.connected_since is None
    nc.is_connected = True
    nc.stats["reconnects"] = 1  # a reconnect no callback reported
    assert bus.connected_since == T0 + timedelta(seconds=10)
    clock.at(20)
    assert bus.connected_since == T0 + timedelta(seconds=10)


def test_a_bus_made_while_disconnected_counts_from_when_it_is_first_connected(
    clock: Clock,
) -> None:
    nc = FakeNats(connected=False)
    bus = make_bus(nc)
    assert bus.connected_since is None
    clock.at(5)
    nc.is_connected = True
    assert bus.connected_since == T0 + timedelta(seconds=5)


def test_hearing_begins_with_a_drained_fetch_after_the_connection_and_the_first_fetch(
    clock: Clock,
) -> None:
    bus = make_bus()
    assert bus.hearing("c") is None  # not running
    bus._fetched("c", clock.at(1), drained=False)  # a full batch: more may be waiting
    assert bus.hearing("c") is None
    bus._fetched("c", clock.at(2), drained=True)
    assert bus.hearing("c") == Hearing(T0 + timedelta(seconds=1), T0 + timedelta(seconds=2))
    assert bus.hearing("other") is None
    bus._fetched("c", clock.at(3), drained=True)
    assert bus.hearing("c") == Hearing(T0 + timedelta(seconds=1), T0 + timedelta(seconds=3))


def test_a_first_fetch_that_drains_is_heard_through_at_once(clock: Clock) -> None:
    bus = make_bus()
    bus._fetched("c", clock.at(0), drained=True)
    assert bus.hearing("c") == Hearing(T0, T0)


def test_after_a_reconnect_hearing_waits_for_a_fetch_asked_since(clock: Clock) -> None:
    nc = FakeNats()
    bus = make_bus(nc)
    bus._fetched("c", clock.at(1), drained=True)
    nc.stats["reconnects"] = 1
    clock.at(5)
    assert bus.hearing("c") is None  # heard through 1 s, connected again since 5 s
    bus._fetched("c", T0 + timedelta(seconds=4), drained=True)  # asked before the reconnect
    assert bus.hearing("c") is None
    bus._fetched("c", clock.at(6), drained=True)
    assert bus.hearing("c") == Hearing(T0 + timedelta(seconds=5), T0 + timedelta(seconds=6))
    nc.is_connected = False
    assert bus.hearing("c") is None


def test_a_fetch_while_disconnected_hears_nothing(clock: Clock) -> None:
    nc = FakeNats()
    bus = make_bus(nc)
    nc.is_connected = False
    bus._fetched("c", clock.at(1), drained=True)
    nc.is_connected = True
    assert bus.hearing("c") is None


@pytest.mark.parametrize(
    ("user", "makes"), [(None, True), ("scheduler", True), ("registry", False)]
)
def test_only_the_scheduler_or_an_operator_makes_the_streams(user: str | None, makes: bool) -> None:
    assert make_bus(user=user).makes_streams is makes


async def test_not_ready_while_disconnected_or_paused() -> None:
    nc = FakeNats(connected=False)
    bus = make_bus(nc)
    assert await bus.ping() is False
    nc.is_connected = True
    bus._paused["c"] = "PostgreSQL unavailable"
    assert await bus.ping() is False


def test_only_the_separator_of_an_empty_message_is_trimmed() -> None:
    assert infrastructure_fault(OSError("NO ROUTE TO HOST X")) == (
        "unreachable or timed out (OSError: NO ROUTE TO HOST X)"
    )


def test_an_error_seen_twice_does_not_end_the_search() -> None:
    seen_twice = ValueError("the same error, twice")
    group = ExceptionGroup("tasks", [asyncpg.CannotConnectNowError("up"), seen_twice, seen_twice])
    assert infrastructure_fault(group) == "PostgreSQL unavailable (CannotConnectNowError: up)"


# --- making the streams --------------------------------------------------------------------


class StoreFailingJetStream:
    """``add_stream`` fails to create the store ``failures`` times, then makes the stream."""

    def __init__(self, failures: int, err_code: int = 10049) -> None:
        self.failures = failures
        self.err_code = err_code
        self.added: list[str] = []

    async def add_stream(self, config: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise nats.js.errors.ServerError(
                code=500, err_code=self.err_code, description="error creating store for stream"
            )
        self.added.append(config.name)


def bus_on(js: StoreFailingJetStream, monkeypatch: pytest.MonkeyPatch) -> Bus:
    monkeypatch.setattr(bus_module, "STORE_RETRY_S", 0)
    bus = make_bus()
    bus._js = js  # type: ignore[assignment]
    return bus


async def test_a_store_the_server_fails_to_create_at_first_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    js = StoreFailingJetStream(failures=bus_module.STORE_RETRIES)
    await bus_on(js, monkeypatch).ensure_streams()
    assert js.added == ["TRAINYARD", "TRAINYARD_DEADLETTER", "TRAINYARD_ATTEMPTS"]


async def test_a_store_that_keeps_failing_or_another_server_error_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(nats.js.errors.ServerError):
        await bus_on(
            StoreFailingJetStream(failures=bus_module.STORE_RETRIES + 1), monkeypatch
        ).ensure_streams()
    other = StoreFailingJetStream(failures=1, err_code=10077)
    with pytest.raises(nats.js.errors.ServerError):
        await bus_on(other, monkeypatch).ensure_streams()
    assert other.added == []


async def test_a_closed_connections_try_to_reconnect_is_cancelled_until_it_ends() -> None:
    # The client cancels its reconnecting task once on close; a cancellation lost inside a
    # try to connect left the task trying every 2 s for ever (an event loop that never
    # closed, under load). Here the task loses the first two cancellations.
    lost = 0

    async def reconnecting() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(2)
            except asyncio.CancelledError:
                if lost < 2:
                    lost += 1
                    continue
                raise

    class Closed:
        is_connected = False

        def __init__(self) -> None:
            self._reconnection_task = asyncio.create_task(reconnecting())

        async def close(self) -> None:
            self._reconnection_task.cancel()  # once, as the client does
            await asyncio.sleep(0)

    client = Closed()
    await asyncio.sleep(0)  # the task is running
    await bus_module._close(client)  # type: ignore[arg-type]
    assert client._reconnection_task.done() and lost == 2
