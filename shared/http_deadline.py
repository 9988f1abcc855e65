"""A deadline for each request's headers: uvicorn's h11 protocol, made safe from slow clients.

uvicorn has no timeout for a request whose headers never finish (its keep-alive timer is
stopped by the first byte that comes), so a client sending a header line now and then keeps
a connection, and a few hundred such clients keep them all (the "Slowloris" attack; seen on
the local stack: one was still open after 90 s).

Contract (``HeadersDeadline``, given to uvicorn as its ``http`` protocol):
- A connection whose request line and headers are not all in within ``HEADERS_TIMEOUT_S`` of
  the connection opening, or of the end of the previous response on it, is closed, with no
  answer (no request was made).
- A request whose headers are in is never affected, however long its body takes to come or
  its handling to finish; an idle keep-alive connection is closed by uvicorn's own timer
  first, as before.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADERS_TIMEOUT_S = 10.0
"""Seconds a client has to send a request's line and headers (a well-behaved client sends
them at once; proxies such as nginx allow 60 s, Node's HTTP server 60 s, Go's a setting)."""


class HeadersDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers (see the module)."""

    _headers_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._headers_timer = self.loop.call_later(HEADERS_TIMEOUT_S, self._overdue)

    def _disarm(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _overdue(self) -> None:
        self._headers_timer = None
        # IDLE: h11 has not parsed a whole request line and headers since the last response.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
