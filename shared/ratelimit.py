"""Token buckets per key: how many requests a caller may make, in bursts and over time.

One mechanism for every service's rate limits: submission's (``services.submission.api``),
and those of the scheduler, registry, billing and runner (``shared.access.service_guard``).

Contract:
- ``RateLimiter(rate, burst)`` keeps one bucket per key (the services key it by the
  authenticated user, never by the raw token or the client address; submission's bound on
  refused authentications, which has no user, by ``client_key`` of the client's address).
  A bucket holds at most ``burst`` tokens, starts full and refills at ``rate`` tokens per
  second.
- ``take(key)`` spends one token and answers 0.0, or, when the bucket is empty, spends
  nothing and answers the seconds until a token will be there (always > 0).
- ``wait(key)`` answers what ``take`` would (0.0, or the seconds until a token is there)
  and spends nothing.
- ``give_back(key)`` returns the token a ``take`` just spent (a request that another
  bucket refused spends nothing of this one); never past the burst.
- Memory is bounded: a bucket idle long enough to be full again is forgotten (a fresh one
  is the same), and past ``max_keys`` buckets the least recently used is dropped (that
  caller gets a full bucket again: lenient, never stricter than the limit).
- Pure logic: the clock is injected (``time.monotonic`` by default), nothing awaits, so
  one event loop may share a limiter without locks.
- The guards that take from these buckets do so once the token is checked and before the
  caller's role: a request refused 403 is charged as an allowed one (it cost the same
  lookup; docs/security.md, "Rate limits", says why), of its own kind only (a forbidden
  read spends reads, never writes).
- ``Buckets`` pairs a user's bucket with its team's (one kind of request: reads or
  writes); ``UserRateLimits`` holds a service's reads and writes, built from its settings
  (``ServiceSettings``: ``read_rate_per_s``, ``read_burst``, ``write_rate_per_s``,
  ``write_burst``, ``team_rate_factor``). An empty bucket's refusal is ``too_many``: 429
  in the shared error shape, naming ``Authorization``, the limit in words and
  ``Retry-After`` in whole seconds (at least 1).
- ``OperatorRateLimits`` is a service's operator token's reads and writes (scheduler,
  registry, billing, runner: ``GuardedServiceSettings``), one bucket each, as the token has
  no user or team, at ``operator_rate_factor`` times a user's rate and burst; its 429 names
  the operator token.
- ``client_key(address)``: the one key of a client address, so that one client cannot
  sidestep a limit by changing addresses: an IPv4 address as itself; an IPv6 address that
  carries the IPv4 address of the client behind it as that IPv4 address (IPv4-mapped
  ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64's well-known ``64:ff9b::/96``,
  6to4's ``2002:wwxx:yyzz::/48``, whose host has 2^16 /64s, and Teredo's ``2001::/32``,
  whose /64 is its relay server's, shared by all its clients); loopback ``::1`` as itself;
  any other IPv6 address as its /64 network (``2001:db8:1:2::/64``), which a provider
  gives each host whole (keyed by address, one host would have 2^64 buckets). What is no IP
  address (``unknown``: no peer; whatever a trusted proxy's ``X-Forwarded-For`` named) is
  one key, ``UNKNOWN_CLIENT``, for all of them: kept as given, a client able to write it
  would pick a fresh bucket at each request, each key as long as a header.
- Every limit lives in its process: N replicas of a service allow N times the rate.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final, Self

from trainyard_platform.shared.http_errors import RateLimited
from trainyard_platform.shared.settings import GuardedServiceSettings, ServiceSettings

DEFAULT_MAX_KEYS = 100_000
"""Buckets a limiter keeps at most (a few hundred bytes each)."""

COUNTED_AS_READ = "; a request that stores nothing, as this dry run or estimate, counts as a read"
"""Added to the 429 of a request that is no ``GET`` or ``HEAD`` yet spends a read
(``shared.access.stores_nothing``), so its caller knows why the read limit met it."""

OPERATOR_TOKEN: Final = "operator-token"
"""The key of a service's operator token in its ``OperatorRateLimits`` (the one caller of
that token, whoever holds it)."""

IPV6_NETWORK_BITS: Final = 64
"""The prefix an IPv6 client is keyed by: a host is given a /64, every address in it its own."""

UNKNOWN_CLIENT: Final = "unknown"
"""The one key of every client whose address is no IP address (see the module)."""

_CARRYING_LOW_32_BITS: Final = (
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64's well-known prefix (RFC 6052)
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (RFC 4291), but for :: and ::1
)
"""IPv6 networks whose addresses carry a client's IPv4 address in their last 32 bits."""


