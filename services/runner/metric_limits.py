"""A bound on how much a job reports: its metric keys and the pace of its metric series.

A job's code is its owner's to write, and a loop that reports metrics as fast as it can
would otherwise put every point on the bus and into the registry's database. Per job:

- Keys. At most ``max_keys`` distinct metric keys in all, each of 1 to ``MAX_METRIC_KEY``
  characters, none holding a control character, a lone surrogate or a bidirectional
  override (``NOT_IN_A_NAME``: a NUL is stored by no consumer's database, so every event
  carrying it would be dead-lettered, the job's end too); a value under any other key is
  dropped everywhere (series, ``job.progress``, the metrics of the job's end), so no event
  of the job grows with what it reports, and every event of it can be stored.
- Pace. Points enter the series (the metric log, ``job.metrics``) at ``points_per_second``
  on average, in bursts of up to ``BURST_SECONDS`` of that, and never less than
  ``max_keys`` (one report of every key allowed is always admitted to a full budget, however
  low the pace: else a job reporting all its keys at once never had a point in its
  series); a report over the budget is
  left out of the series whole (a step's values stay together). Its values still reach
  ``job.progress`` (throttled, the newest kept) and the metrics of the job's end: excess
  reports are coalesced into the newest, never lost from the job's final numbers.

- Names. The runner's own measures (``domain.RUNNER_MEASURES``: the GPU usage it samples, the
  figures it derives when the job ends) are never the job's to report: billing's waste
  report believes them (a job claiming ``gpu_utilization_mean`` 100 on a node without NVML
  would hide its idle GPUs). A value under one of them is dropped everywhere, as above.

What was dropped is counted and said in the job's own log, at most one notice per
``NOTICE_INTERVAL_S`` and once more when the job ends (``notice``). Times are plain floats
(``time.monotonic()`` in the runner).
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard_platform.services.runner.domain import RUNNER_MEASURES
from trainyard_platform.shared.events.payloads import MAX_METRIC_KEY, NOT_IN_A_NAME

BURST_SECONDS = 10.0
"""A job may report this many seconds' worth of points at once (a step's many metrics, an
evaluation after a quiet while) before its pace counts."""
NOTICE_INTERVAL_S = 10.0
"""At most one notice of dropped metrics per this many seconds in a job's log."""


class MetricLimits:
    """The bound of one job's metrics (module docstring)."""

    def __init__(self, points_per_second: float, max_keys: int) -> None:
        if points_per_second <= 0 or max_keys < 1:
            raise ValueError("points_per_second must be positive and max_keys at least 1")
        self._rate = points_per_second
        self._burst = max(points_per_second * BURST_SECONDS, float(max_keys))
        self._tokens = self._burst
        self._refilled: float | None = None
        self._max_keys = max_keys
        self._keys: set[str] = set()
        self._points_dropped = 0
        self._keys_dropped = 0
        self._measures_dropped = 0
        self._last_notice: float | None = None
        self.points_dropped_total = 0
        self.values_dropped_total = 0

    def keys(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """``metrics`` without the values under keys beyond the bound (counted)."""
        kept: dict[str, float] = {}
        for key, value in metrics.items():
            if key in RUNNER_MEASURES:
                self._measures_dropped += 1
                self.values_dropped_total += 1
            elif key in self._keys:
                kept[key] = value
            elif (
                1 <= len(key) <= MAX_METRIC_KEY
                and not NOT_IN_A_NAME.search(key)
                and len(self._keys) < self._max_keys
            ):
                self._keys.add(key)
                kept[key] = value
            else:
                self._keys_dropped += 1
                self.values_dropped_total += 1
        return kept

    def admit(self, points: int, now: float) -> bool:
        """Whether a report of ``points`` points enters the series now (else counted)."""
        if self._refilled is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if points <= self._tokens:
            self._tokens -= points
            return True
        self._points_dropped += points
        self.points_dropped_total += points
        return False

    def notice(self, now: float, *, final: bool = False) -> str | None:
        """A line for the job's log saying what was dropped since the last one, when there
        is something to say and it is time (``final``: the job ended, say it now)."""
        if not (self._points_dropped or self._keys_dropped or self._measures_dropped):
            return None
        recent = self._last_notice is not None and now - self._last_notice < NOTICE_INTERVAL_S
        if recent and not final:
            return None
        self._last_notice = now
        parts = []
        if self._points_dropped:
            parts.append(
                f"{self._points_dropped} metric points left out of the series (more than "
                f"{self._rate:g} points/s; the newest values still reach progress)"
            )
        if self._keys_dropped:
            parts.append(
                f"{self._keys_dropped} metric values dropped (keys beyond the first "
                f"{self._max_keys}, of more than {MAX_METRIC_KEY} characters, or holding a "
                "control character or a bidirectional override)"
            )
        if self._measures_dropped:
            parts.append(
                f"{self._measures_dropped} metric values dropped (named as the runner's own "
                f"measures: {', '.join(sorted(RUNNER_MEASURES))})"
            )
        self._points_dropped = self._keys_dropped = self._measures_dropped = 0
        return f"[trainyard: {'; '.join(parts)}]\n"
