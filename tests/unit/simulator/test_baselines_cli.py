"""``python -m bench.simulator.baselines`` end to end on a tiny synthetic trace."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.simulator.baselines import POLICIES, main, ours_config, parse_args
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


def test_ours_knobs_reach_its_config_and_the_record(tmp_path: Path) -> None:
    args = parse_args(["--oversize-protection-s", "inf", "--reservations", "2", "--ageing-s", "60"])
    config = ours_config(args)
    assert (config.oversize_protection_s, config.reservations, config.ageing_s) == (
        float("inf"),
        2,
        60.0,
    )
    jobs = random_jobs(random.Random(5), 20, teams=2, sizes=(1, 2), mean_gap_s=30)
    trace = write_trace(tmp_path / "trace", jobs, {("Model", 1): 10.0}, gpus=8)
    out = tmp_path / "out.json"
    argv = ["--trace-dir", str(trace), "--out", str(out), "--policies", "fifo,ours"]
    assert main([*argv, "--size-weight", "4", "--oversize-protection-s", "inf"]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["ours_size_weight"] == 4.0
    assert settings["ours_oversize_protection_s"] is None  # infinity is not JSON


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--underestimate-share", "1.5"),
        ("--underestimate-share", "-0.1"),
        ("--ageing-s", "-1"),
        ("--limit", "0"),
        ("--limit", "-5"),  # (it used to drop the last 5 jobs)
        ("--seed", "x"),
        ("--grace-s", "-1"),
        ("--checkpoint-min", "x"),
        ("--min-pass-interval-s", "inf"),
        ("--max-preemptions", "-1"),
        ("--reservations", "1.5"),
        ("--las-thresholds-gpu-h", "a,b"),
        ("--las-thresholds-gpu-h", "10,1"),
        ("--las-promote-knob", "nan"),
    ],
)
def test_a_bad_value_is_refused_naming_its_option(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


def test_a_bad_trace_or_out_path_is_one_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--trace-dir", str(tmp_path / "missing"), "--policies", "fifo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m bench.simulator.baselines: error: --trace-dir: ")
    assert "no such trace folder" in err and "Traceback" not in err
    jobs = random_jobs(random.Random(5), 5, teams=1, sizes=(1,), mean_gap_s=30)
    trace = write_trace(tmp_path / "trace", jobs, {("Model", 1): 10.0}, gpus=8)
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out.json"  # below a file: cannot be made
    assert main(["--trace-dir", str(trace), "--policies", "fifo", "--out", str(out)]) == 2
    assert "error: --out: " in capsys.readouterr().err
