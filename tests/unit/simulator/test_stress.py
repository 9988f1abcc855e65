"""The stress traces: the same seed writes the same files, each scenario has the shape it
promises, and the replay reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.simulator.cluster import FLAVOR
from bench.simulator.policies import team_queues
from bench.simulator.stress import SCENARIOS, main, write_scenarios
from bench.simulator.trace import cluster_gpus, load_trace


def _files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()
    }


def test_a_seed_writes_the_same_traces_and_another_seed_others(tmp_path: Path) -> None:
    first = write_scenarios(tmp_path / "a", seed=3)
    again = write_scenarios(tmp_path / "b", seed=3)
    other = write_scenarios(tmp_path / "c", seed=4)
    assert [f.name for f in first] == list(SCENARIOS)
    for a, b, c in zip(first, again, other, strict=True):
        assert _files(a) == _files(b)
        assert _files(a) != _files(c)


def test_each_scenario_has_its_shape(tmp_path: Path) -> None:
    folders = {f.name: f for f in write_scenarios(tmp_path, seed=7)}
    loaded = {name: (load_trace(f), cluster_gpus(f)) for name, f in folders.items()}
    for jobs, gpus in loaded.values():
        span = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
        load = sum(j.gpus * j.duration for j in jobs) / (gpus * span)
        assert 0.9 < load < 1.6  # about 1.1 offered; bursts land unevenly
        assert all(j.duration >= 60 for j in jobs)

    jobs, gpus = loaded["gangs-over-quota"]
    quotas = [q.nominal[FLAVOR] for q in team_queues({j.team for j in jobs}, gpus)]
    gangs = [j for j in jobs if j.gpus > max(quotas)]
    assert gpus == 16 and max(quotas) < 8 and len(gangs) >= len(jobs) // 5

    jobs, _ = loaded["bursts"]
    same_second = max(sum(1 for j in jobs if j.arrival == t) for t in {j.arrival for j in jobs})
    assert same_second >= 10  # a burst arrives at once

    jobs, _ = loaded["heavy-tail"]
    durations = sorted(j.duration for j in jobs)
    assert durations[-1] > 50 * durations[len(durations) // 2]  # a few very long jobs

    jobs, _ = loaded["many-tenants"]
    teams = [j.team for j in jobs]
    counts = sorted((teams.count(t) for t in set(teams)), reverse=True)
    assert len(counts) >= 30 and counts[0] > 5 * counts[-1]  # Zipf: few busy, many quiet


def test_a_bad_seed_or_root_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed in ("x", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            main(["--seed", seed, "--root", str(tmp_path)])
        assert exit_info.value.code == 2
        assert "argument --seed: " in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["--seed", "1", "--root", str(tmp_path / "file")]) == 2
    assert "error: --root: " in capsys.readouterr().err
