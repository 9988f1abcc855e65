"""Waste figures and the job success rate from billing's facts: pure code.

Contract (docs/billing.md, "Waste"):
- The facts are ``Allocation`` (a grant, with its bill once released, what its runner
  measured and its latest checkpoint), ``JobWaits`` (a job's submission, its allocations
  and how it ended) and ``Unallocated`` (GPUs of a node free while a job of its flavor
  waited). ``pieces(...)`` turns them into ``Piece``s: one figure, one owner, an interval of
  GPUs and the share of it that is waste.
- A ``Tally`` sums pieces exactly: each clipped to ``[start, min(end, now))`` and split at
  the price changes of its flavor (``Pricer``), as GPU-microseconds x the piece's share per
  price; its money is the sum over prices of GPU-hours x price, rounded half-up to 6 places
  once, when read (``Tally.priced``; ``price`` does it for one piece). A flavor without a
  price at the piece's start is counted as unpriced GPU time, not as money.
- ``waits(job, now)``: a job waits from its submission to its first grant, and after each
  attempt that ends without success (failed, preempted, lost) until its next grant; a wait
  still open ends when the job ended (cancelled while waiting), else it lasts until now.
- Absent measurements are never invented: an allocation without a utilisation (no NVML on
  the node, or an end report without metrics) is ``idle_gpus_unmeasured``, not idle and not
  busy; likewise ``input_bound_unmeasured`` without a data-wait measurement.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, localcontext
from typing import Literal

from trainyard_platform.services.billing.costs import Dimension
from trainyard_platform.services.billing.domain import money
from trainyard_platform.services.billing.prices import PriceSchedule

Figure = Literal[
    "idle_gpus",
    "unallocated_gpus",
    "idle_gpus_unmeasured",
    "queueing",
    "failed_attempts",
    "platform_failure",
    "lost_work",
    "input_bound",
    "input_bound_unmeasured",
    "low_priority_holding",
]
FIGURES: tuple[Figure, ...] = (
    "idle_gpus",
    "unallocated_gpus",
    "idle_gpus_unmeasured",
    "queueing",
    "failed_attempts",
    "platform_failure",
    "lost_work",
    "input_bound",
    "input_bound_unmeasured",
    "low_priority_holding",
)
IDLE_PERCENT = Decimal(5)
"""Mean GPU utilisation (%) under which an allocation's GPU time counts as idle (the
runner's own threshold, ``services.runner.usage_metrics.IDLE_PERCENT``)."""
PRIORITY_VALUES: Mapping[str, int] = {"low": 0, "normal": 100, "high": 1000}
"""The scheduler's default priority classes and their values; any other class ranks 0, as
the scheduler ranks a class it does not know (``DEFAULT_PRIORITY``)."""
FAILED = frozenset({"failed", "lost"})
"""Outcomes of an attempt that failed (the job's code, or its node)."""
PLATFORM_ERROR = "platform_error"
"""The ``failure_kind`` of an attempt that failed through the platform: its GPU time is
``platform_failure`` (charged to the platform) instead of ``failed_attempts``."""
INTERRUPTED = frozenset({"failed", "lost", "preempted"})
"""Outcomes after which the work since the latest checkpoint is done again."""
ZERO = Decimal(0)


def rank(priority: str | None) -> int:
    return PRIORITY_VALUES.get(priority or "", 0)


@dataclass(frozen=True)
class Owner:
    team: str | None
    project: str | None
    user: str | None
    queue: str | None
    flavor: str | None
    job: str | None

    def value(self, dim: Dimension) -> str | None:
        value: str | None = getattr(self, dim)
        return value


