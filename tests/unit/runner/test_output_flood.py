"""A job flooding its output with tiny lines costs the runner per chunk of bytes, not per
line: the runner's event loop also sends the node's heartbeats and watches the other jobs.

The job's processes and pipes are real; the work the runner does is counted in the writes
to the job's log (one per block of output handled), never timed."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from trainyard_platform.services.runner.domain import JobIdentity
from trainyard_platform.services.runner.logstream import CappedFile, rank_lines
from trainyard_platform.services.runner.process import (
    OUTPUT_LINE_LIMIT,
    JobProcess,
    OutputPipe,
    RankPipes,
    line_blocks,
)
from trainyard_platform.services.runner.sandbox import JobUser
from trainyard_platform.services.runner.supervisor import JobRun

FLOOD = 1024 * 1024
"""Bytes of output, each a line of its own: a million lines."""
MOST_BLOCKS = 1000
"""Far above what a megabyte takes in chunks (16 full ones), far below a million lines."""
NOTICE = b"\n[over the cap]\n"


class CountedFile(CappedFile):
    def __init__(self, path: Path, limit: int) -> None:
        super().__init__(path, limit, NOTICE)
        self.writes = 0

    def write(self, data: bytes) -> bool:
        self.writes += 1
        return super().write(data)


def job_run(tmp_path: Path, ranks: tuple[int, ...], limit: int = 2**40) -> JobRun:
    run = JobRun(
        JobIdentity("job-1", "alloc-1", "node-1", 1, 1),
        events=None,  # type: ignore[arg-type]
        ledger=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        checkpoint_store=None,  # type: ignore[arg-type]
        sandbox=None,  # type: ignore[arg-type]
        log_path=tmp_path / "alloc-1.log",
        trace_headers={},
        progress_interval_s=60.0,
        log_tail_lines=3,
    )
    run._log_file = CountedFile(tmp_path / "alloc-1.log", limit)
    run._ranks = ranks
    return run


def flooder(paths: list[str]) -> list[str]:
    """A job writing ``FLOOD`` newlines then ``the end`` to each of ``paths`` (its stdout
    when none), in writes as large as the pipe takes."""
    code = (
        "import os, sys\n"
        "fds = [os.open(p, os.O_WRONLY) for p in sys.argv[1:]] or [1]\n"
        f"for fd in fds: os.write(fd, b'\\n' * {FLOOD} + b'the end\\n')\n"
    )
    return [sys.executable, "-c", code, *paths]


async def test_a_job_of_one_process_flooding_tiny_lines_is_copied_per_chunk(
    tmp_path: Path,
) -> None:
    # Before: a line at a time, a million writes to the log (and awaits, and tail lines).
    run = job_run(tmp_path, ())
    job = await JobProcess.start(flooder([]), cwd=tmp_path, env={})
    await asyncio.wait_for(run._read_output(run._output_of(job)), 60)  # a bound for a hang
    assert await job.wait() == 0
    job.close()
    log_file = run._log_file
    assert isinstance(log_file, CountedFile)
    log_file.close()

    assert (tmp_path / "alloc-1.log").read_bytes() == b"\n" * FLOOD + b"the end\n"
    assert log_file.writes <= MOST_BLOCKS
    assert run._tail.text() == "\n\nthe end"


async def test_ranks_flooding_tiny_lines_are_prefixed_line_by_line_per_chunk(
    tmp_path: Path,
) -> None:
    run = job_run(tmp_path, (4, 5))
    pipes = await RankPipes.open(tmp_path / "output", 2, JobUser(None, None))
    try:
        paths = [str(tmp_path / "output" / str(local)) for local in (0, 1)]
        job = await JobProcess.start(flooder(paths), cwd=tmp_path, env={})
        readers = asyncio.gather(
            run._read_output(job.output(), None),
            *(run._read_output(pipes.lines(local), rank) for local, rank in ((0, 4), (1, 5))),
        )
        assert await asyncio.wait_for(job.wait(), 60) == 0
        pipes.release()
        await asyncio.wait_for(readers, 60)
        job.close()
    finally:
        pipes.close()
    log_file = run._log_file
    assert isinstance(log_file, CountedFile)
    log_file.close()

    lines = (tmp_path / "alloc-1.log").read_bytes().split(b"\n")
    assert lines.pop() == b""
    for rank in (4, 5):
        of_rank = [line for line in lines if line.startswith(b"[rank %d] " % rank)]
        assert of_rank == [b"[rank %d] " % rank] * FLOOD + [b"[rank %d] the end" % rank]
    assert len(lines) == 2 * (FLOOD + 1)  # no other line, none cut
    assert log_file.writes <= 2 * MOST_BLOCKS


async def test_past_the_cap_a_flood_is_only_counted_per_chunk_and_the_tail_kept(
    tmp_path: Path,
) -> None:
    limit = 4096
    run = job_run(tmp_path, (3,), limit)
    pipes = await RankPipes.open(tmp_path / "output", 1, JobUser(None, None))
    try:
        job = await JobProcess.start(
            flooder([str(tmp_path / "output" / "0")]), cwd=tmp_path, env={}
        )
        readers = asyncio.gather(
            run._read_output(job.output(), None), run._read_output(pipes.lines(0), 3)
        )
        assert await asyncio.wait_for(job.wait(), 60) == 0
        pipes.release()
        await asyncio.wait_for(readers, 60)
        job.close()
    finally:
        pipes.close()
    log_file = run._log_file
    assert isinstance(log_file, CountedFile)
    log_file.close()

    kept = (tmp_path / "alloc-1.log").read_bytes()
    assert kept.endswith(NOTICE) and len(kept) <= limit + len(NOTICE)
    assert kept.removesuffix(NOTICE) == b"[rank 3] \n" * (len(kept.removesuffix(NOTICE)) // 10)
    assert log_file.full
    assert log_file.writes <= MOST_BLOCKS
    # The tail (for ``job.failed``) still ends with the job's last words.
    assert run._tail.text() == "[rank 3] \n[rank 3] \n[rank 3] the end"


async def chunks_of(data: bytes, size: int) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


async def blocks_of(data: bytes, size: int, limit: int = OUTPUT_LINE_LIMIT) -> list[bytes]:
    return [block async for block in line_blocks(chunks_of(data, size), limit)]


async def test_lines_come_in_one_block_per_chunk_and_a_line_without_end_in_pieces() -> None:
    # Before: one piece per line, a million of them.
    blocks = await blocks_of(b"\n" * FLOOD, OUTPUT_LINE_LIMIT)
    assert len(blocks) == FLOOD // OUTPUT_LINE_LIMIT
    assert b"".join(blocks) == b"\n" * FLOOD
    # A megabyte with no newline is never held back whole: it comes in pieces of the limit.
    blocks = await blocks_of(b"x" * FLOOD + b"\n", OUTPUT_LINE_LIMIT)
    count = FLOOD // OUTPUT_LINE_LIMIT
    assert [len(b) for b in blocks] == [OUTPUT_LINE_LIMIT] * (count - 1) + [OUTPUT_LINE_LIMIT + 1]
    # However the chunks come, larger than the limit too: no line in a block is longer.
    blocks = await blocks_of(b"ab\ncd\n\nefghij", 100, 4)
    assert b"".join(blocks) == b"ab\ncd\n\nefghij"
    assert [b.split(b"\n") for b in blocks] == [[b"ab", b""], [b"cd", b"", b""], [b"efgh"], [b"ij"]]


async def test_the_tail_keeps_each_empty_line_as_when_read_a_line_at_a_time(
    tmp_path: Path,
) -> None:
    # Its last three lines are "", "end", "": each block ends with an empty line.
    for ranks, rank, expected in (
        ((), None, ["", "end", ""]),
        ((2,), None, ["", "end", ""]),
        ((2,), 2, ["[rank 2] ", "[rank 2] end", "[rank 2] "]),
    ):
        run = job_run(tmp_path, ranks)
        for block in (b"boom\n\n", b"end\n\n"):
            await run._read_output(chunks_of(block, 100), rank)
        assert run._log_file is not None
        run._log_file.close()
        assert run._tail.text() == "\n".join(expected)


async def test_the_block_that_passes_the_cap_keeps_its_whole_lines_that_fit(
    tmp_path: Path,
) -> None:
    # Read a line at a time, every line up to the cap was kept: so is it from a block.
    block = b"a\nbbb\n" + b"c" * 30 + b"\nd"
    for ranks, rank, kept in (((), None, b"a\nbbb\n"), ((3,), 3, b"[rank 3] a\n")):
        run = job_run(tmp_path, ranks, limit=20)
        await run._read_output(chunks_of(block, 100), rank)
        log_file = run._log_file
        assert log_file is not None
        log_file.close()
        log_path = tmp_path / "alloc-1.log"
        assert log_path.read_bytes() == kept + NOTICE
        log_path.unlink()
        # What was not kept is counted, byte for byte as the log would have held it.
        as_logged = rank_lines(block, rank) if ranks else block
        assert log_file.dropped == len(as_logged) - len(kept)


async def test_closing_a_pipe_ends_its_reader_waiting_for_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A writer holds the pipe open and writes nothing: the reader waits for it to be
    # readable, and ``close`` must end its chunks, not leave it waiting for ever.
    loop = asyncio.get_running_loop()
    waiting = asyncio.Event()
    add_reader = loop.add_reader

    def watched(fd: int, callback: Callable[..., object], *args: object) -> None:
        add_reader(fd, callback, *args)
        waiting.set()

    monkeypatch.setattr(loop, "add_reader", watched)
    read_fd, write_fd = os.pipe()
    try:
        pipe = OutputPipe(read_fd)

        async def read_all() -> list[bytes]:
            return [chunk async for chunk in pipe.chunks()]

        reader = asyncio.create_task(read_all())
        await waiting.wait()
        pipe.close()
        assert await asyncio.wait_for(reader, 30) == []  # a bound for a hang only
    finally:
        os.close(write_fd)


PROGRESS = """
import sys
sys.stdout.buffer.write(b"50%\\r")
sys.stdout.flush()
open(sys.argv[1], "rb").read(1)  # waits for the test to let it go on
sys.stdout.buffer.write(b"100%\\n")
"""


async def test_a_progress_update_of_one_process_is_in_its_log_before_its_line_ends(
    tmp_path: Path,
) -> None:
    # Before: held back until a newline or 64 KiB came, so `trainyard logs -f` of a job
    # drawing a progress bar (`\r` updates, no newline) looked stalled for minutes.
    run = job_run(tmp_path, ())
    go_on = tmp_path / "go-on"
    os.mkfifo(go_on)
    log_path = tmp_path / "alloc-1.log"
    job = await JobProcess.start([sys.executable, "-c", PROGRESS, str(go_on)], cwd=tmp_path, env={})
    try:
        reader = asyncio.create_task(run._read_output(run._output_of(job)))

        async def logged(expected: bytes) -> None:
            while log_path.read_bytes() != expected:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(logged(b"50%\r"), 30)  # a bound for a hang only
        await asyncio.to_thread(go_on.write_bytes, b".")  # what the job waits for to go on
        assert await asyncio.wait_for(job.wait(), 30) == 0
        await asyncio.wait_for(reader, 30)
    finally:
        job.kill_group()
        job.close()
    assert log_path.read_bytes() == b"50%\r100%\n"
    assert run._tail.text() == "50%\r100%"


async def test_the_tail_of_one_process_joins_a_line_written_across_chunks(
    tmp_path: Path,
) -> None:
    # Its bytes go to the log as they come; its tail has the lines they make.
    run = job_run(tmp_path, ())

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"ep", b"och 1\nlo", b"ss 0.4\n10%\r", b"20%\r", b"\nlast wo", b"rds"):
            yield chunk

    await run._read_output(chunks())
    assert run._log_file is not None
    run._log_file.close()
    assert (tmp_path / "alloc-1.log").read_bytes() == (b"epoch 1\nloss 0.4\n10%\r20%\r\nlast words")
    assert run._tail.text() == "loss 0.4\n10%\r20%\nlast words"


async def test_the_log_of_one_process_past_the_cap_is_what_it_wrote_up_to_there(
    tmp_path: Path,
) -> None:
    # Written as read, the log may hold a line an earlier chunk began (a progress update):
    # the chunk that passes the cap keeps only its whole lines that fit (none here), the
    # notice starts a line of its own, and the tail still has the job's last words.
    run = job_run(tmp_path, (), limit=10)

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"50%\r", b"60%\r70%\r80%\r\n", b"done\n"):
            yield chunk

    await run._read_output(chunks())
    log_file = run._log_file
    assert log_file is not None
    log_file.close()
    assert (tmp_path / "alloc-1.log").read_bytes() == b"50%\r" + NOTICE
    assert log_file.dropped == len(b"60%\r70%\r80%\r\ndone\n")
    assert run._tail.text() == "50%\r60%\r70%\r80%\ndone"


def test_a_line_of_the_platforms_starts_a_line_of_its_own_after_a_progress_update(
    tmp_path: Path,
) -> None:
    # A job of one process has its output written as read, so its log may end inside a
    # line (``50%\r``): the platform's notice must not run on into the job's bar, nor add
    # an empty line after a line that ended.
    log = CappedFile(tmp_path / "out.log", 1 << 20)
    log.write(b"epoch 1\n50%\r")
    log.say(b"[trainyard: 3 metric reports dropped]\n")
    log.write(b"100%\n")
    log.say(b"[trainyard: checkpoint of step 2 not uploaded]\n")
    log.close()
    assert (tmp_path / "out.log").read_bytes() == (
        b"epoch 1\n50%\r\n[trainyard: 3 metric reports dropped]\n100%\n"
        b"[trainyard: checkpoint of step 2 not uploaded]\n"
    )
