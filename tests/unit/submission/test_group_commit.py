"""``GroupCommit``'s bookkeeping with fake writes (no database): whatever is cancelled or
fails, and wherever, every waiter gets an answer and every write slot comes back.

Each fake write waits on a gate of its own until the test opens it, so which submissions
form a batch never depends on timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from trainyard_platform.services.submission import group_commit
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.group_commit import GroupCommit

pytestmark = pytest.mark.timeout(20)  # a waiter left without an answer hangs: fail, not hang


class _Pool:
    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        yield object()


class _Writes:
    """The fake statements: each write of ``name`` (alone: the submission's name; a batch:
    the names joined by '+') waits until ``open(name)``, then answers (held, not stored) or
    raises what ``fail`` holds for it."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.fail: dict[str, BaseException] = {}

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def open(self, name: str) -> None:
        self.gate(name).set()

    async def _write(self, name: str) -> None:
        self.started.append(name)
        await self.gate(name).wait()
        if name in self.fail:
            raise self.fail[name]

    async def alone(self, conn: Any, caller: Any, screening: Any, job: Any, event: Any) -> Any:
        await self._write(job[0])
        return True, False

    async def batch(self, conn: Any, submissions: Sequence[repo.Submission]) -> Any:
        await self._write("+".join(s[2][0] for s in submissions))
        return [(True, False)] * len(submissions)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> _Writes:
    fake = _Writes()
    monkeypatch.setattr(repo, "insert_job_if_caller", fake.alone)
    monkeypatch.setattr(repo, "insert_jobs_if_callers", fake.batch)
    return fake


def _submission(name: str) -> repo.Submission:
    job = (name, "n", {}, None, datetime.now(UTC), None)
    return ("h", 1, 1, 1, "member"), ("2026-12", [], [], "[]"), job, (name, "s", b"{}", {})


async def _until(check: Any) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0)


def _write(writer: GroupCommit, name: str) -> asyncio.Task[tuple[bool, bool]]:
    return asyncio.create_task(writer.write(_submission(name)))


async def _behind_a_write(
    writer: GroupCommit, writes: _Writes, names: str
) -> tuple[asyncio.Task[tuple[bool, bool]], list[asyncio.Task[tuple[bool, bool]]]]:
    """A write of "a" held under way, and one submission per letter of ``names`` queued
    behind it, in that order."""
    first = _write(writer, "a")
    await _until(lambda: writes.started == ["a"])
    queued = [_write(writer, name) for name in names]
    await _until(lambda: writer.queued == len(names))
    return first, queued


async def _batch_under_way(
    writer: GroupCommit, writes: _Writes, names: str
) -> tuple[asyncio.Task[tuple[bool, bool]], list[asyncio.Task[tuple[bool, bool]]]]:
    """``_behind_a_write``, then "a" written: the batch of ``names``, its statement held."""
    first, queued = await _behind_a_write(writer, writes, names)
    writes.open("a")
    await _until(lambda: "+".join(names) in writes.started)
    return first, queued


async def _idle(writer: GroupCommit, writes: _Writes) -> None:
    """No slot held, nothing queued, no batch task left: the next write goes alone, at once."""
    assert (writer._in_flight, writer.queued, len(writer._tasks)) == (0, 0, 0)
    last = _write(writer, "after")
    await _until(lambda: "after" in writes.started)
    writes.open("after")
    assert await last == (True, False)


