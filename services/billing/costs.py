"""A cost report's question, checked, and how to answer it from the rollups: pure code.

Contract:
- ``CostQuery.parse(...)`` checks the raw parameters of ``GET /v1/costs`` (``from`` and
  ``to`` as given: ISO 8601 text, or a month alone, ``2026-12``, its first instant in UTC)
  and raises
  ``RequestInvalid`` naming each bad field and why: ``group_by`` is a comma-separated list
  of distinct dimensions (``DIMENSIONS``); ``from`` and ``to`` are whole UTC hours (a
  datetime without a zone is UTC) from 1970 to 9000, ``from < to``; ``from`` is by default the start of the
  current UTC month and ``to`` the end of ``from``'s month, read in ``from``'s own offset
  (UTC's without one); a range covers at most
  ``MAX_RANGE[granularity]`` (hour: 31 days, day: 366 days, month or none: 3660 days), or
  the tighter bound the caller gives (the waste report: ``WASTE_MAX_RANGE``).
- ``pieces(start, end, coarsest)`` covers ``[start, end)`` (whole hours) with rollup
  buckets, each as coarse as it can be without reaching past either end or past
  ``coarsest``: the hours up to the first whole day, the days up to the first whole month,
  the months, then days and hours again. Answered from those rollups, a report sums
  exactly the hour parts of every ledger entry inside the range.
- A query that groups or filters by job cannot use the rollups (they hold no job): it is
  answered from the ledger entries themselves, split as the rollups split them (``LedgerEntry.hour_parts``),
  so both paths give the same figures.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

from trainyard_platform.services.billing.buckets import UNITS, Unit, floor, next_bucket
from trainyard_platform.services.billing.domain import utc_text
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid

Dimension = Literal["team", "project", "user", "queue", "flavor", "job"]
DIMENSIONS: tuple[Dimension, ...] = ("team", "project", "user", "queue", "flavor", "job")
COLUMN: Mapping[Dimension, str] = {
    "team": "team",
    "project": "project",
    "user": "user_name",
    "queue": "queue",
    "flavor": "gpu_flavor",
    "job": "job_id",
}
"""The ledger's (and the rollups') column of each dimension."""
Granularity = Literal["hour", "day", "month"]
MAX_RANGE: Mapping[Unit | None, timedelta] = {
    "hour": timedelta(days=31),
    "day": timedelta(days=366),
    "month": timedelta(days=3660),
    None: timedelta(days=3660),
}
"""The longest range a report may cover at each granularity (a bound on its size)."""


WASTE_MAX_RANGE = timedelta(days=93)
"""The longest range of ``GET /v1/waste`` (a quarter): it reads every job whose waits fall
in the range, of every team, and computes queueing and holding from them when asked, so
its cost grows with the range, unlike a cost report read from monthly rollups."""


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""The range ``from`` and ``to`` must lie in (far beyond any bill, and within what dates
can hold once a month is added)."""


_MONTH = re.compile(r"(\d{4})-(\d{2})")
"""A calendar month alone (ISO 8601's ``YYYY-MM``): its first instant, in UTC."""
EXAMPLES = "such as 2026-12-01T00:00:00Z, 2026-12-01 or 2026-12"
"""What a report's bound may look like, said when one is not a date."""


def _instant(text: str) -> datetime:
    """``text`` as ISO 8601 (``datetime.fromisoformat``, or a month alone: its first
    instant, UTC); ValueError when it is neither."""
    month = _MONTH.fullmatch(text)
    if month is not None:
        return datetime(int(month[1]), int(month[2]), 1, tzinfo=UTC)
    return datetime.fromisoformat(text)


def _month_end_in_its_offset(text: str | None, begin: datetime) -> datetime:
    """The end of the month holding ``begin`` as ``from`` was written: in its own offset
    (``2026-12-01T00:00:00+05:00`` asks for December there, which ends at 19:00 UTC on
    December 31st, not for the 5 hours left of November in UTC), in UTC without one."""
    offset = _instant(text).utcoffset() if text is not None else None
    if not offset:
        return next_bucket(floor(begin, "month"), "month")
    local = begin.astimezone(timezone(offset))
    first = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return next_bucket(first, "month").astimezone(UTC)


