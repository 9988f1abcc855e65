"""Refused authentications per client address (``failed_auth``), with a fake clock: past
the burst an address is refused before any lookup, but for tokens seen valid lately; other
addresses are not held back."""

from __future__ import annotations

from trainyard_platform.services.submission.failed_auth import (
    VOUCHED_FOR_S,
    FailedAuthentications,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


GOOD, BAD = "a" * 64, "b" * 64


def test_past_the_burst_an_address_is_refused_with_retry_after_until_it_refills() -> None:
    clock = Clock()
    failures = FailedAuthentications(rate=0.5, burst=3, clock=clock)
    for _ in range(3):
        assert failures.refusal("10.0.0.1", BAD) is None
        failures.failed("10.0.0.1")
    refused = failures.refusal("10.0.0.1", BAD)
    assert refused is not None
    assert (refused.status, refused.headers) == (429, {"Retry-After": "2"})
    assert "at most 0.5 per second (bursts of 3)" in refused.detail
    assert [e.field for e in refused.errors] == ["Authorization"]
    assert failures.refusal("10.0.0.1", None) is not None  # no token at all: the same
    assert failures.refusal("10.0.0.1", BAD) is not None  # a refusal spends nothing more
    assert failures.refusal("10.0.0.2", BAD) is None  # another address is not held back
    clock.now += 2
    assert failures.refusal("10.0.0.1", BAD) is None


def test_a_token_seen_valid_lately_passes_its_address_refusal() -> None:
    clock = Clock()
    failures = FailedAuthentications(rate=1, burst=1, clock=clock, max_vouched=2)
    failures.succeeded(GOOD)
    failures.failed("proxy")
    assert failures.refusal("proxy", BAD) is not None
    assert failures.refusal("proxy", GOOD) is None  # a user behind the same proxy
    clock.now += VOUCHED_FOR_S - 1
    failures.failed("proxy")
    assert failures.refusal("proxy", GOOD) is None
    clock.now += 1  # unseen for VOUCHED_FOR_S: forgotten
    failures.failed("proxy")
    assert failures.refusal("proxy", GOOD) is not None


def test_only_the_most_recently_seen_tokens_are_kept() -> None:
    clock = Clock()
    failures = FailedAuthentications(rate=1, burst=1, clock=clock, max_vouched=2)
    for token in ("1" * 64, "2" * 64, "3" * 64):
        failures.succeeded(token)
    failures.failed("x")
    assert failures.refusal("x", "1" * 64) is not None
    assert failures.refusal("x", "3" * 64) is None


def test_a_token_refused_since_it_was_seen_valid_is_vouched_for_no_more() -> None:
    clock = Clock()
    failures = FailedAuthentications(rate=1, burst=1, clock=clock)
    failures.succeeded(GOOD)
    failures.failed("192.0.2.1", GOOD)  # revoked since: its lookup refused it
    assert failures.refusal("192.0.2.1", GOOD) is not None
    assert failures.refusal("192.0.2.2", GOOD) is None  # another address: not held back


def test_the_addresses_of_one_ipv6_64_share_one_budget_of_failures() -> None:
    """A host is given a /64: keyed by address, it had 2^64 fresh budgets of failures."""
    failures = FailedAuthentications(rate=0.5, burst=2, clock=Clock())
    failures.failed("2001:db8:1:2::1")
    failures.failed("2001:db8:1:2::2")
    refused = failures.refusal("2001:db8:1:2:dead:beef:0:1", BAD)
    assert refused is not None
    assert "from this client's network (2001:db8:1:2::/64): at most" in refused.detail
    assert failures.refusal("2001:db8:1:3::1", BAD) is None  # another /64: its own budget
    failures.failed("::ffff:10.0.0.9")
    failures.failed("10.0.0.9")
    refused = failures.refusal("::ffff:10.0.0.9", BAD)  # an IPv4 client, however written
    assert refused is not None and "from this client address: at most" in refused.detail


def test_clients_whose_address_is_no_ip_address_share_one_budget_of_failures() -> None:
    """Whatever a trusted proxy's ``X-Forwarded-For`` names is what uvicorn gives: keyed as
    given, a client writing a new value there at each request was never held back."""
    failures = FailedAuthentications(rate=0.5, burst=2, clock=Clock())
    failures.failed("garbage-1")
    failures.failed("garbage-2")
    refused = failures.refusal("x" * 10_000, BAD)
    assert refused is not None and "from this client address: at most" in refused.detail
    assert failures.refusal("192.0.2.1", BAD) is None  # an IP address: its own budget
    assert len(failures.limiter) == 1


def test_a_6to4_or_nat64_client_shares_the_budget_of_the_ipv4_address_it_carries() -> None:
    """A 6to4 host has a /48 (2^16 /64s, a fresh budget each); every IPv4 client of a NAT64
    translator is in its one /64 (one client's failures held back all of them)."""
    failures = FailedAuthentications(rate=0.5, burst=2, clock=Clock())
    failures.failed("2002:cb00:7109:1::1")
    failures.failed("2002:cb00:7109:2::1")
    assert failures.refusal("203.0.113.9", BAD) is not None
    assert failures.refusal("64:ff9b::203.0.113.9", BAD) is not None
    assert failures.refusal("64:ff9b::198.51.100.7", BAD) is None  # another IPv4 client