async def test_cancelled_after_its_turn_came_but_before_it_wrote_gives_its_slot_back(
    writes: _Writes, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = GroupCommit(_Pool())  # type: ignore[arg-type]
    first, [second] = await _behind_a_write(writer, writes, "b")
    release = writer._release

    def release_then_cancel() -> None:
        release()  # the queue's only submission is told to write alone, in this slot
        if not second.done():
            second.cancel()  # before its request could run again

    monkeypatch.setattr(writer, "_release", release_then_cancel)
    writes.open("a")
    assert await first == (True, False)
    with pytest.raises(asyncio.CancelledError):
        await second
    monkeypatch.setattr(writer, "_release", release)
    assert "b" not in writes.started
    await _idle(writer, writes)


async def test_a_batch_task_cancelled_cancels_its_waiters_and_gives_its_slot_back(
    writes: _Writes,
) -> None:
    writer = GroupCommit(_Pool())  # type: ignore[arg-type]
    first, queued = await _batch_under_way(writer, writes, "bc")
    [batch] = writer._tasks
    batch.cancel()  # as at a loop's end
    for waiter in queued:
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert await first == (True, False)
    await _idle(writer, writes)


async def test_a_failed_batch_answers_each_row_on_its_own_even_when_one_fails_again(
    writes: _Writes,
) -> None:
    writer = GroupCommit(_Pool())  # type: ignore[arg-type]
    writes.fail["b+c+d"] = RuntimeError("the batch")
    writes.fail["c"] = ValueError("c alone")
    first, queued = await _behind_a_write(writer, writes, "bcd")
    for name in ("a", "b+c+d", "b", "c", "d"):
        writes.open(name)
    assert await first == (True, False)
    assert await queued[0] == (True, False)
    with pytest.raises(ValueError, match="c alone"):
        await queued[1]
    assert await queued[2] == (True, False)
    assert writes.started == ["a", "b+c+d", "b", "c", "d"]  # again alone, in arrival order
    await _idle(writer, writes)


async def test_a_row_failing_alone_for_an_outage_ends_the_rewrites_of_its_batch(
    writes: _Writes,
) -> None:
    """A PostgreSQL that does not answer fails the batch, then each row written alone, one
    after the other, each after its own timeouts: the last request of a full batch (64)
    waited 64 times as long. Once a row alone fails for an outage, the rest answer it."""
    writer = GroupCommit(_Pool())  # type: ignore[arg-type]
    writes.fail["b+c+d"] = TimeoutError()
    writes.fail["b"] = ConnectionRefusedError(111, "the database is away")
    first, queued = await _behind_a_write(writer, writes, "bcd")
    for name in ("a", "b+c+d", "b"):
        writes.open(name)
    assert await first == (True, False)
    for waiter in queued:
        with pytest.raises(ConnectionRefusedError):
            await waiter
    assert writes.started == ["a", "b+c+d", "b"]  # c and d were not written
    await _idle(writer, writes)


async def test_a_request_cancelled_while_its_batch_is_written_loses_only_its_answer(
    writes: _Writes,
) -> None:
    writer = GroupCommit(_Pool())  # type: ignore[arg-type]
    first, queued = await _batch_under_way(writer, writes, "bc")
    queued[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued[0]
    writes.open("b+c")
    assert await queued[1] == (True, False)
    assert await first == (True, False)
    assert (writer.batches, writer.batched_rows) == (1, 2)
    await _idle(writer, writes)


async def test_a_full_queue_is_a_second_write_and_no_more(writes: _Writes) -> None:
    writer = GroupCommit(_Pool(), max_rows=2, in_flight=2)  # type: ignore[arg-type]
    first = _write(writer, "a")
    await _until(lambda: writes.started == ["a"])
    full = [_write(writer, name) for name in "bc"]
    await _until(lambda: "b+c" in writes.started)  # a second write under way
    more = [_write(writer, name) for name in "de"]
    await _until(lambda: writer.queued == 2)  # full, but two are under way: it waits
    assert writer._in_flight == 2
    writes.open("b+c")
    await _until(lambda: "d+e" in writes.started)
    writes.open("d+e")
    writes.open("a")
    assert [await t for t in (first, *full, *more)] == [(True, False)] * 5
    await _idle(writer, writes)


def test_the_module_defaults_are_a_valid_writer() -> None:
    assert group_commit.MAX_ROWS >= 2 and group_commit.IN_FLIGHT >= 1
    with pytest.raises(ValueError, match="max_rows >= 2"):
        GroupCommit(_Pool(), max_rows=1)  # type: ignore[arg-type]
