"""Token buckets with a fake clock: burst, refill, one bucket per key, bounded memory; a
user's bucket with its team's, and a service's reads and writes built from its settings."""

from __future__ import annotations

import pytest

from trainyard_platform.shared.ratelimit import Buckets, RateLimiter, UserRateLimits
from trainyard_platform.shared.settings import ServiceSettings


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


def test_a_team_refusal_spends_nothing_of_the_user_and_names_the_team() -> None:
    clock = Clock()
    user, team = RateLimiter(1, 5, clock), RateLimiter(1, 2, clock)
    buckets = Buckets(user, team, "read", " to the registry service")
    assert buckets.take("alice", "ml") is None
    assert buckets.take("bob", "ml") is None
    refused = buckets.take("carol", "ml")
    assert refused is not None
    assert refused.detail == (
        "rate limit exceeded: at most 1 read requests to the registry service per second "
        "per team, all its users together (bursts of 2); retry after 1 s"
    )
    assert refused.headers == {"Retry-After": "1"}
    assert refused.errors[0].field == "Authorization"
    assert user._buckets["carol"][0] == 5.0  # given back: the team's bucket refused


def test_a_services_limits_are_its_settings_reads_and_writes_apart() -> None:
    settings = ServiceSettings(
        read_rate_per_s=0.001, read_burst=3, write_rate_per_s=0.001, write_burst=1,
        team_rate_factor=2.5,
    )  # fmt: skip
    limits = UserRateLimits.of(settings, " to the billing service")
    assert (limits.reads.team.rate, limits.reads.team.burst) == (0.0025, 8)  # 7.5 rounded up
    assert (limits.writes.team.rate, limits.writes.team.burst) == (0.0025, 3)
    assert limits.take(True, "u", "t") is None
    refused = limits.take(True, "u", "t", "; why")
    assert refused is not None and refused.detail.startswith(
        "rate limit exceeded: at most 0.001 write requests to the billing service per second "
        "per user (bursts of 1); why; retry after "
    )
    assert [limits.take(False, "u", "t") for _ in range(3)] == [None] * 3  # reads: their own
    assert limits.take(False, "u", "t") is not None
