"""One job process: started with a control pipe, read line by line, stopped by signals.

Contract:
- The child runs ``argv`` in ``cwd`` with exactly ``env``, stdin closed, stdout and stderr
  merged into one pipe, and the write end of the control pipe inherited (its number is in
  the job's environment). The parent closes its copy of the write end, so the control
  stream ends when the job (and everything it spawned) has exited.
- The child leads its own process group. ``terminate`` sends SIGTERM to the leader only (the
  job's SIGTERM handler checkpoints; its data-loader workers must not die under it);
  ``kill_group`` SIGKILLs the whole group, and is also done once the leader has exited so no
  stray grandchild keeps a GPU or the pipes.
- On Linux the child gets SIGTERM if the runner dies (``PR_SET_PDEATHSIG``), so a crashed
  runner's jobs checkpoint and stop instead of running on unsupervised.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from shared.control import MAX_CONTROL_LINE_BYTES

_PR_SET_PDEATHSIG = 1
OUTPUT_LINE_LIMIT = 64 * 1024
"""Longer output lines are split into pieces of this size."""


def _death_signal_preexec() -> Callable[[], None] | None:
    # The death signal fires when the forking *thread* exits, so only from the main thread.
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    # Loaded in the parent: loading a library after fork in a threaded parent can hang.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the runner died before prctl took effect
            os._exit(1)

    return preexec


class JobProcess:
    """A started job process (use ``await JobProcess.start(...)``)."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        control: asyncio.StreamReader,
        transport: asyncio.ReadTransport,
    ) -> None:
        self._proc = proc
        self._control = control
        self._control_transport = transport

    @classmethod
    async def start(
        cls, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], control_fd_var: str
    ) -> JobProcess:
        """Spawn the job; ``env[control_fd_var]`` is set to the control pipe's write end."""
        read_fd, write_fd = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env={**env, control_fd_var: str(write_fd)},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=(write_fd,),
                process_group=0,
                preexec_fn=_death_signal_preexec(),
                limit=OUTPUT_LINE_LIMIT,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        control = asyncio.StreamReader(limit=MAX_CONTROL_LINE_BYTES + 1, loop=loop)
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(control, loop=loop),
                os.fdopen(read_fd, "rb", buffering=0),
            )
        except BaseException:
            os.close(read_fd)
            proc.kill()
            raise
        return cls(proc, control, transport)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def control_lines(self) -> AsyncIterator[bytes]:
        """Raw control lines until the job closes the pipe."""
        return read_lines(self._control)

    def output_lines(self) -> AsyncIterator[bytes]:
        """Raw stdout/stderr lines until the job closes them."""
        assert self._proc.stdout is not None
        return read_lines(self._proc.stdout)

    async def wait(self) -> int:
        return await self._proc.wait()

    def terminate(self) -> None:
        """SIGTERM to the job's main process only."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """SIGKILL the job's whole process group."""
        # ProcessLookupError / PermissionError: the group is empty already.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self._control_transport.close()


async def read_lines(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """Lines (with their newline) until EOF; a line longer than the reader's limit comes
    out in pieces, and a last line without a newline comes out as it is."""
    while True:
        try:
            yield await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                yield exc.partial
            return
        except asyncio.LimitOverrunError as exc:
            yield await reader.readexactly(max(exc.consumed, 1))
