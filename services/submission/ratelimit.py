"""Token buckets per key: how many requests a caller may make, in bursts and over time.

Contract:
- ``RateLimiter(rate, burst)`` keeps one bucket per key (the submission API keys it by the
  authenticated user's id, never by the raw token or the client address). A bucket holds
  at most ``burst`` tokens, starts full and refills at ``rate`` tokens per second.
- ``take(key)`` spends one token and answers 0.0, or, when the bucket is empty, spends
  nothing and answers the seconds until a token will be there (always > 0).
- ``give_back(key)`` returns the token a ``take`` just spent (a request that another
  bucket refused spends nothing of this one); never past the burst.
- Memory is bounded: a bucket idle long enough to be full again is forgotten (a fresh one
  is the same), and past ``max_keys`` buckets the least recently used is dropped (that
  caller gets a full bucket again: lenient, never stricter than the limit).
- Pure logic: the clock is injected (``time.monotonic`` by default), nothing awaits, so
  one event loop may share a limiter without locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

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
        tokens = min(float(self.burst), tokens + max(0.0, now - counted) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return wait

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
