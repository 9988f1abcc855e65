"""The trace loader on tiny traces written to tmp_path (never the shared trace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.simulator.synthetic import SyntheticJob, write_trace
from bench.simulator.trace import TraceError, cluster_gpus, load_trace, throughput

RATES = {("Model (batch size 8)", 1): 2.0, ("Model (batch size 8)", 8): 10.0, ("Solo", 1): 4.0}


def _trace(tmp_path: Path) -> Path:
    jobs = [
        SyntheticJob("beta", "Model (batch size 8)", 100, 5.0, 1),
        SyntheticJob("alpha", "Model (batch size 8)", 1000, 0.0, 8),
        SyntheticJob("alpha", "Solo", 400, 5.0, 1),
        SyntheticJob("beta", "Model (batch size 8)", 300, 9.0, 16),
        SyntheticJob("alpha", "Solo", 400, 12.0, 4),
    ]
    return write_trace(tmp_path / "trace", jobs, RATES, gpus=20)


def test_teams_come_from_file_names_and_jobs_are_in_arrival_order(tmp_path: Path) -> None:
    jobs = load_trace(_trace(tmp_path))
    assert [(j.team, j.arrival) for j in jobs] == [
        ("alpha", 0.0),
        ("alpha", 5.0),  # equal arrivals: team name, then line, decide
        ("beta", 5.0),
        ("beta", 9.0),
        ("alpha", 12.0),
    ]
    assert [j.job_id for j in jobs] == [
        "alpha-00001",
        "alpha-00002",
        "beta-00001",
        "beta-00002",
        "alpha-00003",
    ]
    assert cluster_gpus(tmp_path / "trace") == 20


def test_duration_is_steps_over_the_v100_throughput(tmp_path: Path) -> None:
    by_id = {j.job_id: j for j in load_trace(_trace(tmp_path))}
    assert by_id["alpha-00001"].duration == pytest.approx(1000 / 10.0)
    assert by_id["beta-00001"].duration == pytest.approx(100 / 2.0)
    assert not by_id["alpha-00001"].extrapolated


def test_unmeasured_gang_sizes_scale_linearly_from_the_largest_measured_one(
    tmp_path: Path,
) -> None:
    by_id = {j.job_id: j for j in load_trace(_trace(tmp_path))}
    assert by_id["beta-00002"].duration == pytest.approx(300 / (10.0 * 16 / 8))
    assert by_id["alpha-00003"].duration == pytest.approx(400 / (4.0 * 4))
    assert by_id["beta-00002"].extrapolated and by_id["alpha-00003"].extrapolated
    with pytest.raises(TraceError):
        throughput(RATES, "Unknown", 1)


def test_declared_runtime_overestimates_by_1_to_5_and_is_seeded(tmp_path: Path) -> None:
    folder = _trace(tmp_path)
    first, again, other = load_trace(folder, 1), load_trace(folder, 1), load_trace(folder, 2)
    assert [j.declared_runtime for j in first] == [j.declared_runtime for j in again]
    assert [j.declared_runtime for j in first] != [j.declared_runtime for j in other]
    for job in first + other:
        assert job.duration <= job.declared_runtime <= 5 * job.duration


def test_an_underestimate_share_changes_only_the_jobs_it_draws(tmp_path: Path) -> None:
    folder = _trace(tmp_path)
    base = load_trace(folder, 1)
    assert [j.declared_runtime for j in load_trace(folder, 1, underestimate_share=0.0)] == [
        j.declared_runtime for j in base
    ]
    every = load_trace(folder, 1, underestimate_share=1.0)
    assert all(0.5 * j.duration <= j.declared_runtime < j.duration for j in every)
    some = load_trace(folder, 1, underestimate_share=0.5)
    for before, after in zip(base, some, strict=True):
        # An under-estimate, or exactly the over-estimate drawn without the share.
        assert after.declared_runtime < after.duration or after == before
    with pytest.raises(ValueError):
        load_trace(folder, 1, underestimate_share=1.5)


def test_limit_keeps_the_earliest_jobs(tmp_path: Path) -> None:
    jobs = load_trace(_trace(tmp_path), limit=2)
    assert [j.job_id for j in jobs] == ["alpha-00001", "alpha-00002"]


def test_a_malformed_line_is_an_error(tmp_path: Path) -> None:
    folder = _trace(tmp_path)
    (folder / "gamma.trace").write_text("Solo\tcmd\t-n\t0\t10\n")
    with pytest.raises(TraceError, match=r"gamma.trace:1"):
        load_trace(folder)


def test_an_empty_folder_is_an_error(tmp_path: Path) -> None:
    folder = write_trace(tmp_path / "empty", [], RATES, gpus=8)
    with pytest.raises(TraceError):
        load_trace(folder)


def _one_line(tmp_path: Path, line: str) -> Path:
    folder = write_trace(tmp_path / "one", [], RATES, gpus=8)
    (folder / "team.trace").write_text(line + "\n")
    return folder


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("Solo\tcmd\t-n\t0\tmany\t5\t1", "team.trace:1: total steps (column 5) 'many' is not a"),
        ("Solo\tcmd\t-n\t0\t10\tsoon\t1", "team.trace:1: arrival second (column 6) 'soon' is not"),
        ("Solo\tcmd\t-n\t0\t10\t5\t1.5", "team.trace:1: GPUs (column 7) '1.5' is not a whole"),
        ("Solo\tcmd\t-n\t0\t10\tnan\t1", "team.trace:1: arrival second (column 6) 'nan' is not a"),
        ("Solo\tcmd\t-n\t0\t10\tinf\t1", "team.trace:1: arrival second (column 6) 'inf' is not a"),
        ("Solo\tcmd\t-n\t0\t10\t-5\t1", "team.trace:1: arrival second (column 6) -5 is negative"),
        ("Solo\tcmd\t-n\t0\t10\t5\t-4", "team.trace:1: needs >= 1 GPU and >= 1 step"),
        ("Solo\tcmd\t-n\t0\t10\t5\t16", "team.trace:1: needs 16 GPUs, the cluster"),
        ("Other\tcmd\t-n\t0\t10\t5\t1", "team.trace:1: no throughput for job type 'Other'"),
    ],
)
def test_a_bad_value_names_its_line_and_column(tmp_path: Path, line: str, says: str) -> None:
    # (A NaN arrival used to hang the replay; a job larger than the cluster never finished.)
    with pytest.raises(TraceError) as raised:
        load_trace(_one_line(tmp_path, line))
    assert str(raised.value).startswith(says)


def test_a_missing_folder_a_folder_without_jobs_and_bad_cluster_files_are_errors(
    tmp_path: Path,
) -> None:
    with pytest.raises(TraceError, match="no such trace folder"):
        load_trace(tmp_path / "missing")
    folder = _one_line(tmp_path, "")
    with pytest.raises(TraceError, match="no jobs in the"):
        load_trace(folder)  # a team file without a job line
    folder = _one_line(tmp_path, "Solo\tcmd\t-n\t0\t10\t5\t1")
    (folder / "cluster_specs.json").write_text('{"c": ["0:0:0"]}')
    with pytest.raises(TraceError, match="at least 1 V100, got 0"):
        load_trace(folder)
    (folder / "cluster_specs.json").write_text("{")
    with pytest.raises(TraceError, match=r"cluster_specs\.json: cannot be read as JSON"):
        load_trace(folder)
    (folder / "cluster_specs.json").unlink()
    with pytest.raises(TraceError, match=r"cluster_specs\.json: no such file"):
        load_trace(folder)
    (folder / "physical_cluster_throughputs.json").write_text('{"v100": {"Solo": {"null": 1}}}')
    with pytest.raises(TraceError, match="v100 entry 'Solo' is not repr"):
        load_trace(folder)
