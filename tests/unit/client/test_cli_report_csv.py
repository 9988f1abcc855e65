"""``trainyard cost --csv`` and ``trainyard waste --csv``: billing's CSV written unchanged,
and, when billing left rows out of it past its row limit (``Trainyard-Truncated: true``:
a CSV holds no ``truncated`` of its own), a note on stderr saying so and what to do, so an
export cut short is never taken for the whole report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

BILLING = "http://billing.test"
BASE = ["--url", "http://submission.test", "--token", "ty_lead"]
CSV = "team,currency,gpu_seconds,cost\nml,USD,3600.000000,2.500000\n"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return routed_api(tmp_path, monkeypatch, {"TRAINYARD_BILLING_URL": BILLING})


@pytest.mark.parametrize("command", ["cost", "waste"])
def test_a_csv_cut_short_is_said_on_stderr(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    truncated = {"Trainyard-Truncated": "true", "Content-Type": "text/csv"}
    api["route"] = lambda r: httpx.Response(200, text=CSV, headers=truncated)
    assert cli.main([*BASE, command, "--csv", "--from", "2026-11-01T00:00:00Z"]) == Exit.OK
    out, err = capsys.readouterr()
    assert out == CSV
    assert "left rows out" in err and "--from/--to" in err
    (request,) = api["sent"]
    assert request.url.params["format"] == "csv"


@pytest.mark.parametrize("command", ["cost", "waste"])
def test_a_whole_csv_is_written_without_a_note(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    whole = {"Trainyard-Truncated": "false", "Content-Type": "text/csv"}
    api["route"] = lambda r: httpx.Response(200, text=CSV, headers=whole)
    assert cli.main([*BASE, command, "--csv"]) == Exit.OK
    assert capsys.readouterr() == (CSV, "")
