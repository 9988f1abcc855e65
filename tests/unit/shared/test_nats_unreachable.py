"""NATS unreachable (or refusing the service's user) is waited for: one log line per outage
naming the setting, never the client library's traceback every 2 s; and a service still
starting stops when it is told to (SIGTERM), instead of ignoring it while it waits."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import nats.errors
import pytest
from pydantic import SecretStr

from trainyard_platform.shared import bus as bus_module
from trainyard_platform.shared import outages
from trainyard_platform.shared.bus import Bus, nats_error_logger
from trainyard_platform.shared.runtime import ServiceRuntime, run_service
from trainyard_platform.shared.settings import NatsSettings, ServiceSettings


async def test_an_outage_is_one_line_naming_the_setting_whatever_its_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While NATS is away the client reports each try's error, and they differ (the lost
    connection's EOF, a reset, then refusals): logged per error, one loss was three lines a
    minute. It is one line (``outages.Dependency``) until NATS answers again."""
    report = nats_error_logger()
    caplog.set_level(logging.DEBUG, logger=outages.__name__)

    await report(nats.errors.UnexpectedEOF())
    await report(ConnectionResetError(104, "Connection reset by peer"))
    for _ in range(5):  # the client's tries, one every 2 s while NATS is away
        await report(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4222)"))

    lines = [r for r in caplog.records if r.name == outages.__name__]
    assert [r.getMessage() for r in lines] == [
        "NATS (TRAINYARD_NATS_URL) unavailable: nats: unexpected EOF; waiting for it"
    ]
    assert lines[0].levelno == logging.WARNING
    assert lines[0].exc_info is None


async def test_a_refused_login_names_the_users_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    report = nats_error_logger()
    caplog.set_level(logging.DEBUG, logger=outages.__name__)

    await report(Exception("nats: 'Authorization Violation'"))

    [line] = [r.getMessage() for r in caplog.records if r.name == outages.__name__]
    assert "Authorization Violation" in line
    assert "TRAINYARD_NATS_URL" in line
    assert "TRAINYARD_NATS_USER" in line


async def test_an_error_that_is_no_outage_is_a_line_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slow consumer or a flush that timed out on a connection that is there says nothing
    of NATS being away (nothing would ever say it answers again)."""
    away = bus_module.nats_dependency()
    report = nats_error_logger(away, connected=lambda: True)
    caplog.set_level(logging.DEBUG)

    await report(nats.errors.SlowConsumerError(subject="s", reply="", sid=1, sub=None))
    await report(nats.errors.FlushTimeoutError())

    assert not away.away
    assert [r.getMessage() for r in caplog.records] == [
        "NATS (TRAINYARD_NATS_URL): nats: slow consumer, messages dropped subject: s, sid: 1, "
        "sub: None",
        "NATS (TRAINYARD_NATS_URL): nats: flush timeout",
    ]


async def test_a_drain_that_timed_out_is_not_said_to_be_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On closing against a NATS that answers nothing, the client reports its drain's
    timeout to this logger, which said "the client keeps trying" of a connection being
    closed; the bus's close says what happened in a line of its own."""
    report = nats_error_logger()
    caplog.set_level(logging.DEBUG, logger=bus_module.__name__)

    await report(nats.errors.DrainTimeoutError())

    assert caplog.records == []


async def test_the_bus_hands_the_client_its_error_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, Any] = {}

    async def connect(url: str, **options: Any) -> None:
        given.update(options)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bus_module.nats, "connect", connect)
    with pytest.raises(RuntimeError, match="stop here"):
        async with Bus.connect(NatsSettings(user="test", password=SecretStr("pw")), "test"):
            pass
    assert given["error_cb"].__qualname__.startswith("nats_error_logger")


def test_sigterm_while_starting_stops_the_service() -> None:
    """Start-up that waits (for NATS, here forever) ends at SIGTERM, with status 0."""

    async def serve(settings: ServiceSettings) -> int:
        async with ServiceRuntime("test", settings) as runtime:
            # What the loop's handler for SIGTERM calls (a real signal would end the whole
            # test process if the handler were missing).
            asyncio.get_running_loop().call_later(0.05, runtime._on_signal, signal.SIGTERM)
            # A guard, not a timing assertion: without the fix this waits for ever.
            await asyncio.wait_for(asyncio.Event().wait(), 30)
        return 5

    assert run_service(serve(ServiceSettings(port=0))) == 0
