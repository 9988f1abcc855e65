"""Deadlines for slow clients: uvicorn's h11 protocol, made safe from Slowloris attacks.

uvicorn has no timeout for a request whose headers never finish, nor for a body that comes a
byte at a time (its keep-alive timer is stopped by every byte that comes). A client sending a
header line now and then kept a connection for good (one was still open after 90 s on the
local stack); so did a client trickling a body, even after the service had answered without
reading it (uvicorn then reads and drops the rest). A few hundred such clients keep every
connection a process can hold.

Contract (``SlowClientDeadlines``, given to uvicorn as its ``http`` protocol):
- **Headers.** A connection whose request line and headers are not all in within
  ``HEADERS_TIMEOUT_S`` of the connection opening, or of the end of the previous response on
  it, is closed, with no answer (no request was made).
- **Body.** While a request's body is coming, it must average at least
  ``MIN_BODY_BYTES_PER_S`` over the time the server has waited for it, once
  ``BODY_GRACE_S`` of waiting have passed; otherwise the connection is closed (the handler,
  if it is reading, sees the client gone). Time does not count while the server itself is
  not reading: uvicorn paused reading because the handler has not taken what came, or the
  client waits for ``100 Continue`` that only the handler's first read sends. This is
  Kestrel's rule, with its defaults (240 bytes/s after 5 s); any real client, however slow
  its link, sends far faster.
- **A body nobody reads.** Once a request is answered, the rest of its body (which uvicorn
  reads and drops) and the next request's headers have ``HEADERS_TIMEOUT_S`` together; a
  body still coming then is cut, whatever its rate (nginx's "lingering close", 30 s there).
- None of these touches a request whose body is all in, however long its handling takes;
  an idle keep-alive connection is closed by uvicorn's own timer first, as before.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADERS_TIMEOUT_S = 10.0
"""Seconds a client has to send a request's line and headers (a well-behaved client sends
them at once; proxies such as nginx allow 60 s, Node's HTTP server 60 s, Go's a setting)."""

MIN_BODY_BYTES_PER_S = 240.0
"""The slowest average a body may come at once the grace is over (Kestrel's default)."""

BODY_GRACE_S = 5.0
"""Seconds of waiting for a body before its average rate is checked (Kestrel's default)."""

BODY_CHECK_S = 1.0
"""How often a coming body's rate is checked (one timer per connection, only while a body is
coming)."""


class SlowClientDeadlines(H11Protocol):
    """uvicorn's h11 protocol with deadlines for slow headers and bodies (see the module)."""

    _headers_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_waited_s = 0.0
    _body_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_headers()

    def data_received(self, data: bytes) -> None:
        in_body = self.conn.their_state is h11.SEND_BODY
        if in_body:
            self._body_bytes += len(data)
        super().data_received(data)
        self._watch_body(in_body)

    def on_response_complete(self) -> None:
        in_body = self.conn.their_state is h11.SEND_BODY
        # uvicorn parses a pipelined request, buffered while this one was handled, here.
        super().on_response_complete()
        self._watch_body(in_body)
        self._arm_headers()

    def _watch_body(self, was_in_body: bool) -> None:
        """Start checking a body whose request's headers h11 has just parsed (in a read, or
        from what was buffered, for a pipelined request)."""
        if not was_in_body and self.conn.their_state is h11.SEND_BODY:
            # Its body starts now (bytes of it parsed with the headers are not counted,
            # which only makes the rule stricter).
            self._body_waited_s, self._body_bytes = 0.0, 0
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(BODY_CHECK_S, self._check_body)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_headers()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)

    def _arm_headers(self) -> None:
        self._disarm_headers()
        self._headers_timer = self.loop.call_later(HEADERS_TIMEOUT_S, self._headers_overdue)

    def _disarm_headers(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _headers_overdue(self) -> None:
        self._headers_timer = None
        # IDLE: h11 has not parsed a whole request line and headers since the last response;
        # SEND_BODY: the body of a request already answered is still coming (uvicorn reads
        # and drops it), which at the minimum rate could last Content-Length / 240 seconds.
        waiting = self.conn.their_state is h11.IDLE or (
            self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.DONE
        )
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def _check_body(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return  # the body is all in (a next request's headers arm a new check)
        if not (self.flow.read_paused or self.conn.they_are_waiting_for_100_continue):
            self._body_waited_s += BODY_CHECK_S
            too_slow = self._body_bytes < MIN_BODY_BYTES_PER_S * self._body_waited_s
            if self._body_waited_s > BODY_GRACE_S and too_slow:
                self.transport.close()
                return
        self._body_timer = self.loop.call_later(BODY_CHECK_S, self._check_body)
