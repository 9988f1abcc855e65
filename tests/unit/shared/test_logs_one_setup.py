"""Every line a service process logs goes through its one set-up (``shared.logs``), the
HTTP framework's and server's too: building a Litestar app with its default
``logging_config`` replaced the root handler with a queue listener thread writing to the
stderr of that moment in Litestar's own format, and kept the ``litestar`` logger on that
handler for good; uvicorn's default ``log_config`` kept its loggers on plain-text handlers
of their own. A malformed request to a service under ``TRAINYARD_LOG_FORMAT=json`` was
logged ``WARNING:  Invalid HTTP request received.``, not JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest
from litestar import get
from pydantic import SecretStr

from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


@get("/thing", sync_to_thread=False)
def thing() -> dict[str, str]:
    return {"thing": "yes"}


def test_building_a_service_app_leaves_the_logging_set_up_alone() -> None:
    root = logging.getLogger()
    framework = logging.getLogger("litestar")
    handlers, level = list(root.handlers), root.level
    framework_handlers, framework_propagates = list(framework.handlers), framework.propagate
    listeners = {t for t in threading.enumerate() if t.daemon}

    service_app("test", [thing], service_guard(SecretStr("op-token")))

    assert root.handlers == handlers
    assert root.level == level
    assert framework.handlers == framework_handlers
    assert framework.propagate == framework_propagates
    assert {t for t in threading.enumerate() if t.daemon} <= listeners


async def test_a_malformed_request_is_logged_in_the_services_format(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "json")
    # As in a fresh process: a test app built with plain Litestar(), or a uvicorn.Config with
    # its default log_config, earlier in this one set these loggers up their own way.
    for name in ("litestar", "uvicorn", "uvicorn.error", "uvicorn.access"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    port = free_port()
    settings = ServiceSettings(port=port)
    async with ServiceRuntime("billing", settings) as runtime:
        guard = service_guard(SecretStr("op-token"))
        app = service_app("billing", [thing, *runtime.health_handlers()], guard)
        serving = asyncio.create_task(runtime.run(app))
        try:
            async with asyncio.timeout(30):
                while True:
                    try:
                        reader, writer = await asyncio.open_connection("127.0.0.1", port)
                        break
                    except OSError:
                        await asyncio.sleep(0.05)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            await reader.read()  # uvicorn answers 400 and closes
            writer.close()
            logging.getLogger("litestar").warning("from the framework")
        finally:
            runtime.stopping.set()
            assert await asyncio.wait_for(serving, 30) == 0

    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    messages = {(r["logger"], r["message"]) for r in records}
    assert ("uvicorn.error", "Invalid HTTP request received.") in messages
    assert ("litestar", "from the framework") in messages
    assert all(r["service"] == "billing" for r in records)
