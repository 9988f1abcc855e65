"""Requests whose token is missing or wrong, bounded per client (its IPv4 address, its IPv6
/64) before any lookup.

Every request with a token costs a database lookup (``identity.authenticate``); one whose
token is missing, malformed, wrong, revoked or expired, or whose user is disabled, is
refused (401) before the rate limits of ``shared.ratelimit``, which are keyed by the user it has
not got. So a client sending garbage tokens cost a lookup each, without bound.

Contract:
- Every address given is keyed by ``shared.ratelimit.client_key``: an IPv4 address (an
  IPv6 one that carries an IPv4 client's address, as IPv4-mapped, 6to4 or NAT64 do, as
  that IPv4 address) by itself, an IPv6 address by its /64 network, so that a host given a
  /64 cannot spend a fresh bucket with each of its 2^64 addresses (all the addresses of one
  /64 share one bucket, as the users behind one IPv4 address do), and what is no IP
  address (no peer, or a value a trusted peer's ``X-Forwarded-For`` named) as one key for
  all, so that a client able to write it cannot pick a fresh bucket with each request.
  Below, "the address" is that key.
- ``failed(address, token_hash)`` counts a refused authentication (each 401 of the guard)
  against the client address, and forgets that the token was seen valid (below), in a ``shared.ratelimit.RateLimiter`` of ``failed_auth_rate_per_s`` and
  ``failed_auth_burst`` (one mechanism with the users' limits: the same buckets, forgotten
  the same way, bounded in memory the same way).
- ``refusal(address, token_hash)``: None, or the 429 (``Retry-After``, in the shared error
  shape, naming ``Authorization``; "this client address" or, for an IPv6 one, "this
  client's network" and its /64) a request gets before its token is looked up, once its
  address's bucket is empty. It spends nothing: a request so refused is not counted again.
- A token that authenticated in this process within ``VOUCHED_FOR_S`` (``succeeded``), and
  was not refused since (revoked, expired, its user disabled), is never so refused, from
  any address: the address is the one uvicorn gives (the peer's,
  or the ``X-Forwarded-For`` client's when the peer is one of its ``FORWARDED_ALLOW_IPS``),
  and many users may share one (a proxy in front, a NAT), so one client's failures must
  not lock out the users it shares an address with. Those users' tokens, once seen, keep
  working; a token first seen from an address while it is refused waits as its failures
  do. The scheduler, registry and billing, which ask ``/v1/me`` with each of their
  callers' tokens, name the caller in ``X-Forwarded-For`` (``IdentityClient.principal``),
  so where they are among ``FORWARDED_ALLOW_IPS`` a client sending them wrong tokens
  spends its own bucket, not theirs.
- Only token hashes are kept, at most ``max_vouched`` (the least recently seen go first,
  and any unseen for ``VOUCHED_FOR_S``); never a token.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from trainyard_platform.shared.http_errors import RateLimited
from trainyard_platform.shared.ratelimit import DEFAULT_MAX_KEYS, RateLimiter, client_key

VOUCHED_FOR_S = 900.0
"""How long a token's success lets it past its address's refusal (15 minutes)."""


class FailedAuthentications:
    """Refused authentications per client address (``client_key``), and the tokens seen
    valid (see the module)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_vouched: int = DEFAULT_MAX_KEYS,
    ) -> None:
        self.limiter = RateLimiter(rate, burst, clock)
        self._clock = clock
        self._max_vouched = max_vouched
        self._vouched: OrderedDict[str, float] = OrderedDict()
        """token hash -> when it last authenticated, least recently first."""

    def refusal(self, address: str, token_hash: str | None) -> RateLimited | None:
        """The 429 of a request from ``address`` with ``token_hash`` (None: no usable token)
        before its lookup, or None (see the module)."""
        key = client_key(address)
        wait = self.limiter.wait(key)
        if wait <= 0 or (token_hash is not None and self._seen(token_hash)):
            return None
        retry = max(1, math.ceil(wait))
        limit = f"{self.limiter.rate:g} per second (bursts of {self.limiter.burst})"
        where = f"this client's network ({key})" if "/" in key else "this client address"
        return RateLimited(
            f"too many requests with a missing or wrong token from {where}: at most {limit}; "
            f"retry after {retry} s",
            retry_after=retry,
            field="Authorization",
            message=f"too many refused tokens from {where}: at most {limit}",
        )

    def failed(self, address: str, token_hash: str | None = None) -> None:
        """Count a refused authentication of ``address`` with ``token_hash`` (None: no
        usable token), which is vouched for no more: a token revoked, expired or of a user
        disabled since it was seen valid must not go on passing the refusal."""
        self.limiter.take(client_key(address))
        if token_hash is not None:
            self._vouched.pop(token_hash, None)

    def succeeded(self, token_hash: str) -> None:
        """``token_hash`` authenticated just now."""
        self._vouched.pop(token_hash, None)
        self._vouched[token_hash] = self._clock()
        while len(self._vouched) > self._max_vouched:
            self._vouched.popitem(last=False)

    def _seen(self, token_hash: str) -> bool:
        now = self._clock()
        while self._vouched:  # least recently seen first: stop at the first still fresh
            oldest, at = next(iter(self._vouched.items()))
            if now - at < VOUCHED_FOR_S:
                break
            del self._vouched[oldest]
        return token_hash in self._vouched
