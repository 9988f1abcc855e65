"""A throwaway S3 endpoint on loopback: ``moto_server`` as a child process.

``S3Server`` starts ``python -m moto.server`` on 127.0.0.1 and a free port, waits until it
answers HTTP, and stops it with SIGTERM (then SIGKILL). moto keeps every bucket in
memory, so data lives exactly as long as the process, and it accepts any credentials;
``access_key``/``secret_key`` are fixed strings so clients have something to sign with.
A server started again (after ``stop()`` or a crash: ``unexpected_exit()``) keeps its port,
so its clients find it again (empty: whoever needs the bucket creates it again).

Use it as a context manager or with ``start()``/``stop()``::

    with S3Server(log_dir=tmp_path) as s3:
        store = open_store("s3://bucket/prefix", s3.storage_settings())
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from pydantic import SecretStr

from trainyard_platform.deploy.local.ports import LOOPBACK, free_port
from trainyard_platform.deploy.local.processes import Exit
from trainyard_platform.shared.settings import StorageSettings

_START_ATTEMPTS = 3
"""Ports tried before giving up: the chosen port can be taken before moto binds it."""


class S3Server:
    """One moto S3 server process; ``endpoint`` is valid between ``start`` and ``stop``."""

    access_key = "trainyard"
    secret_key = "trainyard-secret"
    region = "us-east-1"

    def __init__(self, log_dir: Path | None = None, *, start_timeout_s: float = 30.0) -> None:
        self._log_dir = log_dir
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None
        self._last_port: int | None = None  # kept for a restart

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("S3Server is not running; call start() first")
        return self._port

    @property
    def endpoint(self) -> str:
        """``host:port`` as ``StorageSettings.s3_endpoint`` and ``minio.Minio`` expect it."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def log_path(self) -> Path | None:
        return self._log_dir / "s3.log" if self._log_dir is not None else None

    def storage_settings(self, uri: str = "s3://trainyard") -> StorageSettings:
        """Settings that point an ``ObjectStore`` at this server."""
        return StorageSettings(
            uri=uri,
            s3_endpoint=self.endpoint,
            s3_access_key=self.access_key,
            s3_secret_key=SecretStr(self.secret_key),
            s3_secure=False,
            s3_region=self.region,
        )

    def storage_env(self, uri: str = "s3://trainyard") -> dict[str, str]:
        """The same settings as ``TRAINYARD_STORAGE_*`` variables, for child processes."""
        return {
            "TRAINYARD_STORAGE_URI": uri,
            "TRAINYARD_STORAGE_S3_ENDPOINT": self.endpoint,
            "TRAINYARD_STORAGE_S3_ACCESS_KEY": self.access_key,
            "TRAINYARD_STORAGE_S3_SECRET_KEY": self.secret_key,
            "TRAINYARD_STORAGE_S3_SECURE": "false",
            "TRAINYARD_STORAGE_S3_REGION": self.region,
        }

    def start(self) -> S3Server:
        """Start the server and return once it answers; raises ``RuntimeError`` if it won't.

        The first start picks a free port; later ones (after ``stop()`` or a crash) reuse it.
        """
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError("S3Server is already running")
        self._process = None  # one that crashed
        if self._log_dir is not None and self._log is None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            self._log = (self._log_dir / "s3.log").open("ab")
        try:
            fixed = self._last_port
            for _ in range(1 if fixed is not None else _START_ATTEMPTS):
                if self._try_start(fixed if fixed is not None else free_port()):
                    self._last_port = self._port
                    return self
            raise RuntimeError(
                f"moto S3 server did not start after {_START_ATTEMPTS} attempts"
                + (f" on port {fixed}" if fixed is not None else "")
                + (f"; see {self.log_path}" if self.log_path else "")
            )
        except BaseException:
            self.stop()
            raise

    def _try_start(self, port: int) -> bool:
        """True once the server on ``port`` answers; False if it exited (port taken)."""
        output: IO[bytes] | int = self._log if self._log is not None else subprocess.DEVNULL
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            # Own process group: a terminal Ctrl-C must not kill the object store while the
            # services are still draining checkpoints into it; stop() ends it explicitly.
            process_group=0,
        )
        self._process, self._port = process, port
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._process, self._port = None, None
                return False
            if _answers(f"http://{LOOPBACK}:{port}/"):
                return True
            time.sleep(0.1)
        raise RuntimeError(
            f"moto S3 server on port {port} did not answer within {self._start_timeout_s:.0f}s"
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout_s``. Safe to repeat."""
        process, self._process, self._port = self._process, None, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGCONT)  # a paused server must hear us
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def unexpected_exit(self) -> Exit | None:
        """How the server ended if it exited without ``stop()``, else ``None``."""
        process = self._process
        code = process.poll() if process is not None else None
        return Exit(code) if code is not None else None

    def send_signal(self, sig: int) -> None:
        """Signal the server's process group, with no intent recorded (a fault)."""
        process = self._process
        if process is None or process.poll() is not None:
            raise ProcessLookupError("moto S3 server is not running")
        os.killpg(process.pid, sig)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # an S3 error document is still an answer
    except OSError:
        return False