def _whole_hour(name: str, text: str, errors: list[FieldError]) -> datetime:
    try:
        value = _instant(text)
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except ValueError:
        errors.append(
            FieldError(field=name, message=f"not an ISO 8601 date and time: {text!r} ({EXAMPLES})")
        )
        return EARLIEST
    except OverflowError:  # in UTC it falls outside what a datetime holds
        errors.append(FieldError(field=name, message=f"out of range: {text!r}"))
        return EARLIEST
    if not EARLIEST <= utc <= LATEST:
        errors.append(
            FieldError(
                field=name,
                message=f"must be from {EARLIEST.date()} to {LATEST.date()}, got {utc.isoformat()}",
            )
        )
        return EARLIEST  # refused: nothing may compute with it (a month after 9999 overflows)
    elif utc != floor(utc, "hour"):
        errors.append(
            FieldError(
                field=name,
                message=f"must be a whole UTC hour (costs are kept per hour), got {utc.isoformat()}",
            )
        )
    return utc


@dataclass(frozen=True)
class CostQuery:
    start: datetime
    end: datetime
    granularity: Granularity | None = None
    group_by: tuple[Dimension, ...] = ()
    filters: Mapping[Dimension, str] = field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        *,
        start: str | None,
        end: str | None,
        granularity: Granularity | None,
        group_by: str | None,
        filters: Mapping[Dimension, str | None],
        now: datetime,
        longest: timedelta | None = None,
    ) -> CostQuery:
        """The checked query (module contract); ``longest``: a bound of the range tighter
        than ``MAX_RANGE``'s, for a report whose cost grows with it."""
        errors: list[FieldError] = []
        dims: list[Dimension] = []
        for name in (group_by or "").split(",") if group_by else []:
            name = name.strip()
            if name not in DIMENSIONS:
                errors.append(
                    FieldError(
                        field="group_by",
                        message=f"unknown dimension {name!r} (one of {', '.join(DIMENSIONS)})",
                    )
                )
            elif name in dims:
                errors.append(FieldError(field="group_by", message=f"{name!r} given twice"))
            else:
                dims.append(name)
        begin = _whole_hour("from", start, errors) if start is not None else floor(now, "month")
        if end is not None:
            finish = _whole_hour("to", end, errors)
        elif errors:  # ``from`` refused: nothing may compute with it
            finish = next_bucket(floor(begin, "month"), "month")
        else:
            finish = _month_end_in_its_offset(start, begin)
        if not errors and finish <= begin:
            given = (
                ""
                if start is not None
                else (": not given, the start of the current UTC month; give from too")
            )
            errors.append(
                FieldError(field="to", message=f"must be after from ({utc_text(begin)}{given})")
            )
        longest = min(MAX_RANGE[granularity], longest or MAX_RANGE[granularity])
        if not errors and finish - begin > longest:
            errors.append(
                FieldError(
                    field="to",
                    message=f"a report by {granularity or 'range'} covers at most "
                    f"{longest.days} days",
                )
            )
        if errors:
            raise RequestInvalid(errors)
        chosen = {d: v for d, v in filters.items() if v is not None}
        return cls(begin, finish, granularity, tuple(dims), chosen)

    @property
    def needs_ledger(self) -> bool:
        """Whether the rollups cannot answer (they hold no job)."""
        return "job" in self.group_by or "job" in self.filters


def pieces(start: datetime, end: datetime, coarsest: Unit) -> list[tuple[Unit, datetime, datetime]]:
    """Rollup ranges ``(unit, first bucket, end)`` covering ``[start, end)`` (module contract),
    consecutive buckets of one unit merged."""
    allowed = UNITS[: UNITS.index(coarsest) + 1]
    ranges: list[tuple[Unit, datetime, datetime]] = []
    at = start
    while at < end:
        unit: Unit = "hour"
        for candidate in reversed(allowed):
            if floor(at, candidate) == at and next_bucket(at, candidate) <= end:
                unit = candidate
                break
        after = next_bucket(at, unit)
        if ranges and ranges[-1][0] == unit and ranges[-1][2] == at:
            ranges[-1] = (unit, ranges[-1][1], after)
        else:
            ranges.append((unit, at, after))
        at = after
    return ranges
