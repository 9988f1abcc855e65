"""Load a Gavel/Philly trace folder into simulator jobs.

Contract of ``load_trace``:
- Every ``*.trace`` file in the folder is one team (the file name without ``.trace``); its lines
  are tab-separated with 7 columns (see ``../shared/traces/README.md``): job type, command,
  steps flag, needs-data-dir, total steps, arrival second, GPUs (the gang size).
- The true duration of a job is ``total_steps / throughput`` on a V100, the throughput read from
  ``physical_cluster_throughputs.json`` under the key ``repr((job_type, gpus))``. The file has no
  entry for 16, 32 and 64 GPUs nor for multi-GPU runs of the job types that were only measured
  on one GPU; for those the largest measured gang size ``s <= gpus`` of the same job type is
  scaled linearly (``throughput(s) * gpus / s``, ideal data-parallel scaling) and the job is
  flagged ``extrapolated``. No job is dropped.
- The declared maximum runtime is the true duration times an over-estimate factor drawn
  uniformly from [1, 5] by a ``random.Random(seed)``, one draw per job in arrival order, so the
  same seed always gives the same declarations. With ``underestimate_share`` p > 0, each job
  is also an under-estimate with probability p (a second generator, seeded ``seed + 1``, so the
  over-estimates of the other jobs stay as without it): its factor is then uniform in
  [0.5, 1) instead, and the job needs more than it declared (the engine stops it at its
  limit).
- Jobs come back sorted by (arrival, team, line number); ``limit`` keeps the first ``limit``.
- Bad input raises ``TraceError`` naming the file (and line and column) and the reason: a
  folder that is missing or holds no job, a missing or malformed ``cluster_specs.json`` or
  throughput file, a line without 7 columns, a number that does not parse, steps or GPUs
  below 1, an arrival that is negative or not finite, a job needing more GPUs than the
  cluster has (it could never run).
"""

from __future__ import annotations

import ast
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

THROUGHPUTS_FILE = "physical_cluster_throughputs.json"
CLUSTER_SPECS_FILE = "cluster_specs.json"
GPU_TYPE = "v100"
OVERESTIMATE_RANGE = (1.0, 5.0)
UNDERESTIMATE_RANGE = (0.5, 1.0)


@dataclass(frozen=True)
class TraceJob:
    """One job of the trace. ``duration`` is the simulator's secret: policies never see it."""

    job_id: str
    team: str
    job_type: str
    arrival: float
    """Seconds from the start of the trace."""
    gpus: int
    duration: float
    """True run time in seconds on ``gpus`` V100s, without interruptions."""
    declared_runtime: float
    """What the user declared as the maximum run time (what a scheduler may plan with)."""
    extrapolated: bool = False
    """The throughput of this (job type, gpus) was scaled from a smaller measured gang."""


