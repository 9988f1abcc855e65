"""Submission's retries under an ``Idempotency-Key``: a replay is charged a read, anything
else a write (``services.submission.ratelimit``), over the shared token buckets."""

from __future__ import annotations

import pytest

from trainyard_platform.services.submission.ratelimit import OwedWrite, charged_unless_replayed
from trainyard_platform.shared.http_errors import RateLimited
from trainyard_platform.shared.ratelimit import Buckets, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _owed(clock: Clock) -> tuple[OwedWrite, RateLimiter, RateLimiter]:
    reads, writes = RateLimiter(1, 3, clock), RateLimiter(1, 2, clock)
    big = RateLimiter(1, 100, clock)
    owed = OwedWrite(Buckets(reads, big, "read"), Buckets(writes, big, "write"), "u", "t")
    assert owed.reads.take("u", "t") is None  # what the guard spends
    return owed, reads, writes


def _left(limiter: RateLimiter) -> float:
    return limiter._buckets["u"][0]


def test_a_replay_is_charged_its_read_and_anything_else_a_write() -> None:
    """``charged_unless_replayed``: a request settled as a replay keeps the read the guard
    spent (a write spent meanwhile is given back); one that ends otherwise, raised or not,
    spends a write instead of the read."""
    clock = Clock()
    owed, reads, writes = _owed(clock)
    with charged_unless_replayed(owed):
        assert owed.took()
        owed.replayed()
    assert (_left(reads), writes._buckets.get("u", (2.0, 0))[0]) == (2.0, 2.0)

    owed, reads, writes = _owed(clock)
    with pytest.raises(ValueError), charged_unless_replayed(owed):
        raise ValueError("a 409 or a 422")
    assert (_left(reads), _left(writes)) == (3.0, 1.0)


def test_a_write_refused_keeps_the_read_its_lookup_spent() -> None:
    """Past the write burst a request under a key is refused (429) and keeps its read: its
    key's lookup was made, so a flood of new keys is limited by the reads too."""
    clock = Clock()
    owed, reads, writes = _owed(clock)
    writes.take("u")
    writes.take("u")
    assert not owed.took()
    with pytest.raises(RateLimited) as refused:
        owed.spend()
    assert refused.value.errors[0].field == "Authorization"
    assert "write requests per second per user" in refused.value.detail
    assert _left(reads) == 2.0
