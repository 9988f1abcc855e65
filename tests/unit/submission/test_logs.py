"""Log paging: key order, per-stream cursors, no gaps, completion."""

from __future__ import annotations

import base64

import pytest

from trainyard_platform.services.submission.commands import LOGS
from trainyard_platform.services.submission.logs import (
    ChunkRef,
    Cursor,
    LogIndex,
    chunk_key,
    page,
)
from trainyard_platform.shared.http_errors import RequestInvalid


def _index(*keys: str) -> LogIndex:
    return LogIndex.from_keys(keys)


def _read_all(index: LogIndex, cursor: Cursor, limit: int = 100) -> tuple[list[str], Cursor]:
    chunks = list(page(index, cursor, limit))
    return [c.key for c in chunks], cursor.advance(chunks)


def test_keys_are_parsed_and_other_objects_ignored() -> None:
    index = _index(
        "a0001-node-1/chunk-00000001.log",
        "a0001-node-1/chunk-00000000.log",
        "a0001-node-1/end",
        "a0002-node-1/chunk-00000000.log",
        "a0001-node-1/notes.txt",
        "stray.log",
        "bad-stream/chunk-00000000.log",
        "a0001-node-1/chunk-1.log",
    )
    assert sorted(index.streams) == ["a0001-node-1", "a0002-node-1"]
    keys, _ = _read_all(index, Cursor())
    assert keys == [
        "a0001-node-1/chunk-00000000.log",
        "a0001-node-1/chunk-00000001.log",
        "a0002-node-1/chunk-00000000.log",
    ]


def test_pages_follow_key_order_and_the_limit() -> None:
    index = _index(*(chunk_key("a0001-n", i) for i in range(5)))
    first, cursor = _read_all(index, Cursor(), limit=2)
    assert first == ["a0001-n/chunk-00000000.log", "a0001-n/chunk-00000001.log"]
    second, cursor = _read_all(index, cursor, limit=2)
    assert second == ["a0001-n/chunk-00000002.log", "a0001-n/chunk-00000003.log"]
    third, cursor = _read_all(index, cursor, limit=2)
    assert third == ["a0001-n/chunk-00000004.log"]
    assert _read_all(index, cursor)[0] == []


def test_a_stream_that_sorts_earlier_is_not_lost_behind_a_later_one() -> None:
    # node-2's chunk 0 was returned; node-1 then uploads chunk 1, which sorts before it.
    cursor = Cursor({"a0001-node-1": 0, "a0001-node-2": 0})
    index = _index(
        "a0001-node-1/chunk-00000000.log",
        "a0001-node-1/chunk-00000001.log",
        "a0001-node-2/chunk-00000000.log",
    )
    assert _read_all(index, cursor)[0] == ["a0001-node-1/chunk-00000001.log"]


def test_a_gap_waits_for_the_missing_chunk_until_the_stream_ends() -> None:
    cursor = Cursor({"a0001-n": 0})
    gap = ["a0001-n/chunk-00000000.log", "a0001-n/chunk-00000002.log"]
    assert _read_all(_index(*gap), cursor)[0] == []
    filled, after = _read_all(_index(*gap, "a0001-n/chunk-00000001.log"), cursor)
    assert filled == ["a0001-n/chunk-00000001.log", "a0001-n/chunk-00000002.log"]
    assert after.positions == {"a0001-n": 2}
    ended, _ = _read_all(_index(*gap, "a0001-n/end"), cursor)
    assert ended == ["a0001-n/chunk-00000002.log"]  # chunk 1 will never come


def test_the_first_chunk_seen_of_a_stream_starts_it() -> None:
    index = _index("a0001-n/chunk-00000001.log", "a0001-n/chunk-00000002.log")
    assert len(_read_all(index, Cursor())[0]) == 2


def test_complete_needs_every_stream_ended_and_read() -> None:
    keys = ["a0001-n1/chunk-00000000.log", "a0001-n1/end", "a0001-n2/chunk-00000000.log"]
    index = _index(*keys)
    _, cursor = _read_all(index, Cursor())
    assert not index.complete(cursor, started=True)  # n2 has not ended
    index = _index(*keys, "a0001-n2/end")
    assert not index.complete(Cursor(), started=True)  # not read yet
    assert index.complete(cursor, started=True)


def test_no_streams_is_complete_only_for_a_job_that_never_started() -> None:
    assert _index().complete(Cursor(), started=False)
    assert not _index().complete(Cursor(), started=True)


def test_cursor_round_trip() -> None:
    cursor = Cursor().advance([ChunkRef("a0001-node-1", 3), ChunkRef("a0002-node-1", 0)])
    text = LOGS.write(cursor.part(), of="j1")
    assert "=" not in text and "/" not in text and "+" not in text
    assert LOGS.read(text, of="j1") == (cursor,)
    assert LOGS.read("", of="j1") is None and LOGS.read(None, of="j1") is None
    assert cursor.advance([ChunkRef("a0001-node-1", 1)]).positions["a0001-node-1"] == 3


@pytest.mark.parametrize(
    "text",
    [
        "not base64!",
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
        LOGS.write({"a0001-n": -1}, of="j1"),
        base64.urlsafe_b64encode(b'{"a0001-n": 3}').decode(),  # the old form
        LOGS.write({"../x": 3}, of="j1"),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        "a0001-node-1/chunk-00000003.log",
        "x" * 20_001,
        LOGS.write({"a0001-n": 3}, of="j2"),  # another job's
    ],
)
def test_foreign_cursors_are_refused(text: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        LOGS.read(text, of="j1")
    assert refused.value.errors[0].field == "after"


def test_a_cursor_part_must_be_positions() -> None:
    for part in ([1, 2], {"a0001-n": "3"}, {"a0001-n": True}, {"../x": 3}):
        with pytest.raises(ValueError):
            Cursor.parse(part)
