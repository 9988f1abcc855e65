"""A TCP proxy on loopback that can cut its connections: the chaos suite's partition.

``TcpProxy(upstream)`` listens on a free loopback port and forwards every connection to
``upstream()`` (a callable, so the target may be found only once it runs: the NATS port of a
stack that starts after the proxy). ``cut()`` closes every open connection and refuses new
ones (accepted, then closed at once) until ``heal()``: a service behind it loses NATS at once
and reconnects as soon as it is healed. That is a *reset* partition; a black hole (packets
silently dropped) would be noticed only by the client's ping timeout (minutes for nats-py)
and is not what the suite does.

The small interface the suite needs (``port``, ``url``, ``cut``, ``heal``, ``stop``) is all a
replacement must offer (``tests/fixtures/tcp_proxy.py`` when it lands).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

LOOPBACK = "127.0.0.1"


class TcpProxy:
    """Forward loopback connections to ``upstream()``; ``cut`` and ``heal`` them."""

    def __init__(self, upstream: Callable[[], tuple[str, int]], name: str = "proxy") -> None:
        self.name = name
        self._upstream = upstream
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False
        self.port = 0
        self.cuts = 0

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def cut(self) -> None:
        """Close every connection now and refuse new ones until ``heal``."""
        self._cut = True
        self.cuts += 1
        asyncio.run_coroutine_threadsafe(self._drop_all(), self._loop).result(10)

    def heal(self) -> None:
        self._cut = False

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._drop_all()

    async def _drop_all(self) -> None:
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            _abort(writer)
            return
        try:
            host, port = self._upstream()
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            _abort(writer)
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for one in (writer, up_writer):
                self._writers.discard(one)
                _abort(one)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        transport = writer.transport
        if not transport.is_closing():
            transport.abort()
