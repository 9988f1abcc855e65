"""The output of a job of several processes: each rank's lines whole and attributed to it.

The processes are real (a stand-in for torchrun that starts its workers as torchrun does,
with ``LOCAL_RANK`` and ``RANK``, inheriting its stdout), and so are the pipes."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.logstream import rank_lines
from trainyard_platform.services.runner.process import (
    OUTPUT_LINE_LIMIT,
    JobProcess,
    RankPipes,
    line_blocks,
)
from trainyard_platform.services.runner.sandbox import JobUser
from trainyard_platform.shared.events.payloads import AllocationGranted, GangMember, JobSpec

FAKE_TORCHRUN = """\
import os, subprocess, sys

args = sys.argv[1:]
flags = {}
while args[0].startswith("--"):
    name, _, value = args.pop(0).partition("=")
    flags[name] = value
assert "--no-python" in flags, flags
procs, node = int(flags["--nproc_per_node"]), int(flags.get("--node_rank") or 0)
print("launcher: starting", procs, "workers", flush=True)
workers = [
    subprocess.Popen(
        args, env={**os.environ, "LOCAL_RANK": str(i), "RANK": str(node * procs + i)}
    )
    for i in range(procs)
]
sys.exit(max(w.wait() for w in workers))
"""

# Each worker writes its line in two pieces, the ranks taking turns (turn files in argv[1]):
# on one shared pipe the pieces come out as "rank=2 says rank=3 says hello\nhello\n".
WORKER = f"""\
import os, sys, time

local, rank, turns = int(os.environ["LOCAL_RANK"]), os.environ["RANK"], sys.argv[1]
for piece, part in enumerate([f"rank={{rank}} says ".encode(), b"hello\\n"]):
    turn = 2 * piece + local
    while not os.path.exists(os.path.join(turns, str(turn))):
        time.sleep(0.01)
    os.write(1, part)
    open(os.path.join(turns, str(turn + 1)), "w").close()
if local == 0:
    os.write(2, b"to stderr\\n")
else:  # a line longer than the limit, never ended: cut at the limit, the rest at the end
    os.write(1, b"x" * ({OUTPUT_LINE_LIMIT} + 10))
