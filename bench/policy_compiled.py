"""The scheduler's full pass, interpreted against compiled with mypyc, at ten times the scale.

    .venv/bin/python -m bench.policy_compiled [--nodes 10000] [--processes 3] [--passes 3]

Compiles a copy of the policy (``services/scheduler/compiled.py``, as the services' image
does) into a temporary folder, then runs ``--processes`` processes of each arm, alternating
(interpreted, compiled, interpreted, ...), so that a slow spell of a shared machine hits both.
Each process builds the ``--ten-x`` scenario of ``bench.scheduler_scale`` (10,000 nodes of 8
GPUs, 100,000 pending jobs in 500 queues), runs one pass to warm up, then ``--passes`` timed
passes (``schedule``: deciding and explaining), each timed by the CPU time of the process
(``time.process_time``) and by the wall clock. Every process also prints a digest of its
decisions (placements, preemptions and every explanation, by the golden tests'
``canonical``): the run fails unless both arms decided exactly the same. Prints a table and
writes ``bench/results/policy_compiled.json``. About 4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench._host import describe
from trainyard_platform.services.scheduler.compiled import compile_policy, copy_for_compiling

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path("bench") / "results" / "policy_compiled.json"

ONE_PROCESS = """
import hashlib, json, sys, time
from bench.scheduler_scale import scenario
from trainyard_platform.services.scheduler.compiled import is_compiled
from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig
from tests.unit.scheduler.policy.test_golden import canonical as canonical_of

nodes, passes = int(sys.argv[1]), int(sys.argv[2])
snapshot = scenario(nodes, queues_count=nodes // 20, submit_times=True)
decisions = schedule(snapshot, PolicyConfig())  # warm
cpu, wall = [], []
for _ in range(passes):
    c, w = time.process_time(), time.perf_counter()
    decisions = schedule(snapshot, PolicyConfig())
    cpu.append(time.process_time() - c)
    wall.append(time.perf_counter() - w)
canonical = canonical_of(decisions)
print(json.dumps({
    "compiled": is_compiled(),
    "cpu_s": cpu,
    "wall_s": wall,
    "placed": len(decisions.placements),
    "preempted": len(decisions.preemptions),
    "waiting": len(decisions.explanations),
    "digest": hashlib.sha256(json.dumps(canonical).encode()).hexdigest()[:20],
}))
"""


@contextmanager
def compiled_copy() -> Iterator[Path]:
    """A temporary folder holding a copy of the checkout's ``trainyard_platform`` with the
    policy compiled (removed at the end)."""
    with tempfile.TemporaryDirectory(prefix="policy-compiled-") as folder:
        root = copy_for_compiling(REPO, Path(folder))
        compile_policy(root)
        yield root


def python_with(path: list[Path], args: list[str], capture: bool = True) -> str:
    """Run ``python -P *args`` in the checkout with ``path`` first on the import path (``-P``:
    not the working folder, which holds the checkout's own ``trainyard_platform``); its
    output when ``capture``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    done = subprocess.run(
        [sys.executable, "-P", *args],
        cwd=REPO,
        env=env,
        capture_output=capture,
        text=True,
        check=True,
    )
    return done.stdout or ""


def one_process(path: list[Path], nodes: int, passes: int) -> dict[str, Any]:
    """One process of an arm, ``path`` first on its import path."""
    out = python_with(path, ["-c", ONE_PROCESS, str(nodes), str(passes)])
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs: dict[str, list[dict[str, Any]]] = {"interpreted": [], "compiled": []}
    with compiled_copy() as root:
        paths = {"interpreted": [REPO], "compiled": [root, REPO]}
        for i in range(args.processes):
            for arm in ("interpreted", "compiled"):
                run = one_process(paths[arm], args.nodes, args.passes)
                if run["compiled"] != (arm == "compiled"):
                    raise SystemExit(f"process {i} of {arm} ran the other policy")
                runs[arm].append(run)
                print(
                    f"{arm:12} process {i + 1}: CPU a pass "
                    + " ".join(f"{s:.2f}" for s in run["cpu_s"]),
                    flush=True,
                )
    digests = {run["digest"] for arm in runs.values() for run in arm}
    if len(digests) != 1:
        raise SystemExit(f"the two policies decided differently: digests {sorted(digests)}")
    summary = {
        arm: {
            "cpu_s_median": round(statistics.median(s for r in rs for s in r["cpu_s"]), 3),
            "wall_s_median": round(statistics.median(s for r in rs for s in r["wall_s"]), 3),
            "cpu_s": [[round(s, 3) for s in r["cpu_s"]] for r in rs],
        }
        for arm, rs in runs.items()
    }
    ratio = summary["compiled"]["cpu_s_median"] / summary["interpreted"]["cpu_s_median"]
    first = runs["compiled"][0]
    result = {
        "benchmark": "policy_compiled",
        "command": "python -m bench.policy_compiled " + " ".join(argv or sys.argv[1:]),
        "nodes": args.nodes,
        "queues": args.nodes // 20,
        "placed": first["placed"],
        "preempted": first["preempted"],
        "waiting": first["waiting"],
        "decisions_digest": digests.pop(),
        "arms": summary,
        "compiled_over_interpreted_cpu": round(ratio, 3),
        "target_full_pass_s": 2.0,
        "machine": describe(load_average_before=load_before),
    }
    print(
        f"full pass, median CPU: interpreted {summary['interpreted']['cpu_s_median']:.2f} s, "
        f"compiled {summary['compiled']['cpu_s_median']:.2f} s (x{ratio:.2f}); "
        f"same decisions ({result['decisions_digest']})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
