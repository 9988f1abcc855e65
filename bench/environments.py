"""Job environment build and start times, uv against pip (services/runner/environments.py).

Run: ``.venv/bin/python -m bench.environments`` (about a minute; needs PyPI). Prints a
table and writes ``bench/results/environments.json``.

The requirement set is five small pure-Python wheels, pinned, none of them in the project's
environment (the base layer), so every one is really installed. For each installer, each
case is repeated (3 times by default) and the median reported:

- ``cold, no cache``: empty environment root and an empty installer cache (a fresh
  ``UV_CACHE_DIR`` / ``PIP_CACHE_DIR`` per repetition): resolve, download, install;
- ``cold, warm cache``: empty environment root, the installer cache already holding the
  wheels (filled by one unmeasured install first): the cost of a new requirement set whose
  packages the node has seen before;
- ``warm``: ``resolve`` of a set already built (``cached=True``); ``warm, new process``
  is the same from a fresh ``EnvironmentCache`` (it probes the base interpreter once, as a
  restarted runner would);
- ``first import``: a job's ``python -c "import ..."`` of the five packages in the built
  environment, run as the runner runs it (jobs cannot write ``__pycache__`` there, so
  bytecode compiled at install time is what saves them compiling on every start).

Times are wall clock on a shared machine and include the network for the cold cases.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._host import describe
from trainyard_platform.services.runner.environments import EnvironmentCache, Installer

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "environments.json"
REQUIREMENTS = [
    "tabulate==0.9.0",
    "termcolor==2.4.0",
    "colorama==0.4.6",
    "humanize==4.9.0",
    "tomli==2.0.1",
]
IMPORTS = "import tabulate, termcolor, colorama, humanize, tomli"


def cache_env(installer: Installer, cache_dir: Path) -> dict[str, str]:
    if installer == "uv":
        return {"UV_CACHE_DIR": str(cache_dir)}
    return {"PIP_CACHE_DIR": str(cache_dir)}


def timed_resolve(cache: EnvironmentCache, expect_cached: bool) -> float:
    started = time.perf_counter()
    env = cache.resolve(REQUIREMENTS)
    seconds = time.perf_counter() - started
    if env.cached != expect_cached:
        raise RuntimeError(f"expected cached={expect_cached}, got {env.cached}")
    return seconds


def first_import(python: str) -> float:
    started = time.perf_counter()
    subprocess.run([python, "-c", IMPORTS], check=True)
    return time.perf_counter() - started


def measure(installer: Installer, base_python: str, repeats: int, work: Path) -> dict[str, Any]:
    samples: dict[str, list[float]] = {
        "cold_no_cache_s": [],
        "cold_warm_cache_s": [],
        "warm_s": [],
        "warm_new_process_s": [],
        "first_import_s": [],
    }
    warm_cache = work / f"{installer}-warm-cache"
    # Fill the shared cache once (not measured).
    EnvironmentCache(
        work / f"{installer}-fill",
        base_python,
        installer,
        installer_env=cache_env(installer, warm_cache),
    ).resolve(REQUIREMENTS)
    for rep in range(repeats):
        cold = EnvironmentCache(
            work / f"{installer}-cold-{rep}",
            base_python,
            installer,
            installer_env=cache_env(installer, work / f"{installer}-empty-cache-{rep}"),
        )
        cold.resolve([])  # probe the base outside the measurement, as a running runner has
        samples["cold_no_cache_s"].append(timed_resolve(cold, expect_cached=False))

        root = work / f"{installer}-warm-{rep}"
        cache = EnvironmentCache(
            root, base_python, installer, installer_env=cache_env(installer, warm_cache)
        )
        cache.resolve([])
        samples["cold_warm_cache_s"].append(timed_resolve(cache, expect_cached=False))
        samples["warm_s"].append(timed_resolve(cache, expect_cached=True))
        fresh = EnvironmentCache(root, base_python, installer)
        samples["warm_new_process_s"].append(timed_resolve(fresh, expect_cached=True))
        samples["first_import_s"].append(first_import(cache.resolve(REQUIREMENTS).python))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"installer": installer, "median": medians, "samples": samples}


def fmt(seconds: float) -> str:
    if seconds < 0.1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| installer | cold, no cache | cold, warm cache | warm | warm, new process | first import |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["median"]
        lines.append(
            f"| {r['installer']} | {fmt(m['cold_no_cache_s'])} | {fmt(m['cold_warm_cache_s'])} "
            f"| {fmt(m['warm_s'])} | {fmt(m['warm_new_process_s'])} | {fmt(m['first_import_s'])} |"
        )
    return "\n".join(lines)


def repo_relative(path: str) -> str:
    try:
        return str(Path(path).absolute().relative_to(REPO))
    except ValueError:
        return Path(path).name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--installers", nargs="+", default=["uv", "pip"], choices=["uv", "pip"])
    parser.add_argument("--python", default=sys.executable, help="the base interpreter")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-envs-"))
    try:
        rows = [measure(i, args.python, args.repeats, work) for i in args.installers]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    uv_version = subprocess.run(
        [sys.executable, "-m", "uv", "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    pip_version = subprocess.run(
        [args.python, "-m", "pip", "--version"], capture_output=True, text=True, check=False
    ).stdout.split(" from ")[0]
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": describe(gpu=None),
        "base_python": repo_relative(args.python),
        "installers": {"uv": uv_version, "pip": pip_version},
        "requirements": REQUIREMENTS,
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {repo_relative(str(args.out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
