"""Token buckets per key: how many requests a caller may make, in bursts and over time.

Contract:
- ``RateLimiter(rate, burst)`` keeps one bucket per key (the submission API keys it by the
  authenticated user's id, never by the raw token or the client address). A bucket holds
  at most ``burst`` tokens, starts full and refills at ``rate`` tokens per second.
- ``take(key)`` spends one token and answers 0.0, or, when the bucket is empty, spends
  nothing and answers the seconds until a token will be there (always > 0).
- ``wait(key)`` answers what ``take`` would (0.0, or the seconds until a token is there)
  and spends nothing.
- ``give_back(key)`` returns the token a ``take`` just spent (a request that another
  bucket refused spends nothing of this one); never past the burst.
- Memory is bounded: a bucket idle long enough to be full again is forgotten (a fresh one
  is the same), and past ``max_keys`` buckets the least recently used is dropped (that
  caller gets a full bucket again: lenient, never stricter than the limit).
- The submission API keeps one more limiter by client address: of its refused
  authentications (``failed_auth``), never of its requests.
- Pure logic: the clock is injected (``time.monotonic`` by default), nothing awaits, so
  one event loop may share a limiter without locks.
- A submission under an ``Idempotency-Key`` (a route declared ``replays_as_read()``) may be
  a retry answered from its key's job, which stores nothing: the API's guard spends a read
  of its buckets for it and leaves an ``OwedWrite`` in the request's state (``owed_write``).
  The route runs under ``charged_unless_replayed``: a request it answers as a replay
  (``OwedWrite.replayed``) is charged that read alone; any other outcome (a job stored, a
  different request under the key, any refusal) is charged a write instead of the read,
  exactly as a request without a key, 429 when the writes are spent (such a request keeps
  the read its key's lookup spent, so new keys past the write limit are limited by the
  reads too). A job is stored only
  after its write is spent (``OwedWrite.spend``, ``took``), so replays never carry a new
  job past the write limit. Where the caller's reads are spent the guard charges the write
  at once, as for any submission, and leaves nothing owed.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trainyard_platform.shared.http_errors import RateLimited

DEFAULT_MAX_KEYS = 100_000
"""Buckets a limiter keeps at most (a few hundred bytes each)."""


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


_REPLAYS_AS_READ = "trainyard_replays_as_read"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"


def replays_as_read() -> dict[str, Any]:
    """The ``opt`` of a route that answers a retry under an ``Idempotency-Key`` from the
    job the key made (see the module): such a request spends a read until it turns out to
    be anything but a replay. The route must run under ``charged_unless_replayed`` and
    spend the write (``OwedWrite.spend``) before it stores anything."""
    return {_REPLAYS_AS_READ: True}


def defers_its_write(opt: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    """Whether a write request to a route with ``opt`` spends a read first and owes its
    write (a ``replays_as_read()`` route, an ``Idempotency-Key`` given)."""
    return bool(opt.get(_REPLAYS_AS_READ)) and IDEMPOTENCY_KEY_HEADER in headers


@dataclass
class Buckets:
    """The buckets one kind of request (reads or writes) spends: the user's and the team's."""

    user: RateLimiter
    team: RateLimiter
    kind: str

    def take(self, user: Hashable, team: Hashable, why: str = "") -> RateLimited | None:
        """Spend a token of ``user``'s bucket and one of ``team``'s: None, or the 429 when
        either is empty (``why``: added to its detail), and then neither is spent. The
        team's is asked second: a user past its own limit spends nothing of its
        teammates'."""
        wait = self.user.take(user)
        if wait > 0:
            rate = f"{self.user.rate:g} {self.kind} requests per second per user"
            return too_many(wait, rate, self.user.burst, why)
        wait = self.team.take(team)
        if wait > 0:
            self.user.give_back(user)
            rate = (
                f"{self.team.rate:g} {self.kind} requests per second per team, "
                "all its users together"
            )
            return too_many(wait, rate, self.team.burst, why)
        return None

    def give_back(self, user: Hashable, team: Hashable) -> None:
        self.user.give_back(user)
        self.team.give_back(team)


_OWED = "trainyard_owed_write"


@dataclass
class OwedWrite:
    """The write a submission under an ``Idempotency-Key`` owes, having spent a read (see
    the module): ``spend`` turns the read into the write, ``replayed`` settles it as the
    read."""

    reads: Buckets
    writes: Buckets
    user: Hashable
    team: Hashable
    spent: bool = False
    """The write is spent (and the read given back)."""
    settled: bool = False
    """Answered as a replay: the read is the request's whole charge."""

    def took(self) -> bool:
        """``spend``, answering False (nothing spent) instead of raising the 429."""
        if self.spent:
            return True
        if self.writes.take(self.user, self.team) is not None:
            return False
        self.reads.give_back(self.user, self.team)
        self.spent = True
        return True

    def spend(self) -> None:
        """Charge the request a write instead of its read (nothing when done already);
        ``RateLimited`` (429) when the writes are spent, and then nothing changes."""
        if self.spent:
            return
        refused = self.writes.take(self.user, self.team)
        if refused is not None:
            raise refused
        self.reads.give_back(self.user, self.team)
        self.spent = True

    def replayed(self) -> None:
        """The request was answered from its key's job: charged a read, not the write
        (a write spent meanwhile, before a store found the key taken, is given back and
        the read taken again; were the reads spent just then, it goes free)."""
        if self.spent:
            self.writes.give_back(self.user, self.team)
            self.reads.take(self.user, self.team)
            self.spent = False
        self.settled = True


def owe_write(state: dict[str, Any], owed: OwedWrite) -> None:
    """Leave ``owed`` for the route (the guard, having spent its read)."""
    state[_OWED] = owed


def owed_write(state: Mapping[str, Any]) -> OwedWrite | None:
    """The write the request owes (None: it was charged in full by the guard)."""
    owed = state.get(_OWED)
    return owed if isinstance(owed, OwedWrite) else None


@contextmanager
def charged_unless_replayed(owed: OwedWrite | None) -> Iterator[OwedWrite | None]:
    """Run a ``replays_as_read()`` route: unless the block settled ``owed`` as a replay,
    the request is charged its write when the block ends, raised or not (a 429 then
    replaces what the block raised, as the guard's would have come first)."""
    try:
        yield owed
    except Exception:
        if owed is not None and not owed.settled:
            owed.spend()
        raise
    if owed is not None and not owed.settled:
        owed.spend()
