"""Mutation testing of the modules that carry a guarantee, one module at a time (mutmut 3).

Run: ``.venv/bin/python -m bench.mutation --module shared/outbox.py`` (``--list`` names the
modules and their tests; ``--all`` runs them one after the other). Slow (minutes to an hour
per module), so it is not part of ``dev.py test`` or CI.

What it does for a module:

1. Copies the repository at a commit (``--source``, default HEAD; ``worktree``: the working
   tree as it is, untracked files included) to a private folder (``--work-dir``, default
   ``$TMPDIR/trainyard-mutation/<module>``): mutmut writes its ``mutants/`` tree beside the
   sources, and nothing of it must reach a working tree that others use.
2. Writes a ``[tool.mutmut]`` section into the copy's ``pyproject.toml``: ``source_paths``
   is the one module, every package is copied beside it (``also_copy``), and the test
   selection is the module's own tests (``MODULES`` below): the tests that exercise its
   guarantee, never the whole suite.
3. For modules whose tests need PostgreSQL, starts one server for the whole run and makes
   the tests use it (``-p bench.mutation``: ``pytest_configure`` below swaps the session's
   ``postgres_server`` for it), so that each mutant does not start and stop its own, and a
   mutant killed for a timeout leaves no server behind. NATS servers stay per mutant (they
   start in milliseconds and die with their parent).
4. Runs ``mutmut run --max-children N`` (default 1: the machine is shared), then reads
   mutmut's results (``mutmut results --all true``) and records per module: mutants, killed,
   survived, timeouts, not checked, and the surviving mutants' names. Results merge into
   ``bench/results/mutation.json`` (``--out``), keyed by module; ``--show NAME`` prints a
   mutant's diff from the kept work folder.

Score = killed / (mutants - not checked), where killed includes timeouts and mutants
mutmut's type check rejected (they cannot run). Survivors are either killed by new tests
or explained as equivalent in BENCHMARKS.md ("Mutation testing").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench._host import cpu_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mutation.json"
TOOL = "mutmut"
PACKAGES = ["trainyard_platform/", "trainyard/", "bench/", "examples/"]
ENV_PG_URI = "TRAINYARD_MUTATION_PG_URI"
"""A URI template (``{database}`` in place of the database) of a running PostgreSQL that
the tests use instead of starting their own."""

# Each guarantee's module and the tests that exercise it (pytest node ids or paths).
MODULES: dict[str, dict[str, Any]] = {
    "shared/outbox.py": {
        "tests": [
            "tests/integration/shared/test_outbox.py",
            "tests/integration/shared/test_outbox_order.py",
            "tests/integration/shared/test_outbox_parking.py",
            "tests/integration/shared/test_retention.py",
            "tests/unit/shared/test_outbox_rules.py",
            "tests/unit/shared/test_outbox_relay_loop.py",
            "tests/integration/shared/test_outbox_edges.py",
            # The relay's stream-loss re-publication, on one NATS and PostgreSQL (3 s).
            "tests/chaos/test_stream_loss.py",
        ],
        "postgres": True,
    },
    "shared/inbox.py": {
        "tests": [
            "tests/integration/shared/test_inbox_batches.py",
            "tests/integration/shared/test_consumer.py",
        ],
        "postgres": True,
    },
    "services/scheduler/leader.py": {
        "tests": ["tests/integration/scheduler/test_leader.py"],
        "postgres": True,
    },
    "services/scheduler/policy/quota.py": {
        "tests": [
            "tests/unit/scheduler/test_quota_reference_model.py",
            "tests/unit/scheduler/policy/test_quota.py",
            "tests/unit/scheduler/policy/test_preemption.py",
            "tests/unit/scheduler/policy/test_properties.py",
        ],
        "postgres": False,
    },
    "services/scheduler/policy/preemption.py": {
        "tests": [
            "tests/unit/scheduler/policy/test_preemption_rules.py",
            "tests/unit/scheduler/policy/test_preemption.py",
            "tests/unit/scheduler/policy/test_properties.py",
            "tests/unit/scheduler/policy/test_quota.py",
        ],
        "postgres": False,
    },
    "services/billing/domain.py": {
        "tests": ["tests/unit/billing/test_domain.py", "tests/unit/billing/test_metering_edges.py"],
        "postgres": False,
    },
    # The client package sits at the work copy's top level (``_lift_client``).
    "trainyard/sdk/checkpoints.py": {
        "tests": ["tests/unit/test_sdk.py", "tests/unit/test_checkpoint_rules.py"],
        "postgres": False,
    },
    "services/scheduler/leases.py": {
        # Its own tests, seconds in all. The scheduler's whole-service tests
        # (test_restarts.py, test_scheduler.py) reach it too, but take minutes a run: at one
        # mutant at a time they stay out of the selection.
        "tests": [
            "tests/unit/scheduler/test_leases_plan.py",
            "tests/integration/scheduler/test_leases_fencing.py",
        ],
        "postgres": True,
    },
    "shared/bus.py": {
        "tests": [
            "tests/unit/shared/test_bus_rules.py",
            "tests/unit/shared/test_bus_pull_rules.py",
            "tests/integration/shared/test_bus_streams.py",
            "tests/integration/shared/test_bus_consumers.py",
            "tests/unit/shared/test_infrastructure_faults.py",
            "tests/integration/shared/test_consumer.py",
            "tests/integration/shared/test_redrive.py",
            "tests/integration/shared/test_infra_outage.py",
        ],
        "postgres": True,
    },
}


# --- the pytest plugin (loaded in the mutants' test runs with ``-p bench.mutation``) ------


def pytest_configure(config: Any) -> None:
    """Hypothesis reports a failure without shrinking it (a mutant needs only a verdict);
    the servers plugin uses the PostgreSQL this run started (``ENV_PG_URI``)."""
    with contextlib.suppress(ImportError):
        from hypothesis import Phase, settings

        settings.register_profile(
            "mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        )
        settings.load_profile("mutation")
    found = os.environ.get(ENV_PG_URI)
    if not found:
        return
    template: str = found
    from tests.fixtures import servers
    from trainyard_platform.deploy.local.postgres import PostgresServer

    class Running(PostgresServer):
        """The run's server: never started or stopped by a test session."""

        def start(self) -> float:
            self._server = True
            return 0.0

        def stop(self) -> None:
            self._server = None

        def uri(self, database: str) -> str:
            return template.format(database=database)

    servers.PostgresServer = Running  # type: ignore[attr-defined]