def client_key(address: str) -> str:
    """The key of a client ``address`` in a limiter (see the module): the IPv4 address, the
    IPv4 address an IPv6 address carries, loopback ``::1``, the /64 network of any other
    IPv6 address (its zone, ``%eth0``, dropped), or ``UNKNOWN_CLIENT`` for what is no IP
    address. A key with a ``/`` is a network, not one address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return UNKNOWN_CLIENT
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    carried = _carried_ipv4(ip)
    if carried is not None:
        return str(carried)
    if ip.is_loopback:
        return str(ipaddress.IPv6Address(int(ip)))  # ``::1``, its zone dropped
    host_bits = 128 - IPV6_NETWORK_BITS
    return str(ipaddress.IPv6Network((int(ip) >> host_bits << host_bits, IPV6_NETWORK_BITS)))


def _carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address of the client ``ip`` stands for, where it carries one (see the
    module), else None. Only the client at that IPv4 address gets the answers to such an
    address, so none can spend another's bucket this way."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # (relay server, client)
    if int(ip) > 1 and any(ip in network for network in _CARRYING_LOW_32_BITS):
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return None


class RateLimiter:
    """Token buckets keyed by caller (see the module)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        if rate <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate must be > 0, burst and max_keys >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        self._full_after = burst / rate
        """Seconds after which an untouched bucket is full whatever it held."""
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()
        """key -> (tokens, when they were counted), least recently used first."""

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: Hashable) -> float:
        """Spend a token of ``key``'s bucket: 0.0, or the seconds to wait when it is empty."""
        now = self._clock()
        self._forget_idle(now)
        tokens, counted = self._buckets.pop(key, (float(self.burst), now))
        tokens = self._refilled(tokens, counted, now)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return wait

    def wait(self, key: Hashable) -> float:
        """What ``take(key)`` would answer now, spending nothing."""
        counted = self._buckets.get(key)
        if counted is None:
            return 0.0
        tokens = self._refilled(*counted, self._clock())
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def _refilled(self, tokens: float, counted: float, now: float) -> float:
        return min(float(self.burst), tokens + max(0.0, now - counted) * self.rate)

    def give_back(self, key: Hashable) -> None:
        """Return one token to ``key``'s bucket (see the module); nothing when it is gone."""
        counted = self._buckets.get(key)
        if counted is not None:
            self._buckets[key] = (min(float(self.burst), counted[0] + 1.0), counted[1])

    def _forget_idle(self, now: float) -> None:
        # Least recently used first: stop at the first bucket that may still be short.
        while self._buckets:
            key, (_, counted) = next(iter(self._buckets.items()))
            if now - counted < self._full_after:
                return
            del self._buckets[key]


def too_many(wait: float, limit: str, burst: int, why: str = "") -> RateLimited:
    """The 429 of a spent bucket: ``limit`` in words, ``Retry-After`` in whole seconds (at
    least 1), the token's user or team named as what the limit counts by."""
    retry = max(1, math.ceil(wait))
    return RateLimited(
        f"rate limit exceeded: at most {limit} (bursts of {burst}){why}; retry after {retry} s",
        retry_after=retry,
        field="Authorization",
        message=f"the token's rate limit is spent: at most {limit}",
    )