@dataclass(frozen=True)
class Allocation:
    """One allocation: granted, and released (``ended_at``, ``outcome``) or still held."""

    allocation_id: str
    owner: Owner
    gpus: int
    granted_at: datetime
    ended_at: datetime | None
    outcome: str | None
    attempt: int | None
    priority: str | None
    gpu_utilization: Decimal | None = None
    data_wait_fraction: Decimal | None = None
    last_checkpoint: datetime | None = None
    failure_kind: str | None = None
    """The runner's ``failure_kind`` of a failed attempt (None: none reported);
    ``platform_error`` too for one charged to the platform whatever its runner reported (a
    gang's member released for another member's platform failure)."""


@dataclass(frozen=True)
class JobWaits:
    """A job, what it asked for, its allocations and how it ended (None: not yet)."""

    owner: Owner
    gpus: int
    priority: str
    submitted_at: datetime
    allocations: Sequence[Allocation]
    ended_at: datetime | None


@dataclass(frozen=True)
class Wait:
    start: datetime
    end: datetime
    queue: str | None


@dataclass(frozen=True)
class Piece:
    figure: Figure
    owner: Owner
    flavor: str
    gpus: int
    start: datetime
    end: datetime
    share: Decimal = Decimal(1)


@dataclass(frozen=True)
class Priced:
    gpu_seconds: Decimal
    cost: Decimal
    """Of the GPU-seconds the price book has a price for."""
    unpriced_gpu_seconds: Decimal
    """GPU-seconds of a flavor without a price at the piece's start (not in ``cost``)."""
    seconds: Decimal
    """The clipped intervals' length (wall time, not GPU time)."""


def waits(job: JobWaits, now: datetime) -> list[Wait]:
    """The job's waits for GPUs (module contract), in time order."""
    attempts: dict[object, list[Allocation]] = {}
    for a in job.allocations:
        attempts.setdefault(a.attempt if a.attempt is not None else a.granted_at, []).append(a)
    ordered = sorted(attempts.values(), key=lambda group: min(a.granted_at for a in group))
    out: list[Wait] = []
    since: datetime | None = job.submitted_at
    queue = None
    for group in ordered:
        granted = min(a.granted_at for a in group)
        queue = next((a.owner.queue for a in group if a.owner.queue is not None), queue)
        if since is not None and granted > since:
            out.append(Wait(since, granted, queue))
        ends = [a.ended_at for a in group]
        outcomes = {a.outcome for a in group}
        if any(e is None for e in ends) or not outcomes <= INTERRUPTED:
            since = None  # running, or ended for good (succeeded, cancelled)
        else:
            since = max(e for e in ends if e is not None)
    if since is not None:
        end = job.ended_at if job.ended_at is not None else now
        if end > since:
            out.append(Wait(since, end, queue))
    return out


