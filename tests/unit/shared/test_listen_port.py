"""A port another process holds is one log line naming the service's host and port
settings, and exit status 1: uvicorn said ``[Errno 98] error while attempting to bind on
address`` on a line of its own format (not JSON under ``TRAINYARD_LOG_FORMAT=json``), naming
no setting, and ended the process from inside its task with status 3, past the drain."""

from __future__ import annotations

import asyncio
import socket

import pytest

from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


async def test_a_port_in_use_names_the_setting_and_drains(
    capsys: pytest.CaptureFixture[str],
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    drained = asyncio.Event()
    try:
        async with ServiceRuntime("billing", ServiceSettings(port=port)) as runtime:

            async def work() -> None:
                await runtime.stopping.wait()
                drained.set()

            runtime.spawn(work(), "work")
            status = await runtime.run()
    finally:
        holder.close()

    assert status == 1
    assert drained.is_set()
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "cannot start" in line]
    assert "TRAINYARD_BILLING_HOST, TRAINYARD_BILLING_PORT" in line
    assert f"127.0.0.1:{port}" in line
    assert "in use" in line
    assert "Traceback" not in err


async def test_the_service_serves_on_the_port_it_was_given() -> None:
    async with ServiceRuntime("billing", ServiceSettings(port=0)) as runtime:
        serving = asyncio.create_task(runtime.run())
        await asyncio.sleep(0.2)
        runtime.stopping.set()
        assert await asyncio.wait_for(serving, 30) == 0
