"""A job's output (and its metric series), shipped to the object store in chunks while it
runs.

The supervisor appends the job's raw output to a local file; ``LogShipper`` uploads what is
new about every ``interval_s`` as ``logs/<job>/<stream>/chunk-<seq:08d>.log`` (at most
``MAX_CHUNK_BYTES`` each), and when the stream is closed the rest and an empty ``end``
object. ``<stream>`` is ``a<attempt:04d>-<node_id>``, so the keys of a job sort by attempt,
then node, then order of writing, and the submission service serves them after a cursor.

The same shipper carries every metric report of the job, not only the ones ``job.progress``
lets through: one JSON line per report (``{"step", "time", "metrics"}``, NaN and infinities
kept as JSON's ``NaN``/``Infinity``) under ``metrics/<job>/<stream>/chunk-<seq:08d>.jsonl``.

The job's output never goes into the runner's own log: a job must not be able to forge the
platform's log lines. The output of a job of one process is kept byte for byte; that of a
job of several processes (under torchrun) line by line, each line prefixed with the rank
that wrote it (``rank_lines``). The first is written as it is read, whole lines or not (a
progress bar's ``\\r`` updates show at once), the second in blocks of whole lines
(``process.line_blocks``); never a line at a time: the runner's cost is bounded by bytes.

Both local files are written through ``CappedFile``: a job that writes without end (``yes``
in a loop) would otherwise fill the node's disk and the store; past the runner's
``max_output_bytes`` an attempt's output ends with a notice and the rest is dropped. Once
a stream is wholly in the store (``LogShipper.close`` says so), the supervisor removes its
local file (``remove_shipped``): kept, every attempt's output would stay on the node's
disk, and a tenant's stream of loud jobs would fill it, failing every later job there as
the node's own fault. A file the store could not take stays, as its only copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from trainyard_platform.shared.storage import ObjectStore

log = logging.getLogger(__name__)

MAX_CHUNK_BYTES = 1024 * 1024


class CappedFile:
    """Appends to ``path`` at most ``limit`` bytes in all (what it held before counts).
    The first write that would pass the limit keeps the whole lines of it that fit (a write
    is a chunk of output, many lines: ``process.line_blocks`` for a rank's, as read for a
    job of one process, whose log may then end with a line an earlier write began), then
    writes ``notice`` (it may pass the limit by its own size); the rest of it and every
    later write are dropped, counted in ``dropped``. Each write is flushed, so a reader (``tail -f``, the shipper) sees it at
    once."""

    def __init__(self, path: Path, limit: int, notice: bytes = b"") -> None:
        self._file = path.open("ab")
        self._written = self._file.tell()
        self._limit = limit
        self._notice = notice
        self.dropped = 0
        # Whether what was written last ends inside a line (a progress bar's ``\r`` update
        # of a job of one process): a line of the platform's then starts a line of its own.
        self._within_line = False

    @property
    def closed(self) -> bool:
        return self._file.closed

    @property
    def full(self) -> bool:
        return self.dropped > 0

    def write(self, data: bytes) -> bool:
        """Append ``data``; False when it was dropped, wholly or in part."""
        if self.dropped or self._written + len(data) > self._limit:
            if not self.dropped:
                room = self._limit - self._written
                fits = data.rfind(b"\n", 0, room) + 1 if room > 0 else 0
                self._file.write(data[:fits] + self._notice)
                self._file.flush()
                self._written += fits
                self._within_line = not (data[:fits] + self._notice).endswith(b"\n")
                data = data[fits:]
            self.dropped += len(data)
            return False
        self._file.write(data)
        self._file.flush()
        self._written += len(data)
        if data:
            self._within_line = not data.endswith(b"\n")
        return True

    def say(self, line: bytes) -> bool:
        """Append ``line``, one of the platform's own (``[trainyard: ...]\n``), on a line of
        its own: after a newline when the output written so far ends inside a line."""
        return self.write(b"\n" + line if self._within_line else line)

    def close(self) -> None:
        self._file.close()


def rank_lines(block: bytes, rank: int | None) -> bytes:
    """A block of output of a job of several processes (whole lines, or a piece of a long
    one: ``process.line_blocks``) as its log holds it: each line prefixed with ``[rank N] ``
    for the process of global rank ``N`` (nothing for ``rank`` None: torchrun's own lines),
    and the block ending with a newline, so that whatever any process writes next starts a
    line of its own. One pass over the block, whatever its number of lines."""
    if not block.endswith(b"\n"):
        block += b"\n"
    if rank is None:
        return block
    prefix = b"[rank %d] " % rank
    return prefix + block[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


def last_lines(block: bytes, count: int) -> list[bytes]:
    """The last ``count`` lines of ``block`` (without their newlines; a block ending with a
    newline has no empty line after it), split off from the end only."""
    if block.endswith(b"\n"):
        block = block[:-1]
    return block.rsplit(b"\n", count)[-count:]


def stream_prefix(job_id: str, attempt: int, node_id: str, kind: str = "logs") -> str:
    return f"{kind}/{job_id}/a{attempt:04d}-{node_id}"


class LogShipper:
    """Uploads new bytes of ``path`` to ``store`` under ``prefix`` (see module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        path: Path,
        interval_s: float = 1.0,
        suffix: str = ".log",
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._path = path
        self._interval_s = interval_s
        self._suffix = suffix
        self._offset = 0
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"log shipper {self._prefix}")

    async def close(self) -> bool:
        """Ship the rest and the ``end`` marker; failures are logged, never raised (the
        outcome of the job must go out whatever happens to its log). True when the whole
        file is in the store: the local copy is then no longer needed."""
        self._closed.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        try:
            await asyncio.to_thread(self._ship)
            await asyncio.to_thread(self._store.put_bytes, f"{self._prefix}/end", b"")
        except Exception as exc:
            log.warning("could not ship the end of log %s: %s", self._prefix, exc)
            return False
        return True

    async def _run(self) -> None:
        while not self._closed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), timeout=self._interval_s)
            if self._closed.is_set():
                return
            try:
                await asyncio.to_thread(self._ship)
            except Exception as exc:  # the store may be down for a while: try again later
                log.warning("could not ship log chunk of %s: %s", self._prefix, exc)

    def _ship(self) -> None:
        """Upload every complete chunk's worth of new bytes (one thread at a time)."""
        try:
            size = self._path.stat().st_size
        except FileNotFoundError:
            return
        while self._offset < size:
            with self._path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(min(MAX_CHUNK_BYTES, size - self._offset))
            if not data:
                return
            self._seq += 1
            self._store.put_bytes(f"{self._prefix}/chunk-{self._seq:08d}{self._suffix}", data)
            self._offset += len(data)


def remove_shipped(paths: list[Path]) -> None:
    """Remove these local files, all shipped, and then their folder if it is left empty;
    what cannot be removed is logged and left. Blocking: call through a thread."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s, shipped already: %s", path, exc)
    for folder in {path.parent for path in paths}:
        with contextlib.suppress(OSError):  # not empty: another attempt's files are there
            folder.rmdir()
