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

from trainyard_platform.services.billing.costs import DIMENSIONS, CostQuery, Dimension
from trainyard_platform.services.billing.costs_repository import CostLine
from trainyard_platform.services.billing.domain import Instant, Money, money, utc_text
from trainyard_platform.services.billing.ledger import AMOUNTS, LedgerEntry


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


_ZERO = money(Decimal(0))


class _Lines(_Schema):
    """The lines of an amount besides its GPU-seconds and whole ``cost``: the GPU cost, and
    the CPU and memory time and cost (0 for jobs that declared none). ``unpriced_``: the
    part of that time charged 0 because the flavor had no CPU (memory) price then."""

    gpu_cost: Money = _ZERO
    cpu_seconds: Decimal = Decimal(0)
    cpu_cost: Money = _ZERO
    unpriced_cpu_seconds: Decimal = Decimal(0)
    memory_gib_seconds: Decimal = Decimal(0)
    memory_cost: Money = _ZERO
    unpriced_memory_gib_seconds: Decimal = Decimal(0)


LINES = tuple(_Lines.model_fields)
"""The line fields, in the order the CSV writes them after ``cost``."""


def _lines(amounts: Sequence[Decimal]) -> dict[str, Decimal]:
    """``ledger.AMOUNTS`` as the fields of a row: ``gpu_seconds``, ``cost`` (the whole)
    and the ``_Lines``."""
    named = dict(zip(AMOUNTS, amounts, strict=True))
    gpu_cost = named["cost"] - named["cpu_cost"] - named["memory_cost"]
    return {**named, "gpu_cost": gpu_cost}


class CostRow(_Lines):
    bucket: Instant | None = None
    """The first instant (UTC) of the hour, day or month; null without a granularity."""
    team: str | None = None
    project: str | None = None
    user: str | None = None
    queue: str | None = None
    flavor: str | None = None
    job: str | None = None
    currency: str
    gpu_seconds: Decimal
    cost: Money
    """The whole: GPUs, CPUs and memory (``gpu_cost`` + ``cpu_cost`` + ``memory_cost``)."""


class CurrencyTotal(_Lines):
    currency: str
    gpu_seconds: Decimal
    cost: Money


class CostReport(_Schema):
    start: Instant
    """The report covers ``[start, end)``: the ``from`` and ``to`` asked for, or their
    defaults."""
    end: Instant
    granularity: str | None
    group_by: list[Dimension]
    filters: dict[Dimension, str]
    rows: list[CostRow]
    totals: list[CurrencyTotal]
    """Over every row, including those past ``limit``."""
    truncated: bool
    """Whether rows past ``limit`` were left out."""


def cost_report(query: CostQuery, lines: Sequence[CostLine], limit: int) -> CostReport:
    zero = tuple(Decimal(0) for _ in AMOUNTS)
    totals: dict[str, tuple[Decimal, ...]] = defaultdict(lambda: zero)
    for line in lines:
        held = totals[line.currency]
        totals[line.currency] = tuple(h + a for h, a in zip(held, line.amounts, strict=True))
    rows = [
        CostRow(
            bucket=line.bucket,
            currency=line.currency,
            **_lines(line.amounts),
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
            CurrencyTotal(currency=c, **_lines(amounts)) for c, amounts in sorted(totals.items())
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
    """The report's rows as CSV: a header, then ``bucket`` (when by granularity, written as
    the JSON writes it: ``utc_text``), the grouped dimensions, ``currency``, ``gpu_seconds``,
    ``cost`` and the ``LINES`` (GPU cost, CPU and memory; money with six places, as in the
    JSON); empty cells for nulls, and a ``'``
    before a name that starts like a spreadsheet formula (``=``, ``+``, ``-``, ``@``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    dims = [d for d in DIMENSIONS if d in report.group_by]
    dims.sort(key=report.group_by.index)
    head = (["bucket"] if report.granularity else []) + dims
    writer.writerow([*head, "currency", "gpu_seconds", "cost", *LINES])
    for row in report.rows:
        bucket = [utc_text(row.bucket) if row.bucket else ""] if report.granularity else []
        values = [_cell(getattr(row, d)) for d in dims]
        amounts = [str(row.gpu_seconds), str(row.cost), *(str(getattr(row, f)) for f in LINES)]
        writer.writerow([*bucket, *values, row.currency, *amounts])
    return out.getvalue()


class PricedPart(_Schema):
    """The part of an allocation billed at one set of prices; a CPU (memory) price of null
    is time charged 0, the flavor having no price for it."""

    started_at: datetime
    ended_at: datetime
    gpu_seconds: Decimal
    price_per_gpu_hour: Decimal
    cost: Decimal
    """The whole part: GPUs, CPUs and memory."""
    cpu_seconds: Decimal = Decimal(0)
    price_per_cpu_hour: Decimal | None = None
    cpu_cost: Decimal = Decimal(0)
    memory_gib_seconds: Decimal = Decimal(0)
    price_per_memory_gib_hour: Decimal | None = None
    memory_cost: Decimal = Decimal(0)


class AllocationCost(_Lines):
    """One allocation (one node of one attempt) of a job, as billed now; ``cost`` is the
    whole (GPUs, ``cpus`` and ``memory_gib``)."""

    allocation_id: str
    attempt: int | None
    epoch: int | None
    node_id: str
    gpu_flavor: str
    gpus: int
    cpus: int = 0
    memory_gib: int = 0
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
    zero = tuple(Decimal(0) for _ in AMOUNTS)
    totals: dict[str, tuple[Decimal, ...]] = defaultdict(lambda: zero)
    for allocation_id, mine in by_allocation.items():
        revision = max(e.revision for e in mine if e.kind == "charge")
        parts = sorted(
            (e for e in mine if e.kind == "charge" and e.revision == revision),
            key=lambda e: e.segment,
        )
        current = parts[-1]
        sums = zero
        for e in mine:
            sums = tuple(s + a for s, a in zip(sums, e.amounts, strict=True))
        held = totals[current.currency]
        totals[current.currency] = tuple(h + a for h, a in zip(held, sums, strict=True))
        lines = _lines(sums)
        allocations.append(
            AllocationCost(
                allocation_id=allocation_id,
                attempt=current.attempt,
                epoch=current.epoch,
                node_id=current.node_id,
                gpu_flavor=current.gpu_flavor,
                gpus=current.gpus,
                cpus=current.cpus,
                memory_gib=current.memory_gib,
                started_at=parts[0].started_at,
                ended_at=current.ended_at,
                outcome=current.outcome,
                price_per_gpu_hour=current.price_per_gpu_hour,
                currency=current.currency,
                entries=len(mine),
                **lines,
                prices=[
                    PricedPart(
                        started_at=p.started_at,
                        ended_at=p.ended_at,
                        gpu_seconds=p.gpu_seconds,
                        price_per_gpu_hour=p.price_per_gpu_hour,
                        cost=p.cost,
                        **p.cpu_memory_lines(),
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
            CurrencyTotal(currency=cur, **_lines(amounts))
            for cur, amounts in sorted(totals.items())
        ],
    )
