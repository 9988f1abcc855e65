"""Billing's pure rules: prices, GPU-seconds and cost, in exact decimals.

Contract:
- ``gpu_seconds`` is GPUs x the lease's duration, computed from the timedelta's integer parts
  (days, seconds, microseconds), so it is exact: no float ever enters the arithmetic.
- ``cost`` is gpu_seconds x price per GPU-hour / 3600, rounded half-up to 6 decimal places
  (``MONEY_PLACES``) once, at the end.
- ``PriceBook.price`` raises ``UnknownFlavor`` for a flavor it has no price for; billing
  rejects such a release (dead letter) rather than bill it at a made-up price.
- An allocation has one bill (``Usage``), made by its first release. ``Usage.amended_by``
  says how a later release of it changes that bill: only a lost allocation's late success
  does (it is billed for the time it really ran); anything else changes nothing.
- A bill is charged to its team, or to the platform (``charged_to``) when the attempt
  failed through the platform: the team then pays nothing for it.
- Every figure a report answers, in JSON and in CSV alike, is written by one function per
  kind: money by ``money`` (six places: the ``Money`` type of the report schemas), an instant
  by ``utc_text`` (UTC, ending in ``Z``: the ``Instant`` type).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Annotated, Any

from pydantic import AfterValidator, PlainSerializer

from trainyard_platform.shared.events.payloads import AllocationReleased, CostRecorded

MONEY_PLACES = Decimal("0.000001")
SECONDS_PER_HOUR = Decimal(3600)


class UnknownFlavor(LookupError):
    """No price for a GPU flavor."""


@dataclass(frozen=True)
class Price:
    flavor: str
    per_gpu_hour: Decimal
    currency: str

    def __post_init__(self) -> None:
        if not self.per_gpu_hour.is_finite() or self.per_gpu_hour < 0:
            raise ValueError(f"price of {self.flavor}: must be >= 0, got {self.per_gpu_hour}")


@dataclass(frozen=True)
class PriceBook:
    prices: Mapping[str, Price]

    @classmethod
    def from_settings(cls, prices: Mapping[str, float], currency: str) -> PriceBook:
        """Prices from settings; a float goes through its shortest text form (0.1 -> "0.1")."""
        return cls({f: Price(f, Decimal(str(p)), currency) for f, p in sorted(prices.items())})

    def price(self, flavor: str) -> Price:
        try:
            return self.prices[flavor]
        except KeyError:
            known = ", ".join(sorted(self.prices)) or "none"
            raise UnknownFlavor(
                f"gpu_flavor: no price for {flavor!r} in the price book (priced: {known})"
            ) from None


def duration_seconds(start: datetime, end: datetime) -> Decimal:
    """Exact seconds from ``start`` to ``end`` (microsecond resolution)."""
    delta = end - start
    whole = Decimal(delta.days * 86_400 + delta.seconds)
    return whole + Decimal(delta.microseconds).scaleb(-6)


def gpu_seconds(gpus: int, start: datetime, end: datetime) -> Decimal:
    if gpus < 0:
        raise ValueError(f"gpus: must be >= 0, got {gpus}")
    if end < start:
        raise ValueError(f"released_at {end.isoformat()} is before granted_at {start.isoformat()}")
    return Decimal(gpus) * duration_seconds(start, end)


_DECIMAL_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def decimal_text(value: object) -> object:
    """A money value a caller wrote, as a ``Decimal``: a JSON number, or a string as it
    reads (``"2.75"``, ``"-0"``, ``"1e3"``); ``ValueError`` for any other string.
    ``Decimal`` itself takes other scripts' digits (Arabic-Indic U+0665, full-width
    U+FF15), ``_`` between digits and surrounding spaces, so a stored amount could differ
    from the one shown. Anything else (``true``, ``null``) is left to the field's type."""
    if isinstance(value, str):
        if _DECIMAL_TEXT.fullmatch(value) is None:
            raise ValueError('must be a decimal number in ASCII digits, such as "2.75"')
        return Decimal(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))  # as pydantic reads a JSON number: its shortest text
    return value


def plain(value: Decimal) -> Decimal:
    """A price as PostgreSQL's ``numeric`` keeps it and every read answers it: the scale
    given, no exponent, no negative zero (``1e2`` is ``100``, ``-0`` is ``0``, ``0.031``
    stays ``0.031``), so a ``PUT``'s answer and the reads agree."""
    if value.as_tuple().exponent > 0:  # type: ignore[operator]
        value = value.quantize(Decimal(1))
    return value + 0


