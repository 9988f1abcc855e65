"""Every report writes a money figure and an instant the same way, in JSON and in CSV:
money with six decimal places, instants in UTC ending in ``Z``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from trainyard_platform.services.billing.costs import CostQuery
from trainyard_platform.services.billing.costs_repository import CostLine
from trainyard_platform.services.billing.costs_schemas import cost_report, csv_text
from trainyard_platform.services.billing.domain import money, utc_text
from trainyard_platform.services.billing.prices import PriceSchedule
from trainyard_platform.services.billing.waste_schemas import waste_report

NOW = datetime(2026, 12, 3, 21, 17, tzinfo=UTC)


def _query(**given: object) -> CostQuery:
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


def test_money_has_six_places_and_no_negative_zero() -> None:
    assert str(money(Decimal(0))) == "0.000000"
    assert str(money(Decimal("-0"))) == "0.000000"
    assert str(money(Decimal("1e3"))) == "1000.000000"
    assert str(money(Decimal("0.0000005"))) == "0.000001"  # half up, as every bill rounds


def test_utc_text_is_what_the_json_reports_write() -> None:
    assert utc_text(datetime(2026, 12, 2, tzinfo=UTC)) == "2026-12-02T00:00:00Z"
    assert utc_text(datetime(2026, 12, 2, 1, 2, 3, 4, tzinfo=UTC)) == "2026-12-02T01:02:03.000004Z"


def test_waste_report_writes_unattributed_money_with_six_places_as_every_figure() -> None:
    query = _query(group_by="team")
    owned = CostLine(None, ("ml", "vision", "ada"), "USD", Decimal(3600), Decimal("2.5"))
    report = waste_report(
        query,
        pieces=[],
        unallocated=[],
        ledger=[owned],
        jobless=[],
        success=[],
        book=PriceSchedule({}, "USD"),
        currency="USD",
        now=NOW,
        limit=10,
    )
    (unattributed,) = json.loads(report.model_dump_json())["unattributed"]
    assert unattributed["cost"] == "0.000000"
    assert unattributed["ledger_cost"] == "2.500000"


def test_cost_csv_writes_the_json_s_instants_and_money() -> None:
    query = _query(group_by="team", granularity="day")
    day = datetime(2026, 12, 2, tzinfo=UTC)
    report = cost_report(
        query,
        [CostLine(day, ("ml",), "USD", Decimal(7200), Decimal("0.4"), cpu_cost=Decimal("0.4"))],
        limit=10,
    )
    (row,) = json.loads(report.model_dump_json())["rows"]
    header, line = csv_text(report).splitlines()
    cells = dict(zip(header.split(","), line.split(","), strict=True))
    assert cells["bucket"] == row["bucket"] == "2026-12-02T00:00:00Z"
    assert cells["cost"] == row["cost"] == "0.400000"
    assert cells["cpu_cost"] == row["cpu_cost"] == "0.400000"
    assert cells["gpu_cost"] == row["gpu_cost"] == "0.000000"
    assert cells["memory_cost"] == row["memory_cost"] == "0.000000"
