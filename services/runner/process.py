"""One job process: started as its own user, its output read line by line, stopped by
signals; and the named pipes a job of several processes writes each rank's output to.

Contract:
- The child runs ``argv`` in ``cwd`` with exactly ``env``, in the attempt's cgroup when it
  has one (joined before anything of the job runs), as ``user`` when one is given (no
  supplementary groups), with umask 077, stdin closed, stdout and stderr merged into one
  pipe.
- The child leads its own session, hence its own process group, and has no controlling
  terminal (the runner's, when it has one, is never the job's to read or write).
  ``terminate`` sends SIGTERM to the leader only (the job's SIGTERM handler checkpoints;
  its data-loader workers must not die under it, and ``torchrun`` forwards it to its
  workers); ``kill_group`` SIGKILLs the whole group, and is also done once the leader has
  exited so no stray grandchild keeps a GPU or the pipes.
- On Linux the child is SIGKILLed if the runner dies (``PR_SET_PDEATHSIG``, set after the
  switch of user, which would clear it): a job never runs on unsupervised, even one that
  ignores SIGTERM. It loses at most its last checkpoint interval; anything it spawned that
  escaped the group is killed by the next runner before it accepts work
  (``sandbox.kill_leftovers``: every process of the job uids; a runner that is not root,
  whose jobs have no uid of their own, finds the groups its ledger recorded and the
  processes whose environment holds an unfinished allocation's id, ``orphans``).
- Under torchrun, every local rank writes its stdout and stderr to a named pipe of its own
  (``RankPipes``, ``launch.rank_argv``): on the one shared pipe, one rank's partial line
  (``print`` unbuffered writes its pieces one by one) would be spliced into another's, and
  no line could be told apart by rank. torchrun's own output stays on the shared pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from trainyard_platform.services.runner import sandbox
from trainyard_platform.services.runner.cgroups import JobCgroup
from trainyard_platform.services.runner.sandbox import JobUser

JOB_UMASK = 0o077
"""What a job creates is its own uid's alone: other teams' jobs run beside it as other uids,
and it writes where every user may read (``/dev/shm``, ``/tmp``)."""
OUTPUT_LINE_LIMIT = 64 * 1024
"""Longer output lines are split into pieces of this size."""


class JobProcess:
    """A started job process (use ``await JobProcess.start(...)``)."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        output: asyncio.StreamReader,
        transport: asyncio.ReadTransport,
    ) -> None:
        self._proc = proc
        self._output = output
        self._output_transport = transport

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        user: JobUser | None = None,
        max_processes: int | None = None,
        cgroup: JobCgroup | None = None,
        own_network: bool = False,
    ) -> JobProcess:
        """Spawn the job (raises ``OSError`` and the like when it cannot be started) in its
        ``cgroup`` when it has one; when it runs as a ``user`` of its own, that user may have
        ``max_processes`` processes and threads at most (``sandbox.job_preexec``, which
        also switches to the user); with ``own_network``, in a network of its own holding
        only its loopback (``netns``)."""
        isolated = user is not None and user.isolated
        # Our own pipe, not asyncio's: asyncio's wait() also waits for its pipes to close,
        # which a grandchild that left the group (torchrun's workers do) could delay forever.
        read_fd, write_fd = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=dict(env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                # A session of its own, so no controlling terminal: a runner started from a
                # root shell would otherwise share that terminal with the job, which could
                # read what the operator types or push input into the shell (TIOCSTI).
                start_new_session=True,
                umask=JOB_UMASK,
                preexec_fn=sandbox.job_preexec(
                    max_processes if isolated else None, user, cgroup, own_network
                ),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        output = asyncio.StreamReader(limit=OUTPUT_LINE_LIMIT, loop=loop)
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(output, loop=loop),
                os.fdopen(read_fd, "rb", buffering=0),
            )
        except BaseException:
            os.close(read_fd)
            # The whole group: what it started meanwhile would run on unwatched.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        return cls(proc, output, transport)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def output_lines(self) -> AsyncIterator[bytes]:
        """Raw stdout/stderr lines until every process holding them has closed them."""
        return read_lines(self._output)

    def output_pieces(self) -> AsyncIterator[bytes]:
        """The same output, each piece a whole line (``read_pieces``)."""
        return read_pieces(self._output)

    def close(self) -> None:
        self._output_transport.close()

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


