"""One log line when a dependency of the process goes away, and one when it answers again.

Contract:
- ``Dependency(name, settings)`` is one dependency of the process (PostgreSQL, the
  object store, NATS) and whether it is away. ``failed(exc)`` logs at WARNING, the first time
  after it answered, ``<name> (<settings>) unavailable: <error>; waiting for it``; while it
  stays away, at most one line a minute (``logs.REPEAT_SECONDS``): ``<name> (<settings>)
  still unavailable after N s: <error> (M more failures since the last line)``.
  ``answered()`` after a failure logs one line ``<name> (<settings>) answers again after N s
  (M failures)``; while it answers it logs nothing and costs a comparison. No line has a
  traceback: an outage is expected and its error's text says what happened
  (``logs.error_text``); an error that is not an outage is no business of this module.
  The gauge ``trainyard.dependency.away`` (``dependency``: ``postgresql``,
  ``object_store``, ``nats``) is 1 from the failure to the answer, else 0, reported from 0
  once the process uses it (``watched``: ``db.open_pool``, ``runtime.open_service_store``,
  ``bus.Bus.connect``).
- ``POSTGRES`` and ``OBJECT_STORE`` are the process's own; ``report(exc)`` tells the one an
  infrastructure fault names (``bus.infrastructure_fault``) and answers whether ``exc`` was
  one, so a caller logs any other error itself (with its traceback when it is no outage).
  ``forget()`` puts them back as at the process's start, their gauge at 0 too. NATS is not
  among them: each NATS connection has a ``Dependency`` of its own
  (``bus.nats_dependency``), told by the NATS client's errors and its reconnection
  (``bus.nats_error_logger``, ``Bus.connect``).
- Which code tells them: ``shared.db`` of every connection it opens (the pools' and the
  scheduler leader's) and every readiness ping, the object store's readiness check
  (``runtime.store_answers``), the outbox relay and the leader election.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.logs import REPEAT_SECONDS, error_text
from trainyard_platform.shared.metrics import instrument

log = logging.getLogger(__name__)


class Dependency:
    """One dependency of the process and whether it is away (see the module)."""

    def __init__(
        self,
        name: str,
        settings: str,
        label: str,
        *,
        interval_s: float = REPEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = f"{name} ({settings})"
        self.label = label
        self.interval_s = interval_s
        self._clock = clock
        self._away_since: float | None = None
        self._logged_at = 0.0
        self._failures = 0
        self._held_back = 0

    @property
    def away(self) -> bool:
        """Whether it failed and has not answered since."""
        return self._away_since is not None

    def failed(self, exc: BaseException) -> None:
        """It failed with ``exc`` (see the module for what is logged)."""
        now = self._clock()
        self._failures += 1
        if self._away_since is None:
            self._away_since = self._logged_at = now
            self._held_back = 0
            _away.add(1, {"dependency": self.label})
            log.warning("%s unavailable: %s; waiting for it", self.what, error_text(exc))
            return
        if now - self._logged_at < self.interval_s:
            self._held_back += 1
            return
        log.warning(
            "%s still unavailable after %.0f s: %s (%d more failures since the last line)",
            self.what,
            now - self._away_since,
            error_text(exc),
            self._held_back,
        )
        self._logged_at = now
        self._held_back = 0

    def forget(self) -> None:
        """As at the process's start: answering, nothing counted, the gauge at 0 (logs
        nothing: no answer was seen)."""
        if self._away_since is not None:
            _away.add(-1, {"dependency": self.label})
        self._away_since = None
        self._failures = self._held_back = 0

    def answered(self) -> None:
        """It answered (see the module)."""
        if self._away_since is None:
            return
        log.warning(
            "%s answers again after %.0f s (%d failures)",
            self.what,
            self._clock() - self._away_since,
            self._failures,
        )
        self._away_since = None
        self._failures = 0
        _away.add(-1, {"dependency": self.label})

    def watched(self) -> None:
        """Report ``trainyard.dependency.away`` for it from 0: the process uses it (a series
        first seen at 1 shows no change to an alert's ``for``)."""
        _away.add(0, {"dependency": self.label})


_away = instrument("trainyard.dependency.away")
POSTGRES: Final = Dependency("PostgreSQL", "TRAINYARD_DATABASE_URL", "postgresql")
OBJECT_STORE: Final = Dependency("the object store", "TRAINYARD_STORAGE_URI", "object_store")
EVERY: Final = (POSTGRES, OBJECT_STORE)
"""The dependencies told here; each is also told when it answers again. NATS is not: each
connection tells one of its own (``bus.nats_dependency``)."""


def forget() -> None:
    """Every dependency as at the process's start (for tests that run many in one)."""
    for dependency in EVERY:
        dependency.forget()


_BY_FAULT: Final = (("PostgreSQL", POSTGRES), ("object store", OBJECT_STORE))
"""The dependency, by how ``infrastructure_fault`` begins."""


def dependency_of(exc: BaseException) -> Dependency | None:
    """The dependency of ``EVERY`` whose outage ``exc`` is, or None (no outage, or one of
    another or an unknown dependency)."""
    fault = infrastructure_fault(exc)
    if fault is None:
        return None
    return next((d for prefix, d in _BY_FAULT if fault.startswith(prefix)), None)


def report(exc: BaseException) -> bool:
    """Tell the dependency whose outage ``exc`` is (``Dependency.failed``); False when it is
    none of ``EVERY``'s (the caller logs it itself)."""
    dependency = dependency_of(exc)
    if dependency is None:
        return False
    dependency.failed(exc)
    return True