# --- running -------------------------------------------------------------------------------


def _copy_tree(dest: Path, source: str) -> str:
    """The repository into ``dest``: the commit ``source`` (default HEAD: reproducible, and
    free of others' uncommitted edits), or with ``worktree`` the working tree as it is now
    (tracked and untracked files that git does not ignore). Returns what was copied."""
    if source != "worktree":
        commit = _git("rev-parse", source).strip()
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        (dest / ".venv").symlink_to(ROOT / ".venv")
        _lift_client(dest)
        _lift_platform(dest)
        return commit
    for raw in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0"):
        src = ROOT / raw
        if not raw or not src.is_file():  # deleted in the working tree
            continue
        target = dest / raw
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    _lift_client(dest)
    _lift_platform(dest)
    return "worktree of " + _git("rev-parse", "HEAD").strip()


def _lift_client(dest: Path) -> None:
    """Move the client distribution's package (``client/trainyard``) to the copy's top level.

    mutmut names a mutant after its file's path (``client/trainyard/x.py`` would be module
    ``client.trainyard.x``) while the tests import ``trainyard.x``, and the tests run from
    ``mutants/``, whose top-level packages come before the checkout's editable install on
    ``sys.path``: at the top level the mutated copy is the one imported.
    """
    client = dest / "client" / "trainyard"
    if client.is_dir():
        shutil.move(client, dest / "trainyard")


