"""``trainyard waste``: what it asks billing, and how it prints the answer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import SecretStr

from trainyard.cli_base import CliSettings, Session
from trainyard.cli_waste import dimensions_arg, run_waste, waste_text
from trainyard.client import TrainyardClient

REPORT: dict[str, Any] = {
    "start": "2026-11-01T00:00:00Z",
    "end": "2026-12-01T00:00:00Z",
    "group_by": ["team", "job"],
    "filters": {},
    "idle_threshold_percent": "5",
    "rows": [
        {
            "team": "ml",
            "job": "abcdef0123",
            "figure": "queueing",
            "currency": "USD",
            "gpu_seconds": "7200.000000",
            "cost": "5.000000",
            "unpriced_gpu_seconds": "0",
            "seconds": "3600",
            "count": 1,
        },
        {
            "team": "ml",
            "job": "abcdef0123",
            "figure": "lost_work",
            "currency": "USD",
            "gpu_seconds": "3600.000000",
            "cost": "0",
            "unpriced_gpu_seconds": "3600.000000",
            "seconds": "3600",
            "count": 1,
        },
    ],
    "totals": [
        {
            "figure": "queueing",
            "currency": "USD",
            "gpu_seconds": "7200.000000",
            "cost": "5.000000",
            "unpriced_gpu_seconds": "0",
            "seconds": "3600",
            "count": 1,
        }
    ],
    "unallocated": [],
    "unattributed": [
        {
            "currency": "USD",
            "gpu_seconds": "0",
            "cost": "0",
            "ledger_gpu_seconds": "14400",
            "ledger_cost": "10",
        }
    ],
    "success": [
        {
            "day": "2026-11-02T00:00:00Z",
            "team": "ml",
            "queue": "ml-q",
            "ended": 4,
            "succeeded": 3,
            "failed": 1,
            "cancelled": 0,
            "success_rate": "0.7500",
        }
    ],
    "truncated": False,
}


class Billing:
    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def get(self, path: str, **params: Any) -> Any:
        self.asked.append((path, params))
        return REPORT


def test_waste_asks_billing_with_the_options_and_prints_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    billing = Billing()
    args = argparse.Namespace(
        by=["team", "job"],
        start="2026-11-01T00:00:00Z",
        end=None,
        team="ml",
        project=None,
        user=None,
        queue=None,
        flavor=None,
        job=None,
        csv=False,
        json=False,
    )
    settings = CliSettings(
        token=SecretStr("t"), config=tmp_path / "none.json", billing_url="http://billing"
    )
    session = Session(settings, args, lambda url, token: cast(TrainyardClient, billing))
    assert run_waste(session) == 0
    ((path, params),) = billing.asked
    assert path == "/v1/waste"
    assert params["group_by"] == "team,job" and params["team"] == "ml"
    assert params["from"] == "2026-11-01T00:00:00Z" and params["to"] is None
    out = capsys.readouterr().out
    assert "queueing" in out and "75.0 %" in out


def test_the_text_shows_rows_unpriced_time_unattributed_and_success() -> None:
    lines = waste_text(REPORT).splitlines()
    assert lines[0].startswith("waste ") and "under 5 % utilisation" in lines[0]
    assert lines[1].split() == ["TEAM", "JOB", "FIGURE", "GPU-HOURS", "COST", "WAIT-HOURS"]
    assert lines[2].split() == ["ml", "abcdef01", "queueing", "2.00", "5.000000", "USD", "1.00"]
    assert "(+1.00 GPU-h unpriced)" in lines[3]
    text = "\n".join(lines)
    assert "unattributed spend: 0.000000 USD (0.00 GPU-hours) of 10.000000 USD billed" in text
    assert "2026-11-02" in text and "75.0 %" in text
    empty = waste_text({**REPORT, "rows": [], "totals": [], "success": []})
    assert "no waste measured" in empty


def test_dimensions_are_checked() -> None:
    assert dimensions_arg("team, job") == ["team", "job"]
    for bad in ("colour", "team,team", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            dimensions_arg(bad)


def test_an_empty_waste_report_names_its_filters_and_how_to_check_them() -> None:
    empty = {**REPORT, "rows": [], "totals": [], "filters": {"team": "ml", "queue": "ml-qq"}}
    lines = waste_text(empty).splitlines()
    assert lines[1] == (
        "no waste measured to team ml, queue ml-qq: check the names (trainyard cost "
        "--by team,queue lists those billed)"
    )
