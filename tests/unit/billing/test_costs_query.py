"""A cost report's parameters: checked with the field and the reason, and planned over the
rollups without gaps or overlaps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard_platform.services.billing.buckets import floor, next_bucket
from trainyard_platform.services.billing.costs import CostQuery, pieces
from trainyard_platform.services.billing.costs_repository import CostLine
from trainyard_platform.services.billing.costs_schemas import cost_report, csv_text
from trainyard_platform.shared.http_errors import RequestInvalid

NOW = datetime(2026, 12, 3, 21, 17, tzinfo=UTC)


def parse(**given: object) -> CostQuery:
    args: dict[str, object] = {
        "start": None,
        "end": None,
        "granularity": None,
        "group_by": None,
        "filters": {},
        "now": NOW,
    }
    args.update(given)
    return CostQuery.parse(**args)  # type: ignore[arg-type]


def errors(**given: object) -> list[tuple[str, str]]:
    with pytest.raises(RequestInvalid) as caught:
        parse(**given)
    return [(e.field, e.message) for e in caught.value.errors]


def test_the_default_range_is_the_current_utc_month() -> None:
    query = parse()
    assert (query.start, query.end) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert parse(start="2026-02-10T05:00").end == datetime(2026, 3, 1, tzinfo=UTC)


def test_the_default_to_ends_the_month_of_from_in_its_own_offset() -> None:
    # December 1st at midnight in UTC+5 is 19:00 UTC on November 30th: the month asked for
    # is December there, not the five hours left of November in UTC.
    query = parse(start="2026-12-01T00:00:00+05:00")
    assert (query.start, query.end) == (
        datetime(2026, 11, 30, 19, tzinfo=UTC),
        datetime(2026, 12, 31, 19, tzinfo=UTC),
    )
    west = parse(start="2026-02-01T00:00:00-08:00")
    assert (west.start, west.end) == (
        datetime(2026, 2, 1, 8, tzinfo=UTC),
        datetime(2026, 3, 1, 8, tzinfo=UTC),
    )
    # Without an offset, or in UTC, the month is UTC's, as before.
    assert parse(start="2026-12-01T00:00:00").end == datetime(2027, 1, 1, tzinfo=UTC)
    assert parse(start="2026-12-31T23:00:00Z").end == datetime(2027, 1, 1, tzinfo=UTC)


def test_a_to_before_the_default_from_says_from_was_defaulted() -> None:
    # In December, a report of November asked for with only its end: the 'from' that 'to'
    # must follow was never given, so the answer says what it was and what to do.
    assert errors(end="2026-11-01T00:00Z") == [
        (
            "to",
            "must be after from (2026-12-01T00:00:00Z: not given, the start of the current "
            "UTC month; give from too)",
        )
    ]


EXAMPLES = "such as 2026-12-01T00:00:00Z, 2026-12-01 or 2026-12"


def test_a_month_alone_is_its_first_hour_and_the_default_to_its_end() -> None:
    # 'trainyard cost --from 2026-11' is November, as a team lead writes it.
    november = parse(start="2026-11")
    assert (november.start, november.end) == (
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
    )
    autumn = parse(start="2026-09", end="2026-12")
    assert (autumn.start, autumn.end) == (
        datetime(2026, 9, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert errors(start="2026-13") == [
        ("from", f"not an ISO 8601 date and time: '2026-13' ({EXAMPLES})")
    ]


def test_group_by_names_known_distinct_dimensions() -> None:
    assert parse(group_by="team, flavor").group_by == ("team", "flavor")
    assert errors(group_by="team,colour,team") == [
        ("group_by", "unknown dimension 'colour' (one of team, project, user, queue, flavor, job)"),
        ("group_by", "'team' given twice"),
    ]


def test_bad_ranges_name_the_field_and_the_reason() -> None:
    assert errors(start="2026-12-01T11:30:00+01:00") == [
        (
            "from",
            "must be a whole UTC hour (costs are kept per hour), got 2026-12-01T10:30:00+00:00",
        )
    ]
    assert errors(start="2026-12-01T10:00Z", end="2026-12-01T10:00Z") == [
        ("to", "must be after from (2026-12-01T10:00:00Z)")
    ]
    assert errors(start="2026-12-01", end="2027-01-02", granularity="hour") == [
        ("to", "a report by hour covers at most 31 days")
    ]
    assert errors(start="0001-01-01T00:00:00+05:00", end="9999-12-31T23:00Z") == [
        ("from", "out of range: '0001-01-01T00:00:00+05:00'"),
        ("to", "must be from 1970-01-01 to 9000-01-01, got 9999-12-31T23:00:00+00:00"),
    ]
    assert errors(start="yesterday", end="2026-13-01") == [
        ("from", f"not an ISO 8601 date and time: 'yesterday' ({EXAMPLES})"),
        ("to", f"not an ISO 8601 date and time: '2026-13-01' ({EXAMPLES})"),
    ]


def test_a_job_dimension_reads_the_ledger() -> None:
    assert parse(group_by="job").needs_ledger
    assert parse(filters={"job": "j1"}).needs_ledger
    assert not parse(group_by="team,user", filters={"team": "ml", "job": None}).needs_ledger


def test_pieces_use_the_coarsest_rollup_that_fits() -> None:
    start = datetime(2026, 10, 30, 22, tzinfo=UTC)
    end = datetime(2026, 12, 2, 3, tzinfo=UTC)
    assert pieces(start, end, "month") == [
        ("hour", start, datetime(2026, 10, 31, tzinfo=UTC)),
        ("day", datetime(2026, 10, 31, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)),
        ("month", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        ("day", datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC)),
        ("hour", datetime(2026, 12, 2, tzinfo=UTC), end),
    ]
    assert {unit for unit, _, _ in pieces(start, end, "hour")} == {"hour"}


@given(
    start_h=st.integers(0, 24 * 800),
    hours=st.integers(1, 24 * 400),
    coarsest=st.sampled_from(["hour", "day", "month"]),
)
def test_pieces_cover_the_range_exactly_once(start_h: int, hours: int, coarsest: str) -> None:
    start = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(hours=start_h)
    end = start + timedelta(hours=hours)
    ranges = pieces(start, end, coarsest)  # type: ignore[arg-type]
    assert ranges[0][1] == start and ranges[-1][2] == end
    for (unit, first, last), following in zip(ranges, [*ranges[1:], None], strict=True):
        assert first == floor(first, unit) and first < last
        if following is not None:
            assert following[1] == last and following[0] != unit
        at = first
        while at < last:  # whole buckets of the unit, up to the range's end
            at = next_bucket(at, unit)
        assert at == last


def test_csv_has_a_header_the_grouped_dimensions_and_exact_amounts() -> None:
    query = parse(group_by="team,flavor", granularity="day")
    day = datetime(2026, 12, 2, tzinfo=UTC)
    lines = [
        CostLine(
            day,
            ("ml", "a100"),
            "USD",
            Decimal("7200.000001"),
            Decimal("5.500001"),
            cpu_seconds=Decimal(14400),
            cpu_cost=Decimal("0.4"),
            memory_gib_seconds=Decimal(72000),
            memory_cost=Decimal("0.1"),
            unpriced_memory_gib_seconds=Decimal(36000),
        ),
        CostLine(day, ("ml", None), "USD", Decimal(1), Decimal("0.1"), cpu_seconds=Decimal(2)),
    ]
    report = cost_report(query, lines, limit=1)
    assert report.truncated
    (total,) = report.totals
    assert (total.currency, total.cost, total.gpu_cost) == (
        "USD",
        Decimal("5.600001"),
        Decimal("5.100001"),
    )
    assert (total.cpu_seconds, total.cpu_cost, total.memory_cost) == (
        14402,
        Decimal("0.4"),
        Decimal("0.1"),
    )
    assert report.rows[0].gpu_cost == Decimal("5.000001")
    assert csv_text(report).splitlines() == [
        "bucket,team,flavor,currency,gpu_seconds,cost,gpu_cost,cpu_seconds,cpu_cost,"
        "unpriced_cpu_seconds,memory_gib_seconds,memory_cost,unpriced_memory_gib_seconds",
        "2026-12-02T00:00:00Z,ml,a100,USD,7200.000001,5.500001,5.000001,14400,0.400000,0,"
        "72000,0.100000,36000",
    ]


def test_csv_cells_never_start_a_spreadsheet_formula() -> None:
    query = parse(group_by="project,user")
    lines = [CostLine(None, ("=HYPERLINK(1)", "-ada"), "USD", Decimal(1), Decimal(1))]
    assert csv_text(cost_report(query, lines, limit=10)).splitlines()[1] == (
        "'=HYPERLINK(1),'-ada,USD,1,1.000000,1.000000,0,0.000000,0,0,0.000000,0"
    )
