"""The outbox relay's loop (``OutboxRelay.run`` and its helpers), its decisions without
servers: the growing pause after failures and its caps, a pause cut short by a reconnect or
a stop, what it logs for each kind of failure, the parked rows it reports, the flush on
stop, and when it looks at the stream again.

Publishing and the database are scripted here (``relay_once``, ``check_stream``, a pool that
answers one count): the loop's own rules are under test, and a clock of the test's stands in
for the event loop's where the loop reads the time, so no test waits or measures time. The
real relay on NATS and PostgreSQL is tested in tests/integration/shared/test_outbox*.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from nats.errors import ConnectionClosedError

from trainyard_platform.shared import outbox
from trainyard_platform.shared.bus import StreamMissingError
from trainyard_platform.shared.outbox import OutboxRelay, _log_failure
from trainyard_platform.shared.settings import NatsSettings


@dataclass
class _Nats:
    stats: dict[str, int] = field(default_factory=lambda: {"reconnects": 0})


@dataclass
class _Bus:
    nats: _Nats = field(default_factory=_Nats)
    settings: NatsSettings = field(default_factory=NatsSettings)


class _Conn:
    def __init__(self, answer: int | BaseException) -> None:
        self.answer = answer

    async def fetchval(self, query: str) -> int:
        assert "parked_at IS NOT NULL" in query
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class _Pool:
    """Answers ``parked_count``'s one query (or fails it)."""

    def __init__(self, parked: int | BaseException = 0) -> None:
        self.parked = parked

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[_Conn]:
        yield _Conn(self.parked)


class Scripted(OutboxRelay):
    """A relay whose ``relay_once`` answers from a script (a count, or an error to raise);
    when the script is over it sets ``stop``. Pauses and sleeps are recorded, not waited."""

    def __init__(self, script: list[int | Exception], parked: int | BaseException = 0, **kw: Any):
        super().__init__(_Pool(parked), _Bus(), **kw)  # type: ignore[arg-type]
        self.script = list(script)
        self.stop = asyncio.Event()
        self.steps: list[str] = []
        self.pauses: list[float] = []
        self.sleeps: list[tuple[float, bool]] = []
        self.registered: list[bool] = []

    async def relay_once(self) -> int:
        self.registered.append(self in outbox._relays)
        if not self.script:
            self.stop.set()
            self.steps.append("relay: 0 (stop)")
            return 0
        answer = self.script.pop(0)
        self.steps.append(f"relay: {answer!r}")
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def check_stream(self) -> int:
        self.steps.append("check")
        self._stream_checked = (asyncio.get_running_loop().time(), 0)
        return 0

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        self.pauses.append(seconds)

    async def _sleep(self, stop: asyncio.Event, seconds: float, wake: bool = True) -> None:
        self.sleeps.append((seconds, self._wake.is_set()))
        self.steps.append("sleep")


async def run(relay: Scripted) -> None:
    async with asyncio.timeout(10):  # a safety net only; the script ends the loop
        await relay.run(relay.stop)


# --- the pause after failures -------------------------------------------------------------


async def test_each_failure_doubles_the_pause_up_to_its_cap_and_a_success_resets_it() -> None:
    fail = ConnectionRefusedError(111, "refused")
    relay = Scripted([fail, fail, fail, fail, fail, 1, fail, 0], idle_poll_s=0.5, max_backoff_s=3.0)
    await run(relay)
    assert relay.pauses == [0.5, 1.0, 2.0, 3.0, 3.0, 0.5]


async def test_many_failures_keep_the_pause_at_its_cap() -> None:
    fail = TimeoutError()
    relay = Scripted([fail] * 20, idle_poll_s=0.001, max_backoff_s=1000.0)
    await run(relay)
    assert relay.pauses[:3] == [0.001, 0.002, 0.004]
    # The exponent stops at 16: 0.001 * 2**16 = 65.536, far below the cap.
    assert relay.pauses[16:] == [pytest.approx(65.536)] * 4


async def test_a_missing_stream_is_retried_within_two_seconds() -> None:
    missing = StreamMissingError("stream TRAINYARD does not exist")
    relay = Scripted([missing] * 4, idle_poll_s=1.5, max_backoff_s=30.0)
    await run(relay)
    assert relay.pauses == [1.5, 2.0, 2.0, 2.0]


