"""Submission's own part of the rate limits: a retry answered from its ``Idempotency-Key``
is charged a read (a job's submission or reproduction, a token's creation).

The token buckets themselves (``RateLimiter``, a user's and its team's ``Buckets``, the
429 of ``too_many``) are every service's, in ``shared.ratelimit``; the submission API keys
them by the authenticated user's id, never by the raw token or the client address, and
keeps one more ``RateLimiter`` by client address (``shared.ratelimit.client_key``: an IPv6
one by its /64): of its refused authentications (``failed_auth``), never of its requests.

Contract:
- A request under an ``Idempotency-Key`` to a route declared ``replays_as_read()`` (a
  submission, a reproduction, ``POST /v1/tokens``) may be a retry answered from what its
  key made (a job, a token), which stores nothing: the API's guard spends a read
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

from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trainyard_platform.shared.ratelimit import Buckets

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