def _lift_platform(dest: Path) -> None:
    """Move ``shared/``, ``services/`` and ``deploy/`` into the copy's ``trainyard_platform/``
    (in place of its links), for the reason ``_lift_client`` gives: mutants are named after
    their file's path, and the tests import ``trainyard_platform.shared.x``."""
    package = dest / "trainyard_platform"
    for name in ("shared", "services", "deploy"):
        link = package / name
        if link.is_symlink():
            link.unlink()
        if (dest / name).is_dir():
            shutil.move(dest / name, link)


def mutated_path(module: str) -> str:
    """Where ``module`` (a path such as ``shared/outbox.py``) lies in the lifted copy."""
    return module if module.startswith("trainyard/") else f"trainyard_platform/{module}"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def _config(module: str, tests: list[str], postgres: bool) -> str:
    args = ["-p", "no:cacheprovider", "-p", "bench.mutation", "--timeout=120"]
    lines = [
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps([mutated_path(module)])}",
        f"also_copy = {json.dumps(PACKAGES)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        f"pytest_add_cli_args = {json.dumps(args)}",
        "use_git_change_detection = false",
        # Integration tests wait on servers: allow well beyond their clean duration.
        f"timeout_multiplier = {20.0 if postgres else 10.0}",
        "timeout_constant = 15.0",
        "",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def _postgres(work: Path) -> Iterator[str]:
    """A PostgreSQL for the whole run; yields the URI template."""
    from trainyard_platform.deploy.local.postgres import PostgresServer

    with PostgresServer(work / ".pgdata") as server:
        uri = server.uri("DBNAMEPLACEHOLDER").replace("DBNAMEPLACEHOLDER", "{database}")
        yield uri


def _mutmut(work: Path, *args: str, env: dict[str, str]) -> str:
    binary = ROOT / ".venv" / "bin" / "mutmut"
    done = subprocess.run(
        [str(binary), *args], cwd=work, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"mutmut {' '.join(args)} failed ({done.returncode}): {done.stdout}")
    return done.stdout


def _mutmut_run(
    work: Path,
    max_children: int,
    env: dict[str, str],
    budget_s: float,
    names: Sequence[str] = (),
) -> bool:
    """``mutmut run``, logged to ``mutmut.log``; stopped after ``budget_s`` (what it did not
    reach stays "not checked"). True when it finished."""
    binary = ROOT / ".venv" / "bin" / "mutmut"
    with (work / "mutmut.log").open("a") as log:
        proc = subprocess.Popen(
            [str(binary), "run", "--max-children", str(max_children), *names],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, to stop it and its children
        )
        try:
            code = proc.wait(timeout=budget_s if budget_s > 0 else None)
        except subprocess.TimeoutExpired:
            for signal_, grace in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal_)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
                    break
            return False
    if code != 0:
        raise RuntimeError(f"mutmut run failed ({code}): see {work / 'mutmut.log'}")
    return True


_STATUSES = {
    "killed": "killed",
    "survived": "survived",
    "timeout": "timeout",
    "caught by type check": "type_check",
    "no tests": "no_tests",
    "not checked": "not_checked",
    "suspicious": "suspicious",
    "segfault": "segfault",
    "skipped": "skipped",
    "check was interrupted by user": "interrupted",
}


def _results(work: Path, env: dict[str, str]) -> dict[str, str]:
    """Mutant name -> status, from ``mutmut results --all true``."""
    text = _mutmut(work, "results", "--all", "true", env=env)
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*(\S+):\s*(.+?)\s*$", line)
        if match and match.group(2) in _STATUSES:
            found[match.group(1)] = _STATUSES[match.group(2)]
    return found