def money(value: Decimal) -> Decimal:
    """An amount as every amount is answered, stored and written (a price, a budget, a
    report's figure): six places, rounded half-up (as a bill is), no exponent, no negative
    zero (``1e3`` is ``1000.000000``, ``-0`` and ``0`` are ``0.000000``)."""
    with localcontext(prec=60):
        return value.quantize(MONEY_PLACES, rounding=ROUND_HALF_UP) + 0


def utc_text(at: datetime) -> str:
    """An instant as every report writes it, in JSON and in CSV: ISO 8601 in UTC, ending in
    ``Z`` (``2026-12-02T00:00:00Z``; microseconds when there are any)."""
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


Money = Annotated[Decimal, AfterValidator(money)]
"""A report's money figure: always ``money``'s six places, whatever the sum it came from."""
Instant = Annotated[datetime, PlainSerializer(utc_text, return_type=str, when_used="json")]
"""A report's instant: written by ``utc_text`` in JSON, as the CSV writes it."""


def cost(gpu_secs: Decimal, per_gpu_hour: Decimal) -> Decimal:
    # Enough precision that the division is never rounded before the one money rounding.
    with localcontext(prec=60):
        exact = gpu_secs * per_gpu_hour / SECONDS_PER_HOUR
        return exact.quantize(MONEY_PLACES, rounding=ROUND_HALF_UP)


@dataclass(frozen=True, kw_only=True)
class CpuMemoryLines:
    """The CPU and memory lines of an amount billed (a ``Segment``, a ledger entry): the
    unit-seconds, the price per unit-hour charged (None: the flavor had no price for it,
    charged 0) and the cost of each. 0 for a job that declared none."""

    cpu_seconds: Decimal = Decimal(0)
    price_per_cpu_hour: Decimal | None = None
    cpu_cost: Decimal = Decimal(0)
    memory_gib_seconds: Decimal = Decimal(0)
    price_per_memory_gib_hour: Decimal | None = None
    memory_cost: Decimal = Decimal(0)

    def cpu_memory_lines(self) -> dict[str, Any]:
        """The lines as keyword arguments (to copy them onto another ``CpuMemoryLines``)."""
        return {f.name: getattr(self, f.name) for f in fields(CpuMemoryLines)}


@dataclass(frozen=True)
class Segment(CpuMemoryLines):
    """The part of an allocation's interval billed at one set of prices
    (``prices.PriceSchedule``): its GPU line and, when the job declared them, its CPU and
    memory lines. ``cost`` is the whole segment's (the sum of its lines' costs)."""

    started_at: datetime
    ended_at: datetime
    gpu_seconds: Decimal
    price_per_gpu_hour: Decimal
    currency: str
    cost: Decimal

    @property
    def gpu_cost(self) -> Decimal:
        return self.cost - self.cpu_cost - self.memory_cost