async def test_the_cap_is_never_below_the_idle_poll() -> None:
    relay = Scripted([TimeoutError()] * 2, idle_poll_s=4.0, max_backoff_s=1.0)
    await run(relay)
    assert relay.pauses == [4.0, 4.0]


# --- the loop ------------------------------------------------------------------------------


@pytest.mark.timeout(10)  # FROZEN_LOOP_GUARD, below
async def test_the_stream_is_looked_at_first_and_again_after_every_failure(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the test's clock: how long a scripted round takes on this machine decides nothing.
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Scripted([2, OSError("down"), 1, 0], stream_check_s=3600.0)
    await run(relay)
    assert relay.steps == [
        "check",
        "relay: 2",
        "sleep",  # a busy relay lets commits gather for a round (busy_round_s)
        "relay: OSError('down')",
        "check",
        "relay: 1",
        "sleep",
        "relay: 0",
        "sleep",
        "relay: 0 (stop)",
        "sleep",
        "relay: 0 (stop)",  # the flush on stop
    ]


@pytest.mark.timeout(10)  # FROZEN_LOOP_GUARD, below
async def test_it_sleeps_only_when_nothing_was_sent_and_wakes_are_cleared_before_a_read(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Scripted([3, 0, 0], idle_poll_s=0.75, stream_check_s=3600.0)
    relay.wake()  # a wake from before the loop started is used up by the first read
    await run(relay)
    (gather, woken), *idle = relay.sleeps
    assert 0 < gather <= relay._busy_round_s and not woken  # after the round that sent 3
    assert idle == [(0.75, False)] * 3
    assert relay.pauses == []


@pytest.mark.timeout(10)  # FROZEN_LOOP_GUARD, below
async def test_a_full_batch_is_followed_at_once_and_a_partial_one_by_a_gathering_pause(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Scripted([100, 100, 7, 0], batch=100, busy_round_s=0.05, stream_check_s=3600.0)
    await run(relay)
    assert relay.steps[:6] == ["check", "relay: 100", "relay: 100", "relay: 7", "sleep", "relay: 0"]
    assert 0 < relay.sleeps[0][0] <= 0.05


async def test_without_a_gathering_time_a_busy_relay_reads_again_at_once() -> None:
    relay = Scripted([2, 1, 0], busy_round_s=0.0, stream_check_s=3600.0)
    await run(relay)
    assert relay.steps[:5] == ["check", "relay: 2", "relay: 1", "relay: 0", "sleep"]


class SlowRounds(Scripted):
    """Each round takes ``round_s`` on the test's clock."""

    def __init__(self, clock: Clock, round_s: float, script: list[int | Exception], **kw: Any):
        super().__init__(script, **kw)
        self.clock = clock
        self.round_s = round_s

    async def relay_once(self) -> int:
        self.clock.now += self.round_s
        return await super().relay_once()


@pytest.mark.timeout(10)  # FROZEN_LOOP_GUARD, below
async def test_a_round_longer_than_the_gathering_time_is_followed_at_once(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = SlowRounds(clock, 0.02, [2, 1, 0], busy_round_s=0.01, stream_check_s=3600.0)
    await run(relay)
    assert relay.steps[:5] == ["check", "relay: 2", "relay: 1", "relay: 0", "sleep"]
    # ... and a shorter one by a pause of what is left of it.
    clock = Clock()
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = SlowRounds(clock, 0.004, [2, 0], busy_round_s=0.01, stream_check_s=3600.0)
    await run(relay)
    assert relay.steps[:4] == ["check", "relay: 2", "sleep", "relay: 0"]
    assert relay.sleeps[0][0] == pytest.approx(0.006)


async def test_a_stop_flushes_what_is_committed_then_returns() -> None:
    relay = Scripted([0], stream_check_s=3600.0)
    flushed: list[int] = []

    async def relay_once() -> int:
        flushed.append(len(flushed))
        return [4, 2, 0][len(flushed) - 1]

    await run(relay)  # one read, a sleep, then the script sets stop
    relay.relay_once = relay_once  # type: ignore[method-assign]
    relay.stop = asyncio.Event()
    relay.stop.set()
    await relay.run(relay.stop)
    assert flushed == [0, 1, 2]  # until a read finds nothing


async def test_the_relay_is_known_to_the_wake_only_while_it_runs() -> None:
    relay = Scripted([1, 0])
    assert relay not in outbox._relays
    await run(relay)
    assert relay.registered and all(relay.registered)
    assert relay not in outbox._relays


async def test_an_error_in_the_loop_is_logged_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = Scripted([RuntimeError("a bug")], idle_poll_s=0.25)
    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.outbox"):
        await run(relay)
    records = [r for r in caplog.records if r.name == "trainyard_platform.shared.outbox"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.ERROR, "outbox relay failed; retrying in 0.2s")
    ]


# --- what a failure logs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (TimeoutError(), "outbox relay: TimeoutError; retrying in 1.5s"),
        (
            ConnectionRefusedError(111, "refused"),
            "outbox relay: [Errno 111] refused; retrying in 1.5s",
        ),
        (ConnectionClosedError(), "outbox relay: nats: connection closed; retrying in 1.5s"),
        (StreamMissingError("no stream"), "outbox relay: no stream; retrying in 1.5s"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_an_outage_is_a_warning_of_one_line(
    caplog: pytest.LogCaptureFixture, error: Exception, said: str
) -> None:
    with caplog.at_level(logging.DEBUG, logger="trainyard_platform.shared.outbox"):
        _log_failure(error, 1.5)
    [record] = caplog.records
    assert (record.levelno, record.getMessage(), record.exc_info) == (logging.WARNING, said, None)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (asyncpg.CannotConnectNowError("starting up"), "starting up"),
        (asyncpg.InterfaceError("connection is closed"), "connection is closed"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_a_postgresql_outage_is_the_one_line_of_its_outage(
    caplog: pytest.LogCaptureFixture, error: Exception, said: str
) -> None:
    """The relay tries again at 1, 2, 4 ... 30 s and logged 'outbox relay: starting up;
    retrying in 1.0s' each time, naming no dependency, beside the outage's own line
    (``shared.outages``): now it tells the outage, logged once (and once a minute)."""
    with caplog.at_level(logging.DEBUG, logger="trainyard_platform.shared.outbox"):
        for delay in (1.0, 2.0, 4.0):
            _log_failure(error, delay)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        f"PostgreSQL (TRAINYARD_DATABASE_URL) unavailable: {said}; waiting for it"
    )


@pytest.mark.parametrize(
    "error",
    [KeyError("seq"), asyncpg.UndefinedColumnError('column "x" does not exist')],
    ids=lambda value: type(value).__name__,
)
def test_anything_else_is_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    with caplog.at_level(logging.DEBUG, logger="trainyard_platform.shared.outbox"):
        _log_failure(error, 2.25)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "outbox relay failed; retrying in 2.2s"
    assert record.exc_info is not None and record.exc_info[1] is error


# --- parked rows and the flush -------------------------------------------------------------


async def test_parked_rows_are_reported_when_the_relay_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = Scripted([], parked=3)
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.outbox"):
        await run(relay)
    records = [r for r in caplog.records if r.name == "trainyard_platform.shared.outbox"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            logging.WARNING,
            "outbox: 3 parked rows can never be published (see outbox.parked_reason)",
        )
    ]


@pytest.mark.parametrize(
    "parked", [0, ConnectionRefusedError(111, "refused"), asyncpg.CannotConnectNowError("up")]
)
async def test_no_parked_rows_or_no_database_at_start_says_nothing(
    caplog: pytest.LogCaptureFixture, parked: int | BaseException
) -> None:
    relay = Scripted([1], parked=parked)
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.outbox"):
        await run(relay)
    assert [r for r in caplog.records if r.name == "trainyard_platform.shared.outbox"] == []
    assert relay.steps[:2] == ["check", "relay: 1"]  # it started all the same


async def test_a_bug_while_counting_parked_rows_is_not_hidden() -> None:
    relay = Scripted([], parked=ValueError("bad query"))
    with pytest.raises(ValueError, match="bad query"):
        await run(relay)
    assert relay not in outbox._relays


async def test_a_failed_final_flush_is_logged_and_the_relay_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = Scripted([], stream_check_s=3600.0)
    relay.stop.set()

    async def relay_once() -> int:
        raise ConnectionRefusedError(111, "refused")

    relay.relay_once = relay_once  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.outbox"):
        await run(relay)
    records = [r for r in caplog.records if r.name == "trainyard_platform.shared.outbox"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "outbox relay: final flush stopped: [Errno 111] refused")
    ]


async def test_a_final_flush_that_timed_out_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A PostgreSQL that does not answer fails the flush with a ``TimeoutError``, whose text
    is empty: the line ended in "final flush stopped: " and said nothing."""
    relay = Scripted([], stream_check_s=3600.0)
    relay.stop.set()

    async def relay_once() -> int:
        raise TimeoutError

    relay.relay_once = relay_once  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="trainyard_platform.shared.outbox"):
        await run(relay)
    assert "outbox relay: final flush stopped: TimeoutError" in caplog.messages


# --- when the stream is looked at, and the pause itself (on the test's clock) ---------------


FROZEN_LOOP_GUARD = pytest.mark.timeout(10)
"""These tests stop the event loop's clock; should the code under test wait on a real timer
(a fault in it), nothing would wake it, so they fail after 10 s instead of hanging."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    """Set as the running loop's ``time`` by each test (nothing there schedules a timer)."""
    return Clock()


class Checking(OutboxRelay):
    """A relay as it is, but for ``stream_created`` (a fixed identity) and its database (a
    stream already recorded): ``check_stream`` then takes no lock and writes nothing."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(_Pool(), _Bus(), **kw)  # type: ignore[arg-type]


@FROZEN_LOOP_GUARD
async def test_the_stream_is_looked_at_again_after_its_interval_or_a_reconnect(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Checking(stream_check_s=5.0)
    bus = relay._bus
    assert relay._stream_check_due()  # never looked
    relay._stream_checked = (clock.now, 0)
    assert not relay._stream_check_due()
    clock.now += 4.9
    assert not relay._stream_check_due()
    clock.now += 0.1  # exactly the interval
    assert relay._stream_check_due()
    relay._stream_checked = (clock.now, 0)
    bus.nats.stats["reconnects"] = 1
    assert relay._stream_check_due()
    relay._stream_checked = (clock.now, 1)
    assert not relay._stream_check_due()


def _paused(
    relay: OutboxRelay, clock: Clock, bus: Any, reconnect_after: int | None = None
) -> list[tuple[float, bool]]:
    slept: list[tuple[float, bool]] = []

    async def sleep(stop: asyncio.Event, seconds: float, wake: bool = True) -> None:
        slept.append((round(seconds, 6), wake))
        clock.now += seconds
        if reconnect_after is not None and len(slept) == reconnect_after:
            bus.nats.stats["reconnects"] += 1

    relay._sleep = sleep  # type: ignore[method-assign]
    return slept


@FROZEN_LOOP_GUARD
async def test_a_pause_waits_its_time_in_short_steps_that_a_commit_does_not_end(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Checking()
    slept = _paused(relay, clock, relay._bus)
    start = clock.now
    await relay._pause(asyncio.Event(), 0.6)
    assert slept == [(0.25, False), (0.25, False), (0.1, False)]
    assert clock.now == pytest.approx(start + 0.6)


@FROZEN_LOOP_GUARD
async def test_a_reconnect_ends_the_pause(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Checking()
    slept = _paused(relay, clock, relay._bus, reconnect_after=2)
    await relay._pause(asyncio.Event(), 30.0)
    assert slept == [(0.25, False), (0.25, False)]


@FROZEN_LOOP_GUARD
async def test_a_stop_or_no_time_left_ends_the_pause_at_once(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    relay = Checking()
    slept = _paused(relay, clock, relay._bus)
    stop = asyncio.Event()
    stop.set()
    await relay._pause(stop, 30.0)
    await relay._pause(asyncio.Event(), 0.0)
    assert slept == []


async def test_the_real_sleep_ends_on_a_wake_or_a_stop_and_leaves_no_waiter() -> None:
    relay = Checking()
    stop = asyncio.Event()
    before = len(asyncio.all_tasks())
    relay.wake()
    async with asyncio.timeout(30):
        await relay._sleep(stop, 3600.0)  # woken at once
        stop.set()
        await relay._sleep(stop, 3600.0, wake=False)  # stopped at once
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before


async def test_an_outage_in_the_loop_is_a_warning_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = Scripted([OSError("PostgreSQL is down")], idle_poll_s=0.25)
    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.outbox"):
        await run(relay)
    records = [r for r in caplog.records if r.name == "trainyard_platform.shared.outbox"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "outbox relay: PostgreSQL is down; retrying in 0.2s")
    ]