@dataclass
class Buckets:
    """The buckets one kind of request (reads or writes) spends: the user's and the team's.
    ``to``: the service the requests go to, in the limit's words (`` to the registry``;
    empty for submission's, which the other services' token checks spend too)."""

    user: RateLimiter
    team: RateLimiter
    kind: str
    to: str = ""

    def take(self, user: Hashable, team: Hashable, why: str = "") -> RateLimited | None:
        """Spend a token of ``user``'s bucket and one of ``team``'s: None, or the 429 when
        either is empty (``why``: added to its detail), and then neither is spent. The
        team's is asked second: a user past its own limit spends nothing of its
        teammates'."""
        wait = self.user.take(user)
        if wait > 0:
            rate = f"{self.user.rate:g} {self.kind} requests{self.to} per second per user"
            return too_many(wait, rate, self.user.burst, why)
        wait = self.team.take(team)
        if wait > 0:
            self.user.give_back(user)
            rate = (
                f"{self.team.rate:g} {self.kind} requests{self.to} per second per team, "
                "all its users together"
            )
            return too_many(wait, rate, self.team.burst, why)
        return None

    def give_back(self, user: Hashable, team: Hashable) -> None:
        self.user.give_back(user)
        self.team.give_back(team)


@dataclass(frozen=True)
class UserRateLimits:
    """A service's buckets of reads and of writes, each per user and per team (see the
    module)."""

    reads: Buckets
    writes: Buckets

    @classmethod
    def of(cls, settings: ServiceSettings, to: str = "") -> Self:
        """The limits ``settings`` name: a user's reads and writes at their rates and
        bursts, a team's at ``team_rate_factor`` times them; ``to`` as ``Buckets.to``."""
        factor = settings.team_rate_factor

        def buckets(rate: float, burst: int, kind: str) -> Buckets:
            user = RateLimiter(rate, burst)
            team = RateLimiter(rate * factor, math.ceil(burst * factor))
            return Buckets(user, team, kind, to)

        return cls(
            reads=buckets(settings.read_rate_per_s, settings.read_burst, "read"),
            writes=buckets(settings.write_rate_per_s, settings.write_burst, "write"),
        )

    def take(
        self, write: bool, user: Hashable, team: Hashable, why: str = ""
    ) -> RateLimited | None:
        """Spend a write (``write``) or a read of ``user`` and its ``team``: None, or the
        429 (``Buckets.take``)."""
        return (self.writes if write else self.reads).take(user, team, why)


@dataclass(frozen=True)
class OperatorRateLimits:
    """A service's operator token's reads and writes: one bucket each, ``operator_rate_factor``
    times a user's (see the module)."""

    reads: RateLimiter
    writes: RateLimiter
    to: str = ""
    """The service, in the limit's words (as ``Buckets.to``)."""

    @classmethod
    def of(cls, settings: GuardedServiceSettings, to: str = "") -> Self:
        """The operator token's limits ``settings`` name: a user's read and write rates and
        bursts times ``operator_rate_factor`` (bursts rounded up)."""
        factor = settings.operator_rate_factor
        return cls(
            reads=RateLimiter(
                settings.read_rate_per_s * factor, math.ceil(settings.read_burst * factor)
            ),
            writes=RateLimiter(
                settings.write_rate_per_s * factor, math.ceil(settings.write_burst * factor)
            ),
            to=to,
        )

    def take(self, write: bool, why: str = "") -> RateLimited | None:
        """Spend a write (``write``) or a read of the operator token: None, or the 429 naming
        the operator token's limit (``why``: added to its detail)."""
        limiter, kind = (self.writes, "write") if write else (self.reads, "read")
        wait = limiter.take(OPERATOR_TOKEN)
        if wait <= 0:
            return None
        rate = f"{limiter.rate:g} {kind} requests{self.to} per second with the operator token"
        return too_many(wait, rate, limiter.burst, why)
