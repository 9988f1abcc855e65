"""How the CLI shows things: tables, durations, sparklines."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from trainyard.cli_render import duration, sparkline, table


def test_a_table_aligns_columns_without_trailing_spaces() -> None:
    assert table(("A", "BB"), [("xyz", 1), ("q", "")]).splitlines() == ["A    BB", "xyz  1", "q"]
    assert table(("A",), [], empty="nothing") == "nothing"


def test_durations() -> None:
    now = datetime(2024, 1, 2, tzinfo=UTC)
    assert duration(None, None) == "-"
    assert duration("2024-01-01T23:59:48+00:00", None, now) == "12s"
    assert duration("2024-01-01T23:56:55+00:00", None, now) == "3m05s"
    assert duration("2024-01-01T22:58:00+00:00", "2024-01-02T00:00:00+00:00") == "1h02m"
    assert duration("2023-12-30T00:00:00+00:00", None, now) == "3d00h"


def test_sparklines_scale_to_the_range_and_leave_gaps_for_nan() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([1.0, math.nan, 1.0]) == "▁ ▁"
    assert sparkline([]) == "" and sparkline([None, math.inf]) == ""
    assert len(sparkline(list(range(1000)), width=40)) == 40