def summarise(statuses: dict[str, str]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    killed = counts.get("killed", 0) + counts.get("timeout", 0) + counts.get("type_check", 0)
    unchecked = counts.get("not_checked", 0) + counts.get("interrupted", 0)
    checked = len(statuses) - unchecked
    survivors = sorted(
        name for name, status in statuses.items() if status in ("survived", "no_tests")
    )
    return {
        "mutants": len(statuses),
        "killed": killed,
        "survived": counts.get("survived", 0),
        "no_tests": counts.get("no_tests", 0),
        "timeout": counts.get("timeout", 0),
        "not_checked": unchecked,
        "other": {k: v for k, v in counts.items() if k not in _COUNTED},
        "score": round(killed / checked, 4) if checked else None,
        "survivors": survivors,
    }


_COUNTED = {"killed", "survived", "no_tests", "timeout", "type_check", "not_checked", "interrupted"}


def run_module(
    module: str,
    work: Path,
    max_children: int,
    keep: bool,
    source: str = "HEAD",
    budget_s: float = 0,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    spec = MODULES[module]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    copied = _copy_tree(work, source)
    shutil.copy2(Path(__file__), work / "bench" / "mutation.py")  # the plugin, as run now
    pyproject = work / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + _config(module, spec["tests"], spec["postgres"]))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop(ENV_PG_URI, None)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if spec["postgres"]:
            env[ENV_PG_URI] = stack.enter_context(_postgres(work))
        finished = _mutmut_run(work, max_children, env, budget_s, only)
        statuses = _results(work, env)
    elapsed = time.monotonic() - started
    summary = summarise(statuses)
    summary.update(
        {
            "module": module,
            "source": copied,
            "tests": spec["tests"],
            "seconds": round(elapsed, 1),
            "finished": finished,
            "only": list(only),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "statuses": statuses,  # for ``record``'s merge of an ``--only`` run; not stored
        }
    )
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def rerun_module(
    module: str,
    work: Path,
    max_children: int,
    budget_s: float = 0,
    only: Sequence[str] = (),
    tests: Sequence[str] = (),
) -> dict[str, Any]:
    """Run again, in a kept work folder, the mutants that survived (or were not checked),
    against the tests as they are now at HEAD: after new tests were written to kill them.

    ``tests`` (default: the module's whole selection) runs them against some of its tests
    only: a quick first pass whose kills stand (a mutant that fails some of the tests fails
    them all), while what survives it must be run again against the whole selection before
    it counts as a survivor."""
    spec = MODULES[module]
    selection = list(tests) or spec["tests"]
    if not (work / "mutants").exists():
        raise SystemExit(f"{work} has no mutmut run to take up (run with --keep first)")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD", "tests"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    shutil.rmtree(work / "tests")
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    shutil.copy2(Path(__file__), work / "bench" / "mutation.py")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop(ENV_PG_URI, None)
    before = _results(work, env)
    # The module's tests as listed now (new test files included). A changed selection makes
    # mutmut forget every verdict; since tests were only added, what was killed stays killed
    # and is merged back below.
    pyproject = work / "pyproject.toml"
    text = pyproject.read_text()
    text = text[: text.index("\n[tool.mutmut]")] if "\n[tool.mutmut]" in text else text
    pyproject.write_text(text + _config(module, selection, spec["postgres"]))
    done = {n: st for n, st in before.items() if st in ("killed", "timeout", "type_check")}
    # Map every test to the functions it calls again, new tests included.
    (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    again = sorted(
        n
        for n, st in before.items()
        if st not in ("killed", "timeout", "type_check")
        and (not only or any(fnmatch.fnmatch(n, p) for p in only))
    )
    started = time.monotonic()
    finished = True
    with contextlib.ExitStack() as stack:
        if spec["postgres"]:
            env[ENV_PG_URI] = stack.enter_context(_postgres(work))
        if again:
            finished = _mutmut_run(work, max_children, env, budget_s, again)
        statuses = {**_results(work, env), **done}
    summary = summarise(statuses)
    summary.update(
        {
            "module": module,
            "source": _git("rev-parse", "HEAD").strip() + " (survivors re-run against its tests)",
            "tests": selection,
            "seconds": round(time.monotonic() - started, 1),
            "finished": finished,
            "rerun": len(again),
            "only": list(only),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    return summary


def _machine() -> str:
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu_model()}), "
        f"Python {platform.python_version()}"
    )


def _tool_version() -> str:
    from importlib.metadata import version

    return f"{TOOL} {version(TOOL)}"


def merge_only(previous: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """A run limited to some functions (``--only``) merged into the module's previous
    complete record: the mutants it checked take their new verdicts, the others keep the
    previous one (a survivor if named among its survivors, else killed). Only sound when the
    functions outside ``--only`` are unchanged since that record (its commit is kept in
    ``merged_from``); a changed function must be inside ``--only``."""
    statuses: dict[str, str] = summary["statuses"]
    earlier = set(previous.get("survivors", []))
    merged = {
        name: (
            ("survived" if name in earlier else "killed")
            if status in ("not_checked", "interrupted")
            else status
        )
        for name, status in statuses.items()
    }
    checked_now = sum(1 for st in statuses.values() if st not in ("not_checked", "interrupted"))
    result = {**summary, **summarise(merged)}
    result["checked_now"] = checked_now
    result["merged_from"] = {
        "source": previous.get("source"),
        "date": previous.get("date"),
        "seconds": previous.get("seconds"),
    }
    return result


def record(summary: dict[str, Any], out: Path) -> None:
    """Store ``summary`` as its module's record in ``out``. A run limited by ``--only``
    merges into the module's previous complete record (``merge_only``) rather than replacing
    it, so the file keeps one whole record per module."""
    data: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault("modules", {})
    previous = data["modules"].get(summary["module"])
    if (
        summary.get("only")
        and "statuses" in summary
        and previous is not None
        and previous.get("not_checked") == 0
    ):
        summary = merge_only(previous, summary)
    summary = {k: v for k, v in summary.items() if k != "statuses"}
    data["tool"] = _tool_version()
    data["machine"] = _machine()
    data["command"] = "python -m bench.mutation --module MODULE"
    data["modules"][summary["module"]] = summary
    data["date"] = max(m.get("date", "") for m in data["modules"].values())
    # Mutant names as mutmut spells them (its "ǁ" separator), not as \u escapes.
    out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mutation", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--module", choices=sorted(MODULES), action="append")
    what.add_argument("--all", action="store_true", help="every module, one after the other")
    what.add_argument("--list", action="store_true", help="the modules and their tests")
    what.add_argument("--show", metavar="MUTANT", help="a mutant's diff (from --keep'ed work)")
    parser.add_argument("--work-dir", type=Path, help="where the copies go")
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only the mutants whose names match (fnmatch, e.g. 'trainyard_platform.shared.outbox.x_enqueue*'); "
        "the others stay 'not checked'",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="in the kept work folder, run the survivors again against the tests at HEAD",
    )
    parser.add_argument(
        "--tests",
        action="append",
        default=[],
        metavar="PATH",
        help="with --rerun: against these of the module's tests only (a quick first pass; "
        "what survives it must be re-run against the whole selection)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=0,
        help="stop a module's run after this long (0: none); the rest stays 'not checked'",
    )
    parser.add_argument(
        "--source",
        default="HEAD",
        help="the commit to mutate (default HEAD), or 'worktree' for the working tree as it is",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    base = args.work_dir or Path(tempfile.gettempdir()) / "trainyard-mutation"
    if args.list:
        for module, spec in MODULES.items():
            print(f"{module}: {' '.join(spec['tests'])}")
        return 0
    if args.show:
        module = args.show.split("__mutmut_")[0].split(".x")[0]
        for folder in base.iterdir():
            if (folder / "mutants").exists():
                with contextlib.suppress(RuntimeError):
                    print(_mutmut(folder, "show", args.show, env=dict(os.environ)))
        return 0
    modules = sorted(MODULES) if args.all else args.module
    for module in modules:
        work = base / module.replace("/", "_").removesuffix(".py")
        print(f"{module}: mutating in {work} ...", flush=True)
        if args.rerun:
            summary = rerun_module(
                module, work, args.max_children, args.budget_minutes * 60, args.only, args.tests
            )
        else:
            summary = run_module(
                module,
                work,
                args.max_children,
                args.keep,
                args.source,
                args.budget_minutes * 60,
                args.only,
            )
        record(summary, args.out)
        print(
            f"{module}: {summary['killed']}/{summary['mutants'] - summary['not_checked']} "
            f"killed (score {summary['score']}), {len(summary['survivors'])} survivors, "
            f"{summary['seconds']:.0f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