@dataclass(frozen=True)
class Usage:
    """One ended allocation, priced: a row of the usage ledger. ``cost`` is the whole bill
    (GPUs, and the ``cpus`` and ``memory_gib`` the allocation held, where priced)."""

    allocation_id: str
    job_id: str
    team: str
    user: str
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
    segments: tuple[Segment, ...] = ()
    """The bill per price in force, when it was priced by a dated price book; empty: one
    segment, the whole interval at ``price_per_gpu_hour`` (``parts``)."""
    cpus: int = 0
    """CPUs the allocation held (its GPUs x the job's ``cpus_per_gpu``)."""
    memory_gib: int = 0
    """Memory (GiB) the allocation held."""
    charged_to: str = "team"
    """``team``, or ``platform`` for an attempt that failed through the platform: its team
    is charged nothing (no ledger charge) and its bill says 0 (``to_event``)."""

    @property
    def parts(self) -> tuple[Segment, ...]:
        """The bill's segments in time order (at least one); their sums are the bill."""
        if self.segments:
            return self.segments
        whole = Segment(
            self.started_at,
            self.ended_at,
            self.gpu_seconds,
            self.price_per_gpu_hour,
            self.currency,
            self.cost,
        )
        return (whole,)

    @classmethod
    def from_segments(
        cls,
        released: AllocationReleased,
        segments: Sequence[Segment],
        cpus: int = 0,
        memory_gib: int = 0,
    ) -> Usage:
        """A released allocation (holding ``cpus`` and ``memory_gib`` besides its GPUs)
        priced in ``segments`` (at least one, in time order, of one currency): the bill is
        their sum; its ``price_per_gpu_hour`` is the first segment's (the price in force at
        the grant)."""
        first = segments[0]
        return cls(
            allocation_id=released.allocation_id,
            job_id=released.job_id,
            team=released.team,
            user=released.user,
            node_id=released.node_id,
            gpu_flavor=released.gpu_flavor,
            gpus=released.gpus,
            started_at=released.granted_at,
            ended_at=released.released_at,
            outcome=released.outcome,
            gpu_seconds=sum((s.gpu_seconds for s in segments), Decimal(0)),
            price_per_gpu_hour=first.price_per_gpu_hour,
            currency=first.currency,
            cost=sum((s.cost for s in segments), Decimal(0)),
            segments=tuple(segments),
            cpus=cpus,
            memory_gib=memory_gib,
        )

    @classmethod
    def from_release(cls, released: AllocationReleased, price: Price) -> Usage:
        """Price a released allocation; ValueError when its times or GPUs are impossible."""
        secs = gpu_seconds(released.gpus, released.granted_at, released.released_at)
        return cls(
            allocation_id=released.allocation_id,
            job_id=released.job_id,
            team=released.team,
            user=released.user,
            node_id=released.node_id,
            gpu_flavor=released.gpu_flavor,
            gpus=released.gpus,
            started_at=released.granted_at,
            ended_at=released.released_at,
            outcome=released.outcome,
            gpu_seconds=secs,
            price_per_gpu_hour=price.per_gpu_hour,
            currency=price.currency,
            cost=cost(secs, price.per_gpu_hour),
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Usage:
        """A row of the usage ledger."""
        return cls(
            allocation_id=row["allocation_id"],
            job_id=row["job_id"],
            team=row["team"],
            user=row["user_name"],
            node_id=row["node_id"],
            gpu_flavor=row["gpu_flavor"],
            gpus=row["gpus"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            outcome=row["outcome"],
            gpu_seconds=Decimal(row["gpu_seconds"]),
            price_per_gpu_hour=Decimal(row["price_per_gpu_hour"]),
            currency=row["currency"],
            cost=Decimal(row["cost"]),
            cpus=row.get("cpus", 0),
            memory_gib=row.get("memory_gib", 0),
            charged_to=row.get("charged_to", "team"),
        )

    def amended_by(self, released: AllocationReleased) -> Usage | None:
        """This bill as a later release of its allocation changes it, or None (unchanged).

        One allocation, one bill. The scheduler bills a lost node's allocation up to the
        node's last heartbeat; when that allocation's runner later reports that the job
        succeeded, the scheduler releases it again with outcome ``succeeded`` and its real end.
        Only that changes a bill: its outcome becomes ``succeeded`` and it covers the time the
        allocation really ran, to the later of both ends (a bill is never cut), at the price
        it was first billed at. Any other repeated release is already billed."""
        if self.outcome != "lost" or released.outcome != "succeeded":
            return None
        ended_at = max(self.ended_at, released.released_at)
        secs = gpu_seconds(self.gpus, self.started_at, ended_at)
        return replace(
            self,
            ended_at=ended_at,
            outcome="succeeded",
            gpu_seconds=secs,
            cost=cost(secs, self.price_per_gpu_hour),
        )

    def repriced(self, segments: Sequence[Segment]) -> Usage:
        """This bill over the same interval, priced in ``segments`` (at least one, in time
        order, covering it): the amounts are their sums."""
        return replace(
            self,
            gpu_seconds=sum((s.gpu_seconds for s in segments), Decimal(0)),
            price_per_gpu_hour=segments[0].price_per_gpu_hour,
            currency=segments[0].currency,
            cost=sum((s.cost for s in segments), Decimal(0)),
            segments=tuple(segments),
        )

    def to_event(self, revision: int = 0) -> CostRecorded:
        """The wire event: what the team is charged (floats there; the ledger keeps the
        exact decimals), 0 GPU-seconds and 0 cost for a bill charged to the platform;
        ``revision`` is the bill's (0 first, higher for each correction of it)."""
        team_pays = self.charged_to == "team"
        return CostRecorded(
            allocation_id=self.allocation_id,
            job_id=self.job_id,
            team=self.team,
            user=self.user,
            gpu_flavor=self.gpu_flavor,
            gpus=self.gpus,
            started_at=self.started_at,
            ended_at=self.ended_at,
            gpu_seconds=float(self.gpu_seconds) if team_pays else 0.0,
            price_per_gpu_hour=float(self.price_per_gpu_hour),
            cost=float(self.cost) if team_pays else 0.0,
            currency=self.currency,
            revision=revision,
        )
