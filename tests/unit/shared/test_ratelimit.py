"""Token buckets with a fake clock: burst, refill, one bucket per key, bounded memory; a
user's bucket with its team's, a service's reads and writes built from its settings, its
operator token's own, and the one key of a client address (an IPv6 one by its /64)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from trainyard_platform.shared.ratelimit import (
    Buckets,
    OperatorRateLimits,
    RateLimiter,
    UserRateLimits,
    client_key,
)
from trainyard_platform.shared.settings import GuardedServiceSettings, ServiceSettings


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


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("::ffff:203.0.113.9", "203.0.113.9"),  # IPv4-mapped: the IPv4 client's own bucket
        ("2001:db8:1:2::5", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2:0:0:0:7", "2001:db8:1:2::/64"),  # any spelling of it
        ("fe80::1%eth0", "fe80::/64"),  # the zone is no part of the network
        ("unknown", "unknown"),  # no peer
        # IPv6 addresses that carry their client's IPv4 address: that address's bucket.
        ("2002:cb00:7109::1", "203.0.113.9"),  # 6to4: one IPv4 host has a whole /48
        ("2002:cb00:7109:ffff::1", "203.0.113.9"),  # ... 2^16 /64s, one bucket
        ("64:ff9b::203.0.113.9", "203.0.113.9"),  # NAT64: every IPv4 client in one /64
        ("::203.0.113.9", "203.0.113.9"),  # IPv4-compatible: in ::/64 with loopback
        # Teredo: the /64 is the relay server's (65.54.227.120), shared by all its clients.
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
        ("::1", "::1"),  # loopback: one host, no network
        ("::1%lo", "::1"),
    ],
)
def test_a_client_is_keyed_by_its_ipv4_address_or_its_ipv6_64(address: str, key: str) -> None:
    assert client_key(address) == key


@pytest.mark.parametrize(
    "address", ["", "unknown", "garbage-1", "1.2.3.4.5", "[::1]", "x" * 16_000, "::1%"]
)
def test_what_is_no_ip_address_is_one_key_whatever_it_says(address: str) -> None:
    """Kept as given, a client that can write its address (the ``X-Forwarded-For`` a
    trusted peer passes on) had a fresh bucket with each value, each key as long as a
    header: as many buckets as it liked, their memory bound only by their number."""
    assert client_key(address) == "unknown"


def test_one_6to4_host_has_one_bucket_with_its_ipv4_address() -> None:
    """A host with one IPv4 address has the 2^16 /64s of its 6to4 /48: keyed by /64, as
    many fresh buckets."""
    limiter = RateLimiter(rate=0.001, burst=2, clock=Clock())
    assert limiter.take(client_key("2002:cb00:7109:1::1")) == 0.0
    assert limiter.take(client_key("2002:cb00:7109:2::1")) == 0.0
    assert limiter.take(client_key("2002:cb00:7109:3::1")) > 0
    assert limiter.take(client_key("203.0.113.9")) > 0  # the same host, natively
    assert limiter.take(client_key("2002:cb00:710a:1::1")) == 0.0  # another IPv4 host


def test_addresses_of_one_ipv6_64_share_a_bucket_and_of_another_64_do_not() -> None:
    """A host is given a whole /64: keyed by address, each of its 2^64 addresses had a
    full bucket of its own."""
    limiter = RateLimiter(rate=0.001, burst=2, clock=Clock())
    assert limiter.take(client_key("2001:db8:1:2::1")) == 0.0
    assert limiter.take(client_key("2001:db8:1:2::2")) == 0.0
    assert limiter.take(client_key("2001:db8:1:2:a:b:c:d")) > 0  # the same /64: spent
    assert limiter.take(client_key("2001:db8:1:3::1")) == 0.0  # the next /64: its own
    assert limiter.take(client_key("::ffff:198.51.100.7")) == 0.0
    assert limiter.take(client_key("198.51.100.7")) == 0.0
    assert limiter.take(client_key("::ffff:198.51.100.7")) > 0  # mapped: the IPv4 bucket


def test_the_operator_token_has_buckets_of_its_own_a_multiple_of_a_users() -> None:
    settings = GuardedServiceSettings(
        admin_token=SecretStr("op"), read_rate_per_s=0.001, read_burst=3,
        write_rate_per_s=0.001, write_burst=1, operator_rate_factor=2.5,
    )  # fmt: skip
    assert GuardedServiceSettings(admin_token=SecretStr("op")).operator_rate_factor == 10
    limits = OperatorRateLimits.of(settings, " to the runner service")
    assert (limits.reads.rate, limits.reads.burst) == (0.0025, 8)  # 7.5 rounded up
    assert (limits.writes.rate, limits.writes.burst) == (0.0025, 3)
    assert [limits.take(True) for _ in range(3)] == [None] * 3
    refused = limits.take(True, "; why")
    assert refused is not None and refused.detail.startswith(
        "rate limit exceeded: at most 0.0025 write requests to the runner service per second "
        "with the operator token (bursts of 3); why; retry after "
    )
    assert refused.errors[0].field == "Authorization"
    assert [limits.take(False) for _ in range(8)] == [None] * 8  # reads: their own
    assert limits.take(False) is not None
