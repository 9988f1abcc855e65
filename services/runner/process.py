"""One job process: started as its own user, its output read in paced chunks, stopped by
signals; and the named pipes a job of several processes writes each rank's
output to.

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
- The runner's cost of a job's output is bounded by its bytes, not by its lines: each pipe
  is read in chunks (``OutputPipe``), each handled at once: as read for a job of one
  process (``JobProcess.chunks``: a progress bar's update without a newline is not held
  back), cut into blocks of whole lines for a rank's prefix (``line_blocks``,
  ``LineCutter``); and a pipe is read at most about a hundred times a second
  (``OUTPUT_PAUSE_S``): a job writing a line at a time has its lines gathered in the pipe
  meanwhile, and one writing faster than the runner reads fills its pipe and its writes
  block until the runner has read it. The runner's event loop also sends the node's
  heartbeats and supervises the other jobs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
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
OUTPUT_CHUNK = OUTPUT_LINE_LIMIT
"""Most bytes of a job's output read at once (a Linux pipe's default capacity)."""
OUTPUT_PAUSE_S = 0.01
"""How long a pipe is left to fill after each read: the runner reads at most
``OUTPUT_CHUNK`` bytes per pause per pipe (6.25 MiB/s: 2 GiB, ``max_output_bytes``'s
default, through one pipe in five and a half minutes at the least), and a job writing
faster waits on its pipe."""


class JobProcess:
    """A started job process (use ``await JobProcess.start(...)``)."""

    def __init__(self, proc: asyncio.subprocess.Process, output: OutputPipe) -> None:
        self._proc = proc
        self._output = output

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
        try:
            output = OutputPipe(read_fd)
        except BaseException:
            os.close(read_fd)
            # The whole group: what it started meanwhile would run on unwatched.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        return cls(proc, output)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def output(self) -> AsyncIterator[bytes]:
        """Its stdout and stderr in blocks of whole lines (``line_blocks``) until every
        process holding them has closed them."""
        return line_blocks(self._output.chunks())

    def chunks(self) -> AsyncIterator[bytes]:
        """Its stdout and stderr as read (``OutputPipe.chunks``), whole lines or not, until
        every process holding them has closed them: what a job of one process writes
        without a newline (a progress bar's ``\\r`` updates) is not held back."""
        return self._output.chunks()

    def close(self) -> None:
        self._output.close()

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


class OutputPipe:
    """The runner's read end of a pipe a job writes its output to, read in chunks (``chunks``)
    at a pace that keeps the runner's cost bounded by bytes, not by how the job writes."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[None] | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """What the job writes, until every process holding the pipe has closed it (or
        ``close``), in chunks of at most ``OUTPUT_CHUNK`` bytes, one at most every
        ``OUTPUT_PAUSE_S``: a job writing small pieces (a line at a time) has them gathered
        in the pipe meanwhile, and one writing faster than that fills the pipe and blocks on
        its writes until it is read. The runner reads a pipe at most about a hundred times
        a second, whatever the job writes."""
        while self._fd >= 0:
            try:
                chunk = os.read(self._fd, OUTPUT_CHUNK)
            except BlockingIOError:
                await self._readable()
                continue
            if not chunk:
                return
            yield chunk
            await asyncio.sleep(OUTPUT_PAUSE_S)

    async def _readable(self) -> None:
        """Until the pipe can be read, or ``close``."""
        self._ready = ready = self._loop.create_future()
        self._loop.add_reader(self._fd, self._wake)
        try:
            await ready
        finally:
            self._ready = None
            if self._fd >= 0:
                self._loop.remove_reader(self._fd)

    def _wake(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def close(self) -> None:
        """Close the pipe; a reader waiting on it (``chunks``) ends."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
            self._wake()


class LineCutter:
    """Cuts bytes fed in chunks (``cut``) into blocks of whole lines: each block one or more
    lines with their newlines, none of them over ``limit`` bytes (and its newline), or a
    piece of exactly ``limit`` bytes of a longer line; what follows the last newline is held
    back (never more than ``limit`` bytes) for the next chunk, and given by ``rest`` at the
    end. The work is per chunk, not per line."""

    def __init__(self, limit: int = OUTPUT_LINE_LIMIT) -> None:
        self._limit = limit
        self._pending = b""

    def cut(self, chunk: bytes) -> list[bytes]:
        """The blocks that ``chunk`` completes, in order."""
        limit = self._limit
        pending = self._pending
        blocks: list[bytes] = []
        for at in range(0, len(chunk), limit):
            # Invariant: ``pending`` holds no newline and at most ``limit`` bytes, so every
            # line after the first newline lies within this slice, at most ``limit`` bytes.
            pending += chunk[at : at + limit]
            while len(pending) > limit and pending.find(b"\n", 0, limit + 1) < 0:
                blocks.append(pending[:limit])
                pending = pending[limit:]
            end = pending.rfind(b"\n") + 1
            if end:
                blocks.append(pending[:end])
                pending = pending[end:]
        self._pending = pending
        return blocks

    def rest(self) -> list[bytes]:
        """The bytes held back, as a last block without a newline (none when there are
        none); the cutter is then empty."""
        pending, self._pending = self._pending, b""
        return [pending] if pending else []


async def line_blocks(
    chunks: AsyncIterator[bytes], limit: int = OUTPUT_LINE_LIMIT
) -> AsyncIterator[bytes]:
    """The bytes of ``chunks``, all of them in order, cut into blocks of whole lines
    (``LineCutter``), the last bytes without a newline at the end a block of their own.
    Never more than ``limit`` bytes (and a newline) are held back waiting for the end of a
    line."""
    lines = LineCutter(limit)
    async for chunk in chunks:
        for block in lines.cut(chunk):
            yield block
    for block in lines.rest():
        yield block


class RankPipes:
    """One named pipe per local rank of a job of several processes, which that rank's stdout
    and stderr go to (``launch.rank_argv``); read with ``lines``. Open them before the job
    starts (``open``), ``release`` them once its main process has exited, ``close`` them
    once read."""

    def __init__(self) -> None:
        self._pipes: list[OutputPipe] = []
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
                pipes._pipes.append(OutputPipe(os.open(path, os.O_RDONLY | os.O_NONBLOCK)))
                pipes._write_fds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except BaseException:
            pipes.close()
            raise
        return pipes

    def lines(self, local_rank: int) -> AsyncIterator[bytes]:
        """The rank's output in blocks of whole lines (``line_blocks``) until every process
        holding its pipe has closed it, after ``release``."""
        return line_blocks(self._pipes[local_rank].chunks())

    def release(self) -> None:
        """Close the runner's own write ends: each pipe ends once the job's processes that
        hold it are gone."""
        for fd in self._write_fds:
            os.close(fd)
        self._write_fds.clear()

    def close(self) -> None:
        self.release()
        for pipe in self._pipes:
            pipe.close()
        self._pipes.clear()
