"""The slow-client deadlines on a real uvicorn server on loopback: a client that never
finishes its headers is cut off, and so is one whose body comes too slowly (read or not);
a body the server is not reading meanwhile, and a request whose body is all in, are never
cut."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import uvicorn

from trainyard_platform.shared import http_deadline
from trainyard_platform.shared.http_deadline import SlowClientDeadlines


async def _app(scope, receive, send):  # type: ignore[no-untyped-def]
    """Answers 401 at once to /refuse (reading no body); else reads the whole body, after
    a pause for /late, and answers 200 with its length (what it got when the client left)."""
    if scope["path"] == "/refuse":
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})
        return
    if scope["path"] == "/late":
        await asyncio.sleep(LATE_READ_S)
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
        _app,
        host="127.0.0.1",
        port=0,
        http=SlowClientDeadlines,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=5,  # a failed test may leave a handler waiting for a body
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
LATE_READ_S = 1.5
"""How long /late waits before it reads its body (past the body's grace below)."""


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_deadline, "HEADERS_TIMEOUT_S", 0.3)
    monkeypatch.setattr(http_deadline, "BODY_GRACE_S", 0.3)
    monkeypatch.setattr(http_deadline, "BODY_CHECK_S", 0.1)
    monkeypatch.setattr(http_deadline, "MIN_BODY_BYTES_PER_S", 100_000.0)


async def _trickle(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> bytes:
    """Send a byte of body every 50 ms (20 bytes/s) until the server closes the connection
    (an end of stream or a reset), for at most 10 s; return what the server sent meanwhile,
    or raise AssertionError if it never closed."""
    received = b""
    with contextlib.suppress(ConnectionError):
        for _ in range(200):
            writer.write(b"a")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                chunk = await asyncio.wait_for(reader.read(65536), timeout=0.05)
                if not chunk:
                    writer.close()
                    return received
                received += chunk
        writer.close()  # else the server's shutdown would wait for it
        raise AssertionError(f"still open after 10 s of trickling; got {received!r}")
    writer.close()
    return received


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


async def test_a_body_trickling_in_is_cut_off() -> None:
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        await writer.drain()
        # Closed: the answer, if any, says the handler got only a part of the body.
        answer = await _trickle(writer, reader)
        assert not answer.endswith(b"100000" + END)


@pytest.mark.parametrize(
    "min_rate",
    [
        pytest.param(100_000.0, id="too-slow-for-the-minimum-rate"),
        # Fast enough for the rate, but a long body: the deadline after the answer cuts it.
        pytest.param(10.0, id="fast-enough-but-unread"),
    ],
)
async def test_a_body_trickling_after_the_answer_is_cut_off(
    monkeypatch: pytest.MonkeyPatch, min_rate: float
) -> None:
    """The handler answered without reading the body; uvicorn reads and drops the rest (20
    bytes/s here), and every byte used to keep the connection."""
    monkeypatch.setattr(http_deadline, "MIN_BODY_BYTES_PER_S", min_rate)
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert answer.startswith(b"HTTP/1.1 401")
        await _trickle(writer, reader)


async def test_a_body_the_handler_is_not_reading_yet_is_not_cut() -> None:
    """300 KB sent at once fill uvicorn's buffer, which then stops reading until the handler
    reads (after LATE_READ_S, past the grace): that wait is the server's, not the client's."""
    size = 300_000
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(b"b" * size)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"%d" % size + END)
        writer.close()


async def test_a_client_waiting_for_100_continue_is_not_cut() -> None:
    """The client sends its body only after ``100 Continue``, which the handler's first read
    (after LATE_READ_S, past the grace) makes uvicorn send."""
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert interim.startswith(b"HTTP/1.1 100")
        writer.write(b"abcde")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"5" + END)
        writer.close()


async def test_a_slow_body_and_a_second_request_are_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body whose last bytes come after a pause within the body's grace is served, though
    the headers' deadline is past, and so is a next request on the same connection."""
    monkeypatch.setattr(http_deadline, "BODY_GRACE_S", 5.0)
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        await writer.drain()
        await asyncio.sleep(0.6)  # past the headers' deadline: the headers were in
        writer.write(b"cde")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\n1\r\n5" + END)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection, again
        await writer.drain()
        second = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"\r\n\r\n1\r\n0" + END)
        writer.close()


async def test_a_pipelined_body_trickling_in_is_cut_off() -> None:
    """A request sent behind another before its answer is parsed by uvicorn only once that
    answer is out (not as data comes): its body is held to the same rate."""
    async with _serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
        )
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(END), timeout=10)
        assert first.startswith(b"HTTP/1.1 200")
        answer = await _trickle(writer, reader)
        assert not answer.endswith(b"100000" + END)
