"""The services' answers do not name the HTTP server they run on: uvicorn added
``server: uvicorn`` to every answer, which tells a prober which server's flaws to try and
tells a user nothing."""

from __future__ import annotations

import asyncio
import socket

import httpx

from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_no_answer_names_the_server() -> None:
    port = _free_port()
    async with ServiceRuntime("billing", ServiceSettings(host="127.0.0.1", port=port)) as runtime:
        serving = asyncio.create_task(runtime.run())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                for _ in range(200):  # until it listens
                    try:
                        answer = await http.get("/healthz")
                        break
                    except httpx.ConnectError:
                        await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the service never answered")
        finally:
            runtime.stopping.set()
            await asyncio.wait_for(serving, 30)
    assert answer.status_code == 200
    assert "server" not in answer.headers, answer.headers
