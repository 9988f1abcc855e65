"""HTTP schemas of ``GET /v1/waste``, the report's assembly from priced pieces, and its CSV.

Amounts are decimal strings; a dimension the report is not grouped by is null in its rows.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel, ConfigDict

from trainyard_platform.services.billing.costs import DIMENSIONS, CostQuery, Dimension
from trainyard_platform.services.billing.costs_repository import CostLine
from trainyard_platform.services.billing.costs_schemas import _cell
from trainyard_platform.services.billing.domain import Instant, Money, money
from trainyard_platform.services.billing.prices import PriceSchedule
from trainyard_platform.services.billing.waste import (
    FIGURES,
    IDLE_PERCENT,
    Figure,
    Piece,
    Pricer,
    SuccessLine,
    Tally,
)


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class WasteRow(_Schema):
    team: str | None = None
    project: str | None = None
    user: str | None = None
    queue: str | None = None
    flavor: str | None = None
    job: str | None = None
    figure: Figure
    currency: str
    gpu_seconds: Decimal
    """GPU-seconds of the figure inside the range."""
    cost: Money
    """Their cost by the price book (0 for GPU-seconds of a flavor without a price)."""
    unpriced_gpu_seconds: Decimal
    """GPU-seconds of a flavor the price book has no price for (not in ``cost``)."""
    seconds: Decimal
    """Wall time of the figure's intervals (for ``queueing``: the time jobs waited)."""
    count: int
    """How many intervals: allocations, or waits for ``queueing``."""


class FigureTotal(_Schema):
    figure: Figure
    currency: str
    gpu_seconds: Decimal
    cost: Money
    unpriced_gpu_seconds: Decimal
    seconds: Decimal
    count: int


class Unattributed(_Schema):
    """Figure 6: ledger spend in the range without a team, project, user or job (must be 0),
    beside everything the ledger holds in the range."""

    currency: str
    gpu_seconds: Decimal
    cost: Money
    ledger_gpu_seconds: Decimal
    ledger_cost: Money


class SuccessRow(_Schema):
    day: Instant
    team: str | None
    queue: str | None
    ended: int
    succeeded: int
    failed: int
    cancelled: int
    success_rate: Decimal
    """succeeded / ended, to 4 places."""


class WasteReport(_Schema):
    start: Instant
    end: Instant
    group_by: list[Dimension]
    filters: dict[Dimension, str]
    idle_threshold_percent: Decimal
    rows: list[WasteRow]
    """Per group and figure, most expensive first."""
    totals: list[FigureTotal]
    """Per figure, over every row (including those past ``limit``)."""
    unallocated: list[WasteRow]
    """Figure 1's second half, ``unallocated_gpus`` per flavor: GPUs no allocation held while
    a job of their flavor waited. They belong to no team: for operators only (empty for
    users)."""
    unattributed: list[Unattributed]
    success: list[SuccessRow]
    truncated: bool


Key = tuple[tuple[str | None, ...], Figure]


def _fold(
    pieces: Iterable[Piece],
    query: CostQuery,
    pricer: Pricer,
    now: datetime,
    group_by: Sequence[Dimension],
    since: datetime | None = None,
    rolled: Mapping[Key, Tally] | None = None,
) -> dict[Key, Tally]:
    """Pieces summed per group and figure within the query's range, or only from ``since``
    on when the hours before it are ``rolled`` up already (a piece they hold is counted
    there)."""
    sums: dict[Key, Tally] = {}
    for key, rolled_up in (rolled or {}).items():
        sums.setdefault(key, Tally()).merge(rolled_up)
    start = query.start if since is None else since
    filters = list(query.filters.items())
    for piece in pieces:
        owner = piece.owner
        if any(owner.value(d) != v for d, v in filters):
            continue
        key = (tuple(owner.value(d) for d in group_by), piece.figure)
        tally = sums.get(key)
        if tally is None:
            tally = sums[key] = Tally()
        counted = start == query.start or piece.start >= start
        tally.add(piece, pricer, start, query.end, now, counted)
    return {k: t for k, t in sums.items() if t.count}


def _rows(sums: dict[Key, Tally], group_by: Sequence[Dimension], currency: str) -> list[WasteRow]:
    rows = []
    for (values, figure), tally in sums.items():
        p = tally.priced()
        rows.append(
            WasteRow(
                figure=figure,
                currency=currency,
                gpu_seconds=p.gpu_seconds,
                cost=p.cost,
                unpriced_gpu_seconds=p.unpriced_gpu_seconds,
                seconds=p.seconds,
                count=tally.count,
                **dict(zip(group_by, values, strict=True)),
            )
        )
    rows.sort(
        key=lambda r: (
            -r.cost,
            -r.gpu_seconds,
            FIGURES.index(r.figure),
            tuple(getattr(r, d) or "" for d in group_by),
        )
    )
    return rows


