"""Free TCP ports on the loopback interface.

``free_port()`` asks the kernel for an unused port on 127.0.0.1 and returns it with the
socket already closed, so there is a short window in which another process could take it.
Callers that start a server on it must therefore notice a failed bind (the process exits
early) and retry with a new port; ``NatsServer`` and ``LocalStack`` do.

``port_is_open()`` tells whether something accepts TCP connections on a loopback port.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nobody listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # No SO_REUSEADDR: we want a port that is truly free, not one in TIME_WAIT.
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct free ports (all sockets held until every port is chosen)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_is_open(port: int, host: str = LOOPBACK, timeout_s: float = 0.2) -> bool:
    """True when a TCP connection to ``host:port`` succeeds right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
