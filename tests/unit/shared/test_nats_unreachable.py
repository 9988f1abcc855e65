"""NATS unreachable (or refusing the service's user) is waited for: one log line per reason
naming the setting, never the client library's traceback every 2 s; and a service still
starting stops when it is told to (SIGTERM), instead of ignoring it while it waits."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import nats.errors
import pytest

from trainyard_platform.shared import bus as bus_module
from trainyard_platform.shared.bus import Bus, nats_error_logger
from trainyard_platform.shared.runtime import ServiceRuntime, run_service
from trainyard_platform.shared.settings import NatsSettings, ServiceSettings


async def test_each_reason_is_one_line_naming_the_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    report = nats_error_logger()
    caplog.set_level(logging.DEBUG, logger=bus_module.__name__)

    for _ in range(5):  # the client's tries, one every 2 s while NATS is away
        await report(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4222)"))
    await report(Exception("nats: 'Authorization Violation'"))

    lines = [r for r in caplog.records if r.name == bus_module.__name__]
    assert len(lines) == 2
    for record in lines:
        assert record.levelno == logging.WARNING
        assert record.exc_info is None
        assert "TRAINYARD_NATS_URL" in record.getMessage()
    assert "Connect call failed" in lines[0].getMessage()
    assert "Authorization Violation" in lines[1].getMessage()
    assert "TRAINYARD_NATS_USER" in lines[1].getMessage()


async def test_a_drain_that_timed_out_is_not_said_to_be_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On closing against a NATS that answers nothing, the client reports its drain's
    timeout to this logger, which said "the client keeps trying" of a connection being
    closed; the bus's close says what happened in a line of its own."""
    report = nats_error_logger()
    caplog.set_level(logging.DEBUG, logger=bus_module.__name__)

    await report(nats.errors.DrainTimeoutError())

    assert [r for r in caplog.records if r.name == bus_module.__name__] == []


async def test_the_bus_hands_the_client_its_error_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, Any] = {}

    async def connect(url: str, **options: Any) -> None:
        given.update(options)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bus_module.nats, "connect", connect)
    with pytest.raises(RuntimeError, match="stop here"):
        async with Bus.connect(NatsSettings(), "test"):
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
