"""``Leadership.check`` refusing a transaction ends only the term it was checked in.

A check reads the term's lock backend at its start and asks PostgreSQL whether that backend
still holds the lock. If the term ends and a new one begins while the query is in flight
(slow under load), the old backend's refusal is about the old term: it must not depose the
new one.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from trainyard_platform.services.scheduler.leader import Leadership, NotLeader
from trainyard_platform.shared.bus import NotNow


class _SlowRefusal:
    """A connection whose lock query answers 'not held' once ``release`` is set."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def fetchval(self, *_args: object) -> bool:
        self.asked.set()
        await self.release.wait()
        return False


def _begin_term(leadership: Leadership, pid: int) -> asyncio.Event:
    """What ``_lead`` does when a term begins."""
    lost = leadership._lost = asyncio.Event()
    leadership._pid = pid
    return lost


async def test_an_old_terms_refusal_does_not_depose_the_new_term() -> None:
    leadership = Leadership("postgresql://unused")
    old = _begin_term(leadership, 101)
    conn = _SlowRefusal()
    check = asyncio.create_task(leadership.check(conn))  # type: ignore[arg-type]
    await conn.asked.wait()
    old.set()  # the old term ends (``_lead``'s finally) and a new one begins
    leadership._pid, leadership._lost = None, None
    new = _begin_term(leadership, 202)
    conn.release.set()
    with pytest.raises(NotLeader):
        await check
    assert leadership.is_leader
    assert not new.is_set()


async def test_a_refusal_in_the_current_term_deposes_it() -> None:
    leadership = Leadership("postgresql://unused")
    lost = _begin_term(leadership, 101)
    conn = _SlowRefusal()
    conn.release.set()
    with pytest.raises(NotLeader):
        await leadership.check(conn)  # type: ignore[arg-type]
    assert not leadership.is_leader
    assert lost.is_set()


class _Unanswered:
    """A lock connection whose check times out, as against a paused PostgreSQL."""

    async def fetchval(self, *_args: object, **_kwargs: object) -> bool:
        raise TimeoutError()


async def test_a_lock_check_that_timed_out_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """With PostgreSQL paused, the leader logged 'leader lock connection failed: ' and
    nothing after it: a timeout's text is empty."""
    leadership = Leadership("postgresql://unused")
    lost = _begin_term(leadership, 101)
    await leadership._watch(_Unanswered(), lost)  # type: ignore[arg-type]
    assert lost.is_set()
    (message,) = [r.getMessage() for r in caplog.records if "leader lock" in r.getMessage()]
    assert message == "leader lock connection failed: TimeoutError", message


def test_a_deposed_leader_no_longer_says_since_when_it_leads() -> None:
    """With PostgreSQL paused, /readyz answered 'role: follower' with the old term's
    'leader_since' for as long as the deposed term's work took to stop (seen 15 s)."""
    leadership = Leadership("postgresql://unused")
    _begin_term(leadership, 101)
    leadership.since = datetime.now(UTC)
    leadership._deposed("lost the leader lock connection")
    assert leadership.role == "follower"
    assert leadership.since is None


def test_a_refused_batch_goes_back_to_the_bus_for_the_new_leader() -> None:
    """``NotLeader`` is the bus's ``NotNow``: a batch refused by a deposed leader is handed
    back whole, counted as no failure of its events (``tests/unit/shared/
    test_bus_pull_rules.py``), never dead-lettered."""
    assert issubclass(NotLeader, NotNow)