def waste_report(
    query: CostQuery,
    *,
    pieces: Iterable[Piece],
    unallocated: Iterable[Piece],
    ledger: Sequence[CostLine],
    jobless: Sequence[CostLine],
    success: Sequence[SuccessLine],
    book: PriceSchedule,
    currency: str,
    now: datetime,
    limit: int,
    rolled: Mapping[Key, Tally] | None = None,
    edge: Iterable[Piece] = (),
    since: datetime | None = None,
) -> WasteReport:
    """The report of ``query`` from its pieces (already of the caller's scope), the ledger's
    lines grouped by team, project and user (``ledger``: all; ``jobless``: those of entries
    with an empty job id), and the success lines. With ``rolled`` (the rollups' tallies of
    ``[query.start, since)``), ``edge`` holds the rolled-up figures' pieces, summed only
    from ``since`` on."""
    pricer = Pricer(book)
    sums = _fold(pieces, query, pricer, now, query.group_by)
    if rolled is not None:
        for key, tally in _fold(edge, query, pricer, now, query.group_by, since, rolled).items():
            sums.setdefault(key, Tally()).merge(tally)
    rows = _rows(sums, query.group_by, currency)
    totals: dict[Figure, Tally] = {}
    for (_, figure), tally in sums.items():
        totals.setdefault(figure, Tally()).merge(tally)
    by_flavor: tuple[Dimension, ...] = ("flavor",)
    spare = _rows(_fold(unallocated, query, pricer, now, by_flavor), by_flavor, currency)
    ledger_sums: dict[str, list[Decimal]] = {}
    for line in ledger:
        s = ledger_sums.setdefault(line.currency, [Decimal(0)] * 4)
        s[2] += line.gpu_seconds
        s[3] += line.cost
        if any(v is None or v == "" for v in line.values):
            s[0] += line.gpu_seconds
            s[1] += line.cost
    for line in jobless:  # unowned by their job; those unowned otherwise are counted above
        if not any(v is None or v == "" for v in line.values):
            s = ledger_sums.setdefault(line.currency, [Decimal(0)] * 4)
            s[0] += line.gpu_seconds
            s[1] += line.cost
    return WasteReport(
        start=query.start,
        end=query.end,
        group_by=list(query.group_by),
        filters=dict(query.filters),
        idle_threshold_percent=IDLE_PERCENT,
        rows=rows[:limit],
        totals=[
            FigureTotal(
                figure=f,
                currency=currency,
                gpu_seconds=p.gpu_seconds,
                cost=p.cost,
                unpriced_gpu_seconds=p.unpriced_gpu_seconds,
                seconds=p.seconds,
                count=t.count,
            )
            for f, t in sorted(totals.items(), key=lambda ft: FIGURES.index(ft[0]))
            for p in [t.priced()]
        ],
        unallocated=spare,
        unattributed=[
            Unattributed(
                currency=cur,
                gpu_seconds=money(s[0]),  # six places, as every figure's GPU-seconds
                cost=s[1],
                ledger_gpu_seconds=money(s[2]),
                ledger_cost=s[3],
            )
            for cur, s in sorted(ledger_sums.items())
        ],
        success=[
            SuccessRow(
                day=line.day,
                team=line.team,
                queue=line.queue,
                ended=line.ended,
                succeeded=line.succeeded,
                failed=line.failed,
                cancelled=line.cancelled,
                success_rate=line.rate,
            )
            for line in success
        ],
        truncated=len(rows) > limit,
    )


def waste_csv(report: WasteReport) -> str:
    """The report's rows as CSV: a header, then the grouped dimensions (``group_by`` order),
    ``figure``, ``currency``, ``gpu_seconds``, ``cost``, ``unpriced_gpu_seconds``,
    ``seconds``, ``count``; names that start like a formula get a leading ``'``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    dims = [d for d in DIMENSIONS if d in report.group_by]
    dims.sort(key=report.group_by.index)
    tail = ["figure", "currency", "gpu_seconds", "cost", "unpriced_gpu_seconds", "seconds"]
    writer.writerow([*dims, *tail, "count"])
    for row in report.rows:
        writer.writerow(
            [
                *(_cell(getattr(row, d)) for d in dims),
                row.figure,
                row.currency,
                str(row.gpu_seconds),
                str(row.cost),
                str(row.unpriced_gpu_seconds),
                str(row.seconds),
                row.count,
            ]
        )
    return out.getvalue()
