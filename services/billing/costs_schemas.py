"""HTTP schemas of billing's cost reports, their converters, and the CSV form.

Amounts are decimals, written as strings so no float rounding creeps in. A dimension a
report is not grouped by is null in its rows; ``project`` and ``queue`` are null too for
usage whose grant did not say them (recorded before billing kept them).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel, ConfigDict

from services.billing.costs import DIMENSIONS, CostQuery, Dimension
from services.billing.costs_repository import CostLine
from services.billing.ledger import LedgerEntry


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class CostRow(_Schema):
    bucket: datetime | None = None
    """The first instant (UTC) of the hour, day or month; null without a granularity."""
    team: str | None = None
    project: str | None = None
    user: str | None = None
    queue: str | None = None
    flavor: str | None = None
    job: str | None = None
    currency: str
    gpu_seconds: Decimal
    cost: Decimal


class CurrencyTotal(_Schema):
    currency: str
    gpu_seconds: Decimal
    cost: Decimal


class CostReport(_Schema):
    start: datetime
    """The report covers ``[start, end)``: the ``from`` and ``to`` asked for, or their
    defaults."""
    end: datetime
    granularity: str | None
    group_by: list[Dimension]
    filters: dict[Dimension, str]
    rows: list[CostRow]
    totals: list[CurrencyTotal]
    """Over every row, including those past ``limit``."""
    truncated: bool
    """Whether rows past ``limit`` were left out."""


def cost_report(query: CostQuery, lines: Sequence[CostLine], limit: int) -> CostReport:
    totals: dict[str, tuple[Decimal, Decimal]] = defaultdict(lambda: (Decimal(0), Decimal(0)))
    for line in lines:
        secs, cost = totals[line.currency]
        totals[line.currency] = (secs + line.gpu_seconds, cost + line.cost)
    rows = [
        CostRow(
            bucket=line.bucket,
            currency=line.currency,
            gpu_seconds=line.gpu_seconds,
            cost=line.cost,
            **dict(zip(query.group_by, line.values, strict=True)),
        )
        for line in lines[:limit]
    ]
    return CostReport(
        start=query.start,
        end=query.end,
        granularity=query.granularity,
        group_by=list(query.group_by),
        filters=dict(query.filters),
        rows=rows,
        totals=[
            CurrencyTotal(currency=c, gpu_seconds=s, cost=v) for c, (s, v) in sorted(totals.items())
        ],
        truncated=len(lines) > limit,
    )


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(name: str | None) -> str:
    """A name as a CSV cell: empty for None; a name a spreadsheet would read as a formula
    (team, user and project names are the users' own) starts with ``'``."""
    if name is None:
        return ""
    return f"'{name}" if name.startswith(_FORMULA_START) else name


def csv_text(report: CostReport) -> str:
    """The report's rows as CSV: a header, then ``bucket`` (when by granularity), the grouped
    dimensions, ``currency``, ``gpu_seconds``, ``cost``; empty cells for nulls, and a ``'``
    before a name that starts like a spreadsheet formula (``=``, ``+``, ``-``, ``@``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    dims = [d for d in DIMENSIONS if d in report.group_by]
    dims.sort(key=report.group_by.index)
    head = (["bucket"] if report.granularity else []) + dims
    writer.writerow([*head, "currency", "gpu_seconds", "cost"])
    for row in report.rows:
        bucket = [row.bucket.isoformat() if row.bucket else ""] if report.granularity else []
        values = [_cell(getattr(row, d)) for d in dims]
        writer.writerow([*bucket, *values, row.currency, str(row.gpu_seconds), str(row.cost)])
    return out.getvalue()


class PricedPart(_Schema):
    """The part of an allocation billed at one price."""

    started_at: datetime
    ended_at: datetime
    gpu_seconds: Decimal
    price_per_gpu_hour: Decimal
    cost: Decimal


class AllocationCost(_Schema):
    """One allocation (one node of one attempt) of a job, as billed now."""

    allocation_id: str
    attempt: int | None
    epoch: int | None
    node_id: str
    gpu_flavor: str
    gpus: int
    started_at: datetime
    ended_at: datetime
    outcome: str
    gpu_seconds: Decimal
    price_per_gpu_hour: Decimal
    currency: str
    cost: Decimal
    entries: int
    """Ledger entries behind this bill: its first charge, and a reversal and a new charge
    for each amendment (one of each per price in force, when a price changed during the
    allocation)."""
    prices: list[PricedPart]
    """The current bill per price in force, in time order (one part unless a price changed
    during the allocation); ``price_per_gpu_hour`` above is the last part's."""


class JobCost(_Schema):
    job_id: str
    team: str
    project: str | None
    user: str
    allocations: list[AllocationCost]
    totals: list[CurrencyTotal]


def job_cost(job_id: str, entries: Sequence[LedgerEntry]) -> JobCost:
    """A job's cost from its ledger entries (at least one), per allocation in the order
    they were first billed."""
    by_allocation: dict[str, list[LedgerEntry]] = {}
    for entry in entries:
        by_allocation.setdefault(entry.allocation_id, []).append(entry)
    allocations = []
    totals: dict[str, tuple[Decimal, Decimal]] = defaultdict(lambda: (Decimal(0), Decimal(0)))
    for allocation_id, mine in by_allocation.items():
        revision = max(e.revision for e in mine if e.kind == "charge")
        parts = sorted(
            (e for e in mine if e.kind == "charge" and e.revision == revision),
            key=lambda e: e.segment,
        )
        current = parts[-1]
        secs = sum((e.gpu_seconds for e in mine), Decimal(0))
        cost = sum((e.cost for e in mine), Decimal(0))
        s, c = totals[current.currency]
        totals[current.currency] = (s + secs, c + cost)
        allocations.append(
            AllocationCost(
                allocation_id=allocation_id,
                attempt=current.attempt,
                epoch=current.epoch,
                node_id=current.node_id,
                gpu_flavor=current.gpu_flavor,
                gpus=current.gpus,
                started_at=parts[0].started_at,
                ended_at=current.ended_at,
                outcome=current.outcome,
                gpu_seconds=secs,
                price_per_gpu_hour=current.price_per_gpu_hour,
                currency=current.currency,
                cost=cost,
                entries=len(mine),
                prices=[
                    PricedPart(
                        started_at=p.started_at,
                        ended_at=p.ended_at,
                        gpu_seconds=p.gpu_seconds,
                        price_per_gpu_hour=p.price_per_gpu_hour,
                        cost=p.cost,
                    )
                    for p in parts
                ],
            )
        )
    first = entries[0]
    return JobCost(
        job_id=job_id,
        team=first.team,
        project=first.project,
        user=first.user,
        allocations=allocations,
        totals=[
            CurrencyTotal(currency=cur, gpu_seconds=s, cost=c)
            for cur, (s, c) in sorted(totals.items())
        ],
    )
