"""A job's own network (``netns``): only its loopback, nothing of the host's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from trainyard_platform.services.runner import netns

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not netns.available(),
    reason="a network namespace needs root and a kernel that allows one",
)

PROBE = textwrap.dedent(
    """
    import socket, sys
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
        print("host: reached")
    except OSError:
        print("host: refused")
    own = socket.create_server(("127.0.0.1", 0))
    socket.create_connection(own.getsockname(), timeout=5).close()
    print("own: reached")
    """
)


def test_a_process_in_its_own_network_reaches_its_loopback_but_no_port_of_the_host() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = str(listener.getsockname()[1])
        argv = [sys.executable, "-I", "-c", PROBE, port]
        inside = subprocess.run(
            argv, preexec_fn=netns.enter_own_network, capture_output=True, text=True, check=True
        )
        outside = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert inside.stdout.split("\n")[:2] == ["host: refused", "own: reached"]
    assert outside.stdout.split("\n")[:2] == ["host: reached", "own: reached"]
