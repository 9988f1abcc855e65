"""Relative durations in texts people read ("~12 min"), and keeping an estimate in such a text
true while it is read later.

Contract:
- ``duration(seconds)``: '~45 s', '~12 min', '~3.5 h', '~2.0 d' (never negative).
- ``estimate_from(reason, start, now)``: a pending reason ends with its estimate counted from
  the pass that wrote it ('...; expected start in ~28 min', '...; reclaim expected in
  ~6 min'). The scheduler republishes a job's note only when more than its durations changed
  (a note per pass per waiting job would flood the bus), so that count goes stale while the
  job waits. This rewrites it from ``start`` (the note's absolute estimated start) and
  ``now``, as the scheduler would have written it then: 'expected to start at the next pass'
  once ``start`` is not in the future. A reason without such an ending, or no ``start``, is
  returned as it is.
"""

from __future__ import annotations

import re
from datetime import datetime

_ESTIMATE = re.compile(r"\bexpected(?: start)? in ~\d+(?:\.\d+)? (?:s|min|h|d)$")
NEXT_PASS = "expected to start at the next pass"


def duration(seconds: float) -> str:
    """'~45 s', '~12 min', '~3.5 h', '~2.0 d'."""
    if seconds < 60:
        return f"~{max(0, round(seconds))} s"
    if seconds < 3600:
        return f"~{round(seconds / 60)} min"
    if seconds < 86400:
        return f"~{seconds / 3600:.1f} h"
    return f"~{seconds / 86400:.1f} d"


def estimate_from(reason: str, start: datetime | None, now: datetime) -> str:
    """``reason`` with its closing estimate counted from ``now`` (see the module)."""
    if start is None:
        return reason
    found = _ESTIMATE.search(reason)
    if found is None:
        return reason
    left = (start - now).total_seconds()
    if left <= 0:
        fresh = NEXT_PASS
    else:
        words = "expected start in" if "expected start" in found.group(0) else "expected in"
        fresh = f"{words} {duration(left)}"
    return reason[: found.start()] + fresh