class TraceError(ValueError):
    """The trace folder or one of its lines is malformed."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot be read as JSON ({exc})") from None


def load_throughputs(path: Path) -> dict[tuple[str, int], float]:
    """Steps per second on a V100 for each measured (job type, gpus)."""
    raw = _read_json(path)
    entries = raw.get(GPU_TYPE) if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise TraceError(f"{path.name}: no table of {GPU_TYPE!r} throughputs")
    table: dict[tuple[str, int], float] = {}
    for key, entry in entries.items():
        try:
            job_type, scale = ast.literal_eval(key)  # the key is repr((job_type, gpus))
            rate = float(entry["null"])
            table[(str(job_type), int(scale))] = rate
        except (KeyError, TypeError, ValueError, SyntaxError, MemoryError, RecursionError):
            raise TraceError(
                f"{path.name}: {GPU_TYPE} entry {key!r} is not "
                "repr((job type, GPUs)) -> {'null': steps per second}"
            ) from None
        if not (rate > 0 and math.isfinite(rate)):
            raise TraceError(f"{path.name}: {GPU_TYPE} entry {key!r}: {rate} steps per second")
    return table


def throughput(
    table: Mapping[tuple[str, int], float], job_type: str, gpus: int
) -> tuple[float, bool]:
    """(steps per second, extrapolated?) for a gang of ``gpus``; see the module docstring."""
    exact = table.get((job_type, gpus))
    if exact is not None:
        return exact, False
    measured = [s for (t, s) in table if t == job_type and s <= gpus]
    if not measured:
        raise TraceError(f"no throughput for job type {job_type!r} at or below {gpus} GPUs")
    base = max(measured)
    return table[(job_type, base)] * gpus / base, True


def cluster_gpus(trace_dir: Path) -> int:
    """GPUs of the cluster from ``cluster_specs.json`` (``"v100:p100:k80"``, V100s counted)."""
    specs = _read_json(trace_dir / CLUSTER_SPECS_FILE)
    try:
        (spec,) = next(iter(specs.values()))
        gpus = int(spec.split(":")[0])
    except (AttributeError, StopIteration, TypeError, ValueError) as exc:
        raise TraceError(
            f'{CLUSTER_SPECS_FILE}: expected {{"<name>": ["<v100>:<p100>:<k80>"]}} '
            f"({type(exc).__name__}: {exc})"
        ) from None
    if gpus < 1:
        raise TraceError(f"{CLUSTER_SPECS_FILE}: the cluster needs at least 1 V100, got {gpus}")
    return gpus


def _number(where: str, column: str, text: str, kind: type[int] | type[float]) -> float:
    """Column ``column`` of a trace line as ``kind``; TraceError naming both when it is not."""
    try:
        value = kind(text)
    except ValueError:
        raise TraceError(f"{where}: {column} {text!r} is not {_KIND[kind]}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: {column} {text!r} is not a finite number")
    return value


_KIND = {int: "a whole number", float: "a number"}


def load_trace(
    trace_dir: Path, seed: int = 0, limit: int | None = None, underestimate_share: float = 0.0
) -> list[TraceJob]:
    """All jobs of ``trace_dir`` (see the module docstring)."""
    if not 0.0 <= underestimate_share <= 1.0:
        raise ValueError("underestimate_share must be within [0, 1]")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be 1 or more, got {limit}")
    if not trace_dir.is_dir():
        raise TraceError(f"{trace_dir}: no such trace folder")
    table = load_throughputs(trace_dir / THROUGHPUTS_FILE)
    total = cluster_gpus(trace_dir)
    files = sorted(trace_dir.glob("*.trace"))
    if not files:
        raise TraceError(f"no *.trace files in {trace_dir}")
    rows: list[tuple[float, str, int, str, int, float, bool]] = []
    for file in files:
        team = file.stem
        for number, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{file.name}:{number}"
            cols = line.split("\t")
            if len(cols) != 7:
                raise TraceError(f"{where}: expected 7 columns, got {len(cols)}")
            job_type = cols[0]
            steps = int(_number(where, "total steps (column 5)", cols[4], int))
            arrival = _number(where, "arrival second (column 6)", cols[5], float)
            gpus = int(_number(where, "GPUs (column 7)", cols[6], int))
            if gpus < 1 or steps < 1:
                raise TraceError(f"{where}: needs >= 1 GPU and >= 1 step")
            if arrival < 0:
                raise TraceError(f"{where}: arrival second (column 6) {arrival:g} is negative")
            if gpus > total:
                raise TraceError(
                    f"{where}: needs {gpus} GPUs, the cluster ({CLUSTER_SPECS_FILE}) has {total}"
                )
            try:
                rate, extrapolated = throughput(table, job_type, gpus)
            except TraceError as exc:
                raise TraceError(f"{where}: {exc}") from None
            rows.append((arrival, team, number, job_type, gpus, steps / rate, extrapolated))
    if not rows:
        raise TraceError(f"no jobs in the *.trace files of {trace_dir}")
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    if limit is not None:
        rows = rows[:limit]
    over, under = random.Random(seed), random.Random(seed + 1)

    def factor() -> float:
        drawn = over.uniform(*OVERESTIMATE_RANGE)
        if underestimate_share > 0 and under.random() < underestimate_share:
            return under.uniform(*UNDERESTIMATE_RANGE)
        return drawn

    return [
        TraceJob(
            job_id=f"{team}-{number:05d}",
            team=team,
            job_type=job_type,
            arrival=arrival,
            gpus=gpus,
            duration=duration,
            declared_runtime=duration * factor(),
            extrapolated=extrapolated,
        )
        for arrival, team, number, job_type, gpus, duration, extrapolated in rows
    ]
