"""Token buckets with a fake clock: burst, refill, one bucket per key, bounded memory."""

from __future__ import annotations

import pytest

from trainyard_platform.services.submission.ratelimit import (
    Buckets,
    OwedWrite,
    RateLimiter,
    charged_unless_replayed,
)
from trainyard_platform.shared.http_errors import RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_allowed_then_the_next_request_waits() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=5, clock=clock)
    assert [limiter.take("a") for _ in range(5)] == [0.0] * 5
    assert limiter.take("a") == pytest.approx(0.1)
    assert limiter.take("a") == pytest.approx(0.1)  # a refused request spends nothing


def test_tokens_refill_at_the_rate_up_to_the_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2, burst=4, clock=clock)
    for _ in range(4):
        limiter.take("a")
    assert limiter.take("a") == pytest.approx(0.5)
    clock.now += 0.25
    assert limiter.take("a") == pytest.approx(0.25)
    clock.now += 0.25
    assert limiter.take("a") == 0.0
    assert limiter.take("a") > 0
    clock.now += 3600  # idle for an hour: back to the burst, not 7200 tokens
    assert [limiter.take("a") for _ in range(4)] == [0.0] * 4
    assert limiter.take("a") > 0


def test_each_key_has_its_own_bucket() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1, burst=2, clock=clock)
    limiter.take(1)
    limiter.take(1)
    assert limiter.take(1) > 0
    assert limiter.take(2) == 0.0
    assert limiter.take(2) == 0.0
    assert limiter.take(2) > 0


def test_a_slow_rate_waits_longer_than_a_second() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=0.1, burst=1, clock=clock)
    assert limiter.take("a") == 0.0
    assert limiter.take("a") == pytest.approx(10.0)


def test_idle_buckets_are_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=10, clock=clock)  # full again after 1 s
    for key in range(1000):
        limiter.take(key)
    assert len(limiter) == 1000
    clock.now += 0.5
    limiter.take("late")
    assert len(limiter) == 1001
    clock.now += 0.6
    limiter.take("now")
    assert len(limiter) == 2  # "late" (0.6 s idle) may still be short; the rest were full


def test_memory_is_bounded_by_max_keys() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1, burst=1, clock=clock, max_keys=100)
    for key in range(10_000):
        limiter.take(key)
        clock.now += 0.001
    assert len(limiter) == 100
    assert limiter.take(9_999) > 0  # the most recent callers are still held to the limit


def test_nonsense_settings_are_refused() -> None:
    for rate, burst in ((0, 1), (-1, 1), (1, 0)):
        with pytest.raises(ValueError):
            RateLimiter(rate=rate, burst=burst)


def test_a_token_given_back_is_there_again_never_past_the_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1, burst=2, clock=clock)
    limiter.take("a")
    limiter.take("a")
    assert limiter.take("a") > 0
    limiter.give_back("a")
    assert limiter.take("a") == 0.0
    limiter.give_back("b")  # no bucket: nothing to give back, none made
    assert len(limiter) == 1
    limiter.give_back("a")
    limiter.give_back("a")
    limiter.give_back("a")
    assert [limiter.take("a") for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("a") > 0


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


def test_wait_says_what_take_would_and_spends_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2, burst=2, clock=clock)
    assert limiter.wait("a") == 0.0  # no bucket yet: a full one
    limiter.take("a")
    assert [limiter.wait("a") for _ in range(3)] == [0.0] * 3
    limiter.take("a")
    assert limiter.wait("a") == pytest.approx(0.5) == limiter.take("a")
    clock.now += 0.5
    assert limiter.wait("a") == 0.0
    assert limiter.take("a") == 0.0