def _merge(intervals: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlaps(
    merged: Sequence[tuple[datetime, datetime]],
    starts: Sequence[datetime],
    start: datetime,
    end: datetime,
) -> list[tuple[datetime, datetime]]:
    """The parts of ``[start, end)`` inside ``merged`` (disjoint, sorted; ``starts``: their
    starts)."""
    out = []
    i = max(bisect_right(starts, start) - 1, 0)
    for s, e in merged[i:]:
        if s >= end:
            break
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            out.append((lo, hi))
    return out


def allocation_pieces(a: Allocation) -> list[Piece]:
    """Figures 1 (idle, allocated), 3 (failed attempts or platform failures, lost work) and
    4 (input-bound) of one released allocation."""
    if a.ended_at is None or a.outcome is None or a.ended_at <= a.granted_at:
        return []
    flavor = a.owner.flavor or ""
    whole = (a.owner, flavor, a.gpus, a.granted_at, a.ended_at)
    out: list[Piece] = []
    if a.gpu_utilization is None:
        out.append(Piece("idle_gpus_unmeasured", *whole))
    elif a.gpu_utilization < IDLE_PERCENT:
        out.append(Piece("idle_gpus", *whole))
    if a.data_wait_fraction is None:
        out.append(Piece("input_bound_unmeasured", *whole))
    elif a.data_wait_fraction > 0:
        share = min(a.data_wait_fraction, Decimal(1))
        out.append(Piece("input_bound", *whole, share=share))
    if a.outcome in FAILED:
        # An attempt that failed through the platform is the platform's, not the team's
        # (charged to the platform): one figure or the other, never both.
        platform = a.failure_kind == PLATFORM_ERROR
        out.append(Piece("platform_failure" if platform else "failed_attempts", *whole))
    if a.outcome in INTERRUPTED:
        since = a.granted_at
        if a.last_checkpoint is not None and a.granted_at <= a.last_checkpoint <= a.ended_at:
            since = a.last_checkpoint
        if since < a.ended_at:
            out.append(Piece("lost_work", a.owner, flavor, a.gpus, since, a.ended_at))
    return out


def queueing_pieces(job: JobWaits, now: datetime) -> list[Piece]:
    """Figure 2: the job's GPUs times each of its waits."""
    flavor = job.owner.flavor or ""
    out = []
    for w in waits(job, now):
        owner = Owner(
            job.owner.team, job.owner.project, job.owner.user, w.queue, flavor, job.owner.job
        )
        out.append(Piece("queueing", owner, flavor, job.gpus, w.start, w.end))
    return out


def holding_pieces(
    allocations: Sequence[Allocation], jobs: Sequence[JobWaits], now: datetime
) -> list[Piece]:
    """Figure 5: the time each allocation held its GPUs while a job of a higher priority
    waited for GPUs of the same flavor (any queue, any team)."""
    waiting: dict[str, list[tuple[int, datetime, datetime]]] = {}
    for job in jobs:
        for w in waits(job, now):
            waiting.setdefault(job.owner.flavor or "", []).append(
                (rank(job.priority), w.start, w.end)
            )
    unions: dict[tuple[str, int], tuple[list[tuple[datetime, datetime]], list[datetime]]] = {}
    out = []
    for a in allocations:
        if a.priority is None:
            continue
        flavor = a.owner.flavor or ""
        mine = rank(a.priority)
        key = (flavor, mine)
        if key not in unions:
            merged = _merge((s, e) for r, s, e in waiting.get(flavor, ()) if r > mine and s < e)
            unions[key] = (merged, [s for s, _ in merged])
        end = a.ended_at if a.ended_at is not None else now
        for lo, hi in _overlaps(*unions[key], a.granted_at, end):
            out.append(Piece("low_priority_holding", a.owner, flavor, a.gpus, lo, hi))
    return out


MICROSECOND = timedelta(microseconds=1)
MICROS_PER_HOUR = Decimal(3_600_000_000)
MICROS_PER_SECOND = Decimal(1_000_000)


class Pricer:
    """Splits an interval at the price changes of its flavor (``PriceSchedule``), fast: the
    effective dates of each flavor are looked up by bisection."""

    def __init__(self, book: PriceSchedule) -> None:
        self._book = book
        self._starts = {f: [d.effective_from for d in ds] for f, ds in book.by_flavor.items()}

    def parts(self, flavor: str, lo: datetime, hi: datetime) -> list[tuple[int, Decimal | None]]:
        """``[lo, hi)`` as (microseconds, price per GPU-hour) per price in force; one part
        with no price when the flavor has none at ``lo`` (as a bill would be refused)."""
        starts = self._starts.get(flavor, [])
        i = bisect_right(starts, lo)
        if i == 0:
            return [((hi - lo) // MICROSECOND, None)]
        dated = self._book.by_flavor[flavor]
        out: list[tuple[int, Decimal | None]] = []
        at = lo
        while i < len(starts) and starts[i] < hi:
            out.append(((starts[i] - at) // MICROSECOND, dated[i - 1].price.per_gpu_hour))
            at = starts[i]
            i += 1
        out.append(((hi - at) // MICROSECOND, dated[i - 1].price.per_gpu_hour))
        return out


@dataclass
class Tally:
    """The exact sum of pieces: GPU-microseconds per price (None: unpriced), wall time and
    how many. Money is rounded once, when read (``priced``)."""

    by_price: dict[Decimal | None, Decimal] = field(default_factory=dict)
    wall_micros: int = 0
    count: int = 0

    def add(
        self,
        piece: Piece,
        pricer: Pricer,
        start: datetime,
        end: datetime,
        now: datetime,
        counted: bool = True,
    ) -> bool:
        """Add the part of ``piece`` inside ``[start, min(end, now))``; False when none.
        ``counted``: False for a piece counted already (in the rollups' hours)."""
        lo, hi = max(piece.start, start), min(piece.end, end, now)
        if lo >= hi:
            return False
        if counted:
            self.count += 1
        self.wall_micros += (hi - lo) // MICROSECOND
        parts = pricer.parts(piece.flavor, lo, hi)
        if piece.figure != "input_bound":  # whole GPU-microseconds: integer sums, exact
            for micros, per_hour in parts:
                gpu_micros = Decimal(micros * piece.gpus)
                self.by_price[per_hour] = self.by_price.get(per_hour, ZERO) + gpu_micros
            return True
        with localcontext(prec=60):  # exact: the same sum however the pieces are split
            for micros, per_hour in parts:
                gpu_micros = Decimal(micros * piece.gpus) * piece.share
                self.by_price[per_hour] = self.by_price.get(per_hour, ZERO) + gpu_micros
        return True

    def merge(self, other: Tally) -> None:
        with localcontext(prec=60):
            for per_hour, micros in other.by_price.items():
                self.by_price[per_hour] = self.by_price.get(per_hour, ZERO) + micros
        self.wall_micros += other.wall_micros
        self.count += other.count

    def priced(self) -> Priced:
        with localcontext(prec=60):
            total = sum(self.by_price.values(), ZERO)
            cost = sum(
                (m * p / MICROS_PER_HOUR for p, m in self.by_price.items() if p is not None),
                ZERO,
            )
            unpriced = self.by_price.get(None, ZERO)
            return Priced(
                gpu_seconds=money(total / MICROS_PER_SECOND),
                cost=money(cost),
                unpriced_gpu_seconds=money(unpriced / MICROS_PER_SECOND),
                seconds=money(Decimal(self.wall_micros) / MICROS_PER_SECOND),
            )


def price(
    piece: Piece, book: PriceSchedule, start: datetime, end: datetime, now: datetime
) -> Priced | None:
    """One piece within ``[start, min(end, now))``, priced (module contract); None when
    nothing of it is inside."""
    tally = Tally()
    return tally.priced() if tally.add(piece, Pricer(book), start, end, now) else None


@dataclass(frozen=True)
class JobEnd:
    owner: Owner
    outcome: str
    ended_at: datetime


@dataclass(frozen=True)
class SuccessLine:
    day: datetime
    team: str | None
    queue: str | None
    ended: int
    succeeded: int
    failed: int
    cancelled: int

    @property
    def rate(self) -> Decimal:
        return (Decimal(self.succeeded) / Decimal(self.ended)).quantize(Decimal("0.0001"))


def success_lines(ends: Iterable[JobEnd]) -> list[SuccessLine]:
    """Jobs ended per UTC day, team and queue, by outcome; by day, then team, then queue."""
    counts: dict[tuple[datetime, str | None, str | None], dict[str, int]] = {}
    for end in ends:
        day = end.ended_at.replace(hour=0, minute=0, second=0, microsecond=0)
        by = counts.setdefault((day, end.owner.team, end.owner.queue), {})
        by[end.outcome] = by.get(end.outcome, 0) + 1
    return [
        SuccessLine(
            day,
            team,
            queue,
            sum(by.values()),
            by.get("succeeded", 0),
            by.get("failed", 0),
            by.get("cancelled", 0),
        )
        for (day, team, queue), by in sorted(
            counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2] or "")
        )
    ]
