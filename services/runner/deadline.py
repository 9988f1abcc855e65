"""An attempt's deadline: its ``max_runtime_seconds``, counted from its grant, the
preparation of its launch included.

Contract:
- ``AttemptDeadline.from_grant(granted_at, received_at, max_runtime_s)``: the one deadline
  of an attempt, made when the runner takes its grant. Its clock starts at the grant's
  ``granted_at`` (the scheduler's clock, where its bill starts too), trusted when it is no
  later than the runner's receipt (``received_at``, its own clock) and at most
  ``MAX_DELIVERY_S`` earlier; a ``granted_at`` after the receipt (the scheduler's clock
  ahead) counts from the receipt, one further back (the bus or the runner away, or the
  clocks that far apart) from ``MAX_DELIVERY_S`` before the receipt: a grant delivered that
  late is the platform's delay, of which the job loses no more than that. A delivery that
  took the whole of a (short) ``max_runtime_seconds`` is no time of the job's to run out:
  ``delivered_too_late()`` says why, and the runner ends such an attempt as the
  platform's (``platform_error``, retried), never as the job's ``max_runtime``. From then
  on it is a monotonic clock (``clock``), which a wall clock set back or forth does not
  move.
- The job's time runs from the start, except while the platform holds the launch up
  (``platform()``, a context, opened by the runner's own waits: for earlier launches on the
  attempt's GPUs and the jobs it fences to exit, for the object store: each download from
  it, an outage's retries and their back-off; for another launch's build of the same
  environment, whose lock it waits on; and the node's own work on the slot: the last job's
  leftovers removed, the sandbox made). That time is not the job's, and the deadline moves
  by it. What is left is the job's: the grant's delivery (as above), its
  code fetched by git or unpacked, its environment built, its command spawned.
- ``remaining()``: the job's seconds left (never below 0); ``expired()`` once none is.
  The phases consult it: the launch's waits (``agent._Launch.unless_stopped``) end the
  launch when it expires, the child processes of a preparation (git, the installer, the
  interpreter's probe) run at most what is left (``cap_timeout``, through ``current``),
  and a job that starts runs only what is left (``supervisor.JobRun.supervise``).
- ``phase(what)``: the phase the job's own time is spent in, for the reason of a deadline
  that passes in it (``ran_out``): ``max_runtime_seconds: <what> took longer than the N s
  left of the job's M s (counted from its grant, its preparation included); stopped
  before the job started``.
- ``current()``: the deadline of the launch this code runs for (a context variable that
  ``asyncio.to_thread`` carries into the launch's threads), None outside one;
  ``cap_timeout(timeout)``: ``timeout`` bounded by it; ``platform_time()``: its ``platform()``.

Safe to use from the launch's threads and its task at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime

MAX_DELIVERY_S = 60.0
"""How much earlier than its receipt a grant's ``granted_at`` may be and still start the
job's clock: a delivery (or clocks apart) within it is the job's time, as it is billed;
what is beyond it is the platform's (module contract)."""

_current: contextvars.ContextVar[AttemptDeadline | None] = contextvars.ContextVar(
    "attempt_deadline", default=None
)


class AttemptDeadline:
    """One attempt's ``max_runtime_seconds``, counted from its grant (module contract)."""

    def __init__(
        self,
        max_runtime_s: int,
        spent_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``spent_s``: the job's time already spent when it is made (since the grant)."""
        self.max_runtime_s = max_runtime_s
        self._clock = clock
        self._lock = threading.Lock()
        self.spent_at_start_s = max(0.0, spent_s)
        """The job's time gone when it was made: the grant's delivery (``from_grant``)."""
        self._due = clock() - self.spent_at_start_s + max_runtime_s
        self._held = 0
        """How many ``platform()`` blocks are open."""
        self._held_since = 0.0
        self._phase = "preparing the job"
        self._left_at_phase = max(0.0, max_runtime_s - self.spent_at_start_s)

    @classmethod
    def from_grant(
        cls,
        granted_at: datetime,
        received_at: datetime,
        max_runtime_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> AttemptDeadline:
        delivered_s = (received_at - granted_at).total_seconds()
        return cls(max_runtime_s, min(max(delivered_s, 0.0), MAX_DELIVERY_S), clock)

    def remaining(self) -> float:
        """The job's seconds left; while the platform holds the launch up, what was left
        when it began to."""
        with self._lock:
            now = self._held_since if self._held else self._clock()
            return max(0.0, self._due - now)

    def expired(self) -> bool:
        return self.remaining() <= 0

    @property
    def held(self) -> bool:
        """Whether the platform holds the launch up now (``platform()``)."""
        with self._lock:
            return self._held > 0

    @contextlib.contextmanager
    def platform(self) -> Iterator[None]:
        """The block's time is the platform's, not the job's: the deadline moves by it."""
        with self._lock:
            if not self._held:
                self._held_since = self._clock()
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                if not self._held:
                    self._due += self._clock() - self._held_since

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        """The job's own time in the block is spent ``what`` (``ran_out`` names it)."""
        left = self.remaining()
        with self._lock:
            before = self._phase, self._left_at_phase
            self._phase, self._left_at_phase = what, left
        try:
            yield
        finally:
            with self._lock:
                self._phase, self._left_at_phase = before

    def delivered_too_late(self) -> str | None:
        """Why the attempt cannot be the job's to run out, None when it can: its grant's
        delivery took the whole of its ``max_runtime_seconds`` (a limit of at most
        ``MAX_DELIVERY_S``) before anything of the job's was done (module contract)."""
        if self.spent_at_start_s < self.max_runtime_s:
            return None
        return (
            f"the grant reached the node {self.spent_at_start_s:.0f} s after the scheduler "
            f"made it, the whole of the job's max_runtime_seconds ({self.max_runtime_s} s), "
            "before anything of the job's was done: the platform's delay (its bus, or the "
            "clocks of the scheduler and the node apart), not the job's; the platform "
            "retries it"
        )

    def ran_out(self) -> str:
        """Why the launch stopped when the deadline passed before the job started."""
        with self._lock:
            what, left = self._phase, self._left_at_phase
        return (
            f"max_runtime_seconds: {what} took longer than the {left:.0f} s left of the "
            f"job's {self.max_runtime_s} s (counted from its grant, its preparation "
            "included); stopped before the job started"
        )

    @contextlib.contextmanager
    def applies(self) -> Iterator[None]:
        """Make it ``current()`` in the block (and the threads it starts with
        ``asyncio.to_thread``)."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)


def current() -> AttemptDeadline | None:
    """The deadline of the launch this code runs for, None outside one."""
    return _current.get()


def platform_time() -> contextlib.AbstractContextManager[None]:
    """``platform()`` of the current deadline (nothing outside a launch)."""
    deadline = current()
    return contextlib.nullcontext() if deadline is None else deadline.platform()


def cap_timeout(timeout: float) -> float:
    """``timeout`` (seconds), no longer than what is left of the current deadline: a child
    process of a launch is killed at the deadline as at its own timeout."""
    deadline = current()
    return timeout if deadline is None else min(timeout, deadline.remaining())
