"""The headers deadline on a real uvicorn server on loopback: a client that never finishes
its headers is cut off; a request whose headers are in is never cut, however slow its body."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import uvicorn

from trainyard_platform.shared import http_deadline
from trainyard_platform.shared.http_deadline import HeadersDeadline


async def _app(scope, receive, send):  # type: ignore[no-untyped-def]
    """Reads the whole body, answers 200 with its length."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


@contextlib.asynccontextmanager
async def _serving() -> AsyncIterator[int]:
    config = uvicorn.Config(
        _app, host="127.0.0.1", port=0, http=HeadersDeadline, log_level="warning", lifespan="off"
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


END = b"\r\n0\r\n\r\n"
"""The end of a chunked answer."""


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_deadline, "HEADERS_TIMEOUT_S", 0.3)


async def test_headers_that_never_finish_are_cut_off() -> None:
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: never finished
        await writer.drain()
        writer.write(b"X-Slow: 1\r\n")  # a byte now and then stops uvicorn's own timer
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""  # closed, no answer
        writer.close()


async def test_a_silent_connection_is_cut_off() -> None:
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        writer.close()


async def test_a_slow_body_and_a_second_request_are_served() -> None:
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        await writer.drain()
        await asyncio.sleep(0.6)  # past the deadline: the headers were in, the body is not
        writer.write(b"cde")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\n1\r\n5" + END)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection, again
        await writer.drain()
        second = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"\r\n\r\n1\r\n0" + END)
        writer.close()
