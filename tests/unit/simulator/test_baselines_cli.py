"""``python -m bench.simulator.baselines`` end to end on a tiny synthetic trace."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.simulator.baselines import POLICIES, main
from bench.simulator.synthetic import random_jobs, write_trace


def test_every_policy_runs_and_the_record_names_no_absolute_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = random_jobs(random.Random(5), 60, teams=3, sizes=(1, 2, 4, 8, 16), mean_gap_s=30)
    trace = write_trace(tmp_path / "trace", jobs, {("Model", 1): 10.0}, gpus=16)
    out = tmp_path / "out.json"
    assert main(["--trace-dir", str(trace), "--out", str(out), "--grace-s", "30"]) == 0
    printed = capsys.readouterr().out
    assert "SRTF, true durations **(oracle)**" in printed
    doc = json.loads(out.read_text())
    (record,) = doc["traces"]
    assert list(record["policies"]) == list(POLICIES)
    assert all(r["unfinished"] == 0 for r in record["policies"].values())
    assert record["policies"]["srtf"]["scorecard"]["oracle"] is True
    assert not record["trace"].startswith("/") and doc["seed"] == 0
    text = out.read_text()
    assert '"/' not in text and " /" not in doc["command"]  # paths are repository-relative


def test_fifo_must_come_first() -> None:
    with pytest.raises(SystemExit):
        main(["--policies", "easy,fifo"])