"""


def gang_grant(command: list[str]) -> AllocationGranted:
    """The second node of a gang of two, two processes each: ranks 2 and 3 here."""
    gang = [
        GangMember(node_id=n, allocation_id=a, address="127.0.0.1", gpus=2, first_rank=2 * i)
        for i, (n, a) in enumerate([("a", "alloc-0"), ("b", "alloc-1")])
    ]
    return AllocationGranted(
        allocation_id="alloc-1",
        job_id="job-1",
        node_id="b",
        gpu_indices=[0, 1],
        epoch=1,
        attempt=1,
        granted_at=datetime(2025, 1, 1, tzinfo=UTC),
        spec=JobSpec(
            name="ranks",
            team="vision",
            user="alice",
            command=command,
            gpus=2,
            gpu_flavor="h200",
            seed=7,
            max_runtime_seconds=60,
        ),
        gang=gang,
    )


async def run_job(tmp_path: Path, grant: AllocationGranted) -> list[bytes]:
    """Run ``grant``'s job under the stand-in torchrun as the runner does: its argv, its
    rank pipes, each block of output as its log gets it (``rank_lines``), in order read."""
    fake = tmp_path / "fake"
    (fake / "torch" / "distributed").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "run.py").write_text(FAKE_TORCHRUN)
    folder = tmp_path / "output"
    argv = launch.job_argv(sys.executable, grant, 29500, folder)
    ranks = launch.ranks(grant)
    records: list[bytes] = []

    async def copy(lines: AsyncIterator[bytes], rank: int | None) -> None:
        async for block in lines:
            records.append(rank_lines(block, rank))

    pipes = await RankPipes.open(folder, len(ranks), JobUser(None, None))
    try:
        job = await JobProcess.start(
            argv, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake)}
        )
        readers = asyncio.gather(
            copy(job.output(), None),
            *(copy(pipes.lines(local), rank) for local, rank in enumerate(ranks)),
        )
        # A bound for a hang only: the workers take turns, nothing here is timed.
        assert await asyncio.wait_for(job.wait(), 60) == 0
        pipes.release()
        await asyncio.wait_for(readers, 60)
        job.close()
    finally:
        pipes.close()
    return records


async def test_ranks_whose_partial_writes_interleave_log_whole_lines_each_with_its_rank(
    tmp_path: Path,
) -> None:
    # Before: every rank wrote to the job's one output pipe, so rank 2's "rank=2 says " and
    # rank 3's "rank=3 says " came out spliced in one line, and no line said its rank.
    turns = tmp_path / "turns"
    turns.mkdir()
    (turns / "0").touch()
    records = await run_job(tmp_path, gang_grant([sys.executable, "-c", WORKER, str(turns)]))

    assert all(r.endswith(b"\n") for r in records), records  # each block whole lines
    lines = [line + b"\n" for r in records for line in r[:-1].split(b"\n")]
    of = {rank: [r for r in lines if r.startswith(b"[rank %d] " % rank)] for rank in (2, 3)}
    assert of[2] == [b"[rank 2] rank=2 says hello\n", b"[rank 2] to stderr\n"]
    assert of[3] == [
        b"[rank 3] rank=3 says hello\n",
        b"[rank 3] " + b"x" * OUTPUT_LINE_LIMIT + b"\n",
        b"[rank 3] " + b"x" * 10 + b"\n",
    ]
    # The launcher's own lines (torchrun's) stay as they are.
    assert [r for r in lines if not r.startswith(b"[rank ")] == [b"launcher: starting 2 workers\n"]


def test_a_line_is_cut_only_past_the_limit_and_never_leaves_an_empty_piece() -> None:
    async def one_byte_at_a_time(data: bytes) -> AsyncIterator[bytes]:
        for at in range(len(data)):
            yield data[at : at + 1]

    async def pieces(data: bytes, limit: int = 4) -> list[bytes]:
        """Each line of each block, and each block that is a piece of a longer line."""
        return [
            piece
            async for block in line_blocks(one_byte_at_a_time(data), limit)
            for piece in block.splitlines(keepends=True)
        ]

    assert asyncio.run(pieces(b"ab\ncd\n\nef")) == [b"ab\n", b"cd\n", b"\n", b"ef"]
    assert asyncio.run(pieces(b"abcd\n")) == [b"abcd\n"]  # at the limit: whole
    assert asyncio.run(pieces(b"abcde\nf\n")) == [b"abcd", b"e\n", b"f\n"]
    assert asyncio.run(pieces(b"abcdefghij")) == [b"abcd", b"efgh", b"ij"]
    assert asyncio.run(pieces(b"")) == []


def test_a_piece_of_a_rank_ends_its_line_and_the_launchers_has_no_prefix() -> None:
    assert rank_lines(b"loss 0.1\n", 1) == b"[rank 1] loss 0.1\n"
    assert rank_lines(b"no newline", 0) == b"[rank 0] no newline\n"
    assert rank_lines(b"torchrun says\n", None) == b"torchrun says\n"
    assert rank_lines(b"cut", None) == b"cut\n"
    # A block of lines: every line its prefix, empty ones too.
    assert rank_lines(b"a\n\nb\n", 12) == b"[rank 12] a\n[rank 12] \n[rank 12] b\n"
    assert rank_lines(b"a\n\nb\n", None) == b"a\n\nb\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")
async def test_only_the_jobs_user_can_write_into_its_ranks_pipes() -> None:
    # Other users pass through, as they do a sandbox's root (pytest's tmp_path is root's).
    root = Path(tempfile.mkdtemp(prefix="trainyard-test-"))
    os.chmod(root, 0o711)
    folder = root / "output"
    job, other = 291_300, 291_301
    pipes = await RankPipes.open(folder, 2, JobUser(job, job))
    try:
        info = os.stat(folder)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711)
        for local in ("0", "1"):
            info = os.stat(folder / local)
            assert stat.S_ISFIFO(info.st_mode)
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (job, 0o600)

        def write_as(uid: int) -> int:
            return subprocess.run(
                ["/bin/sh", "-c", 'exec 3>"$1"', "sh", str(folder / "0")],
                user=uid,
                group=uid,
                extra_groups=[],
                env={},
                cwd="/",
                capture_output=True,
                timeout=60,
                check=False,
            ).returncode

        assert await asyncio.to_thread(write_as, job) == 0
        assert await asyncio.to_thread(write_as, other) != 0
    finally:
        pipes.close()
        shutil.rmtree(root)