async def read_pieces(
    reader: asyncio.StreamReader, limit: int = OUTPUT_LINE_LIMIT
) -> AsyncIterator[bytes]:
    """Lines until EOF, each whole with its newline, none empty: a line of more than
    ``limit`` bytes comes out in pieces of ``limit`` bytes (its last piece with the
    newline), a last line without a newline as it is. Never more than ``limit`` bytes
    (and a newline) are held back waiting for the end of a line."""
    pending = bytearray()
    while chunk := await reader.read(limit):
        pending += chunk
        start = 0
        while True:
            end = pending.find(b"\n", start, start + limit + 1)
            if end >= 0:
                yield bytes(pending[start : end + 1])
                start = end + 1
            elif len(pending) - start > limit:
                yield bytes(pending[start : start + limit])
                start += limit
            else:
                break
        del pending[:start]
    if pending:
        yield bytes(pending)


class RankPipes:
    """One named pipe per local rank of a job of several processes, which that rank's stdout
    and stderr go to (``launch.rank_argv``); read with ``lines``. Open them before the job
    starts (``open``), ``release`` them once its main process has exited, ``close`` them
    once read."""

    def __init__(self) -> None:
        self._readers: list[asyncio.StreamReader] = []
        self._transports: list[asyncio.BaseTransport] = []
        self._write_fds: list[int] = []

    @classmethod
    async def open(cls, folder: Path, count: int, user: JobUser) -> RankPipes:
        """Make ``folder`` (the runner's: the job cannot replace a pipe in it; others pass
        through when the job has a user of its own) with the FIFOs ``0 .. count-1``, each
        0600 and the job user's, so that no other job can write into this one's output; open
        each for reading. Each is also held open for writing until ``release``: a FIFO
        without a writer reads as ended, and a rank opens its own only once torchrun has
        started it. Raises ``OSError`` when they cannot be made (nothing is left open)."""
        pipes = cls()
        loop = asyncio.get_running_loop()
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o711 if user.isolated else 0o700)  # whatever the runner's umask
            for local_rank in range(count):
                path = folder / str(local_rank)
                os.mkfifo(path, 0o600)
                os.chmod(path, 0o600)
                if user.uid is not None and user.gid is not None:
                    os.chown(path, user.uid, user.gid)
                # Not inherited by the job (PEP 446): it holds only the end it opens itself.
                read_end = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb", buffering=0)
                try:
                    pipes._write_fds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                    reader = asyncio.StreamReader(limit=OUTPUT_LINE_LIMIT, loop=loop)
                    transport, _ = await loop.connect_read_pipe(
                        functools.partial(asyncio.StreamReaderProtocol, reader, loop=loop),
                        read_end,
                    )
                except BaseException:
                    read_end.close()
                    raise
                pipes._readers.append(reader)
                pipes._transports.append(transport)
        except BaseException:
            pipes.close()
            raise
        return pipes

    def lines(self, local_rank: int) -> AsyncIterator[bytes]:
        """The rank's output in whole lines (``read_pieces``) until every process holding
        its pipe has closed it, after ``release``."""
        return read_pieces(self._readers[local_rank])

    def release(self) -> None:
        """Close the runner's own write ends: each pipe ends once the job's processes that
        hold it are gone."""
        for fd in self._write_fds:
            os.close(fd)
        self._write_fds.clear()

    def close(self) -> None:
        self.release()
        for transport in self._transports:
            transport.close()
        self._transports.clear()
