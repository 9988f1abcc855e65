"""Which log chunks a reader gets next: the pure part of ``GET /v1/jobs/{id}/logs``.

The runner uploads a job's output as objects under ``logs/<job_id>/``::

    <stream>/chunk-<seq:08d>.log   at most 1 MiB of raw output, about every second
    <stream>/end                   empty; the stream is complete

where ``<stream>`` is ``a<attempt:04d>-<node_id>`` (one per attempt and node). Keys here are
relative to ``logs/<job_id>/``.

Contract:
- A page holds chunks in key order (stream, then sequence number), never one the cursor
  has passed, at most ``limit`` of them.
- The cursor remembers, per stream, the last sequence number returned. One key would not
  do: the nodes of a gang write concurrently, and a new chunk of ``a0001-node-1`` sorts
  before a chunk of ``a0001-node-2`` already returned. ``Cursor.part`` is those positions as
  one part of the platform's cursor (``shared.paging``, bound to the job), opaque to
  clients; the empty string is the start.
- Within a stream, chunks are returned without gaps: after chunk ``n`` comes ``n+1``, and a
  later chunk that is already listed waits until ``n+1`` is (it is being uploaded). Once the
  stream has its ``end``, nothing more will come, and any gap is skipped.
- ``complete`` is true when every stream has ended and the cursor is past all of their
  chunks, or, for a job that never started, when there is no stream at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STREAM = re.compile(r"a[0-9]{4}-[^/]+")
CHUNK = re.compile(r"chunk-([0-9]{8,})\.log")
END = "end"
MAX_CURSOR_CHARS = 20_000
"""The longest log cursor read: a job's streams, one per attempt and node, are many."""


def prefix(job_id: str) -> str:
    """The object-store prefix of a job's logs."""
    return f"logs/{job_id}/"


def chunk_key(stream: str, seq: int) -> str:
    return f"{stream}/chunk-{seq:08d}.log"


@dataclass(frozen=True, order=True)
class ChunkRef:
    """One chunk object: its stream and sequence number (``key`` is relative)."""

    stream: str
    seq: int

    @property
    def key(self) -> str:
        return chunk_key(self.stream, self.seq)


@dataclass(frozen=True)
class Cursor:
    """Per stream, the last sequence number returned."""

    positions: Mapping[str, int] = field(default_factory=dict)

    def part(self) -> dict[str, int]:
        """The positions as a cursor part (``parse`` reads it back)."""
        return dict(sorted(self.positions.items()))

    @classmethod
    def parse(cls, part: Any) -> Cursor:
        """The positions in a cursor part; ValueError for anything ``part`` never wrote."""
        if not isinstance(part, dict) or not all(
            isinstance(k, str) and STREAM.fullmatch(k) and type(v) is int and v >= 0
            for k, v in part.items()
        ):
            raise ValueError("not a log cursor")
        return cls(part)

    def advance(self, chunks: Iterable[ChunkRef]) -> Cursor:
        """The cursor after ``chunks`` were returned."""
        positions = dict(self.positions)
        for chunk in chunks:
            positions[chunk.stream] = max(chunk.seq, positions.get(chunk.stream, -1))
        return Cursor(positions)


@dataclass
class _Stream:
    seqs: list[int] = field(default_factory=list)
    ended: bool = False


@dataclass(frozen=True)
class LogIndex:
    """What one listing of ``logs/<job_id>/`` holds, by stream."""

    streams: Mapping[str, _Stream]

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> LogIndex:
        """Index keys relative to the job's prefix; other objects are ignored."""
        streams: dict[str, _Stream] = {}
        for key in keys:
            stream, sep, name = key.partition("/")
            if not sep or not STREAM.fullmatch(stream):
                continue
            if name == END:
                streams.setdefault(stream, _Stream()).ended = True
            elif match := CHUNK.fullmatch(name):
                streams.setdefault(stream, _Stream()).seqs.append(int(match.group(1)))
        for state in streams.values():
            state.seqs.sort()
        return cls(streams)

    def pending(self, cursor: Cursor) -> list[ChunkRef]:
        """Every chunk the reader may have next, in key order."""
        found: list[ChunkRef] = []
        for name in sorted(self.streams):
            state = self.streams[name]
            last = cursor.positions.get(name)
            expected = None if last is None else last + 1
            for seq in state.seqs:
                if last is not None and seq <= last:
                    continue
                if expected is not None and seq != expected and not state.ended:
                    break  # n+1 is still being uploaded
                found.append(ChunkRef(name, seq))
                expected = seq + 1
        found.sort(key=lambda c: c.key)
        return found

    def complete(self, cursor: Cursor, started: bool) -> bool:
        """Every stream has ended and the cursor is past all of its chunks (see module)."""
        if not self.streams:
            return not started
        return all(state.ended for state in self.streams.values()) and not self.pending(cursor)


def page(index: LogIndex, cursor: Cursor, limit: int) -> Sequence[ChunkRef]:
    """The chunks of the next page (at most ``limit``)."""
    return index.pending(cursor)[:limit]
