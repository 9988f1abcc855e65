#!/usr/bin/env python3
"""Trainyard's one entry point for development, from a fresh machine on.

Standard library only, Python 3.11+. Every target first makes sure ``.venv`` exists and
holds the project's two distributions, editable: the client (``client/``: CLI, HTTP client,
SDK) and the platform with its development tools (``pip install -e ./client -e ".[dev]"``).
The install is skipped while the stamp file ``.venv/.trainyard-installed`` holds the sha256
of both ``pyproject.toml`` files as they are now.

    python3 dev.py demo    run one training job end to end on a local stack
    python3 dev.py test    the gate: format, lint, types, import contracts, then pytest
    python3 dev.py check   the gate without pytest
    python3 dev.py fmt     format and auto-fix lint findings
    python3 dev.py up      start the local stack until Ctrl-C
    python3 dev.py help    this list

Extra arguments go to the last tool: ``python3 dev.py test -k stack -x`` passes
``-k stack -x`` to pytest (``test`` also passes ``--durations=25``, so its log names the
slowest tests, and runs two workers: ``-n 0`` runs one). Each step is printed before it runs; the first step that fails
ends the run with that step's exit status.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".trainyard-installed"
# The client distribution first: the platform depends on it (trainyard==<its version>), and
# one pip command with both resolves that pin to this checkout, never to a package index.
PROJECTS = (ROOT / "client" / "pyproject.toml", ROOT / "pyproject.toml")
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")


class StepFailed(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"exit status {status}")
        self.status = status


def step(argv: Sequence[str | Path]) -> None:
    """Print a command, run it in the repository root, stop everything if it fails."""
    shown = " ".join(_shown(a) for a in argv)
    print(f"==> {shown}", flush=True)
    status = subprocess.run([str(a) for a in argv], cwd=ROOT, check=False).returncode
    if status != 0:
        print(f"==> failed ({status}): {shown}", file=sys.stderr, flush=True)
        raise StepFailed(status)


def _shown(arg: str | Path) -> str:
    """Commands are printed relative to the repository, as one would type them."""
    text = str(arg)
    prefix = str(ROOT) + os.sep
    return text[len(prefix) :] if text.startswith(prefix) else text


def tool(name: str) -> Path:
    return BIN / name


def ensure_venv() -> None:
    """Create ``.venv`` and install the project into it unless the stamp says it is current."""
    if not PYTHON.exists():
        step([sys.executable, "-m", "venv", VENV])
    digest = install_digest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        return
    step([PYTHON, "-m", "pip", "install", "-e", "./client", "-e", ".[dev]"])
    STAMP.write_text(digest + "\n")


def install_digest() -> str:
    """One sha256 over every pyproject.toml the install reads: a change to either reinstalls."""
    digest = hashlib.sha256()
    for path in PROJECTS:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def gate(pytest_args: Sequence[str] | None) -> None:
    step([tool("ruff"), "format", "--check", "."])
    step([tool("ruff"), "check", "."])
    step([tool("mypy")])
    step([tool("lint-imports")])
    if pytest_args is not None:
        step([PYTHON, "-m", "pytest", *pytest_args])


def exec_python(args: Sequence[str]) -> None:
    """Replace this process, so signals (Ctrl-C) reach the program directly."""
    argv = [str(PYTHON), *args]
    print(f"==> {' '.join(_shown(a) for a in argv)}", flush=True)
    os.chdir(ROOT)
    os.execv(argv[0], argv)


def cmd_demo(args: Sequence[str]) -> None:
    exec_python(["-m", "trainyard_platform.deploy.local", "demo", *args])


def cmd_up(args: Sequence[str]) -> None:
    exec_python(["-m", "trainyard_platform.deploy.local", "up", *args])


DURATIONS = "--durations=25"
"""pytest names the 25 slowest set-ups, tests and teardowns of every ``test`` run, so each CI
log says where the suite's time went (a later ``--durations=N`` among the extra arguments
wins)."""

WORKERS = ("--numprocesses=2", "--dist=loadscope")
"""The suite runs in two worker processes (pytest-xdist): most of its time is spent waiting
on processes, servers and the network, so two workers take less time, even on two cores.
``loadscope`` keeps each module on one worker, and tests/conftest.py makes every test that
starts whole stacks one scope, so those run one after another. ``-n 0`` among the extra
arguments runs the suite in one process."""


def cmd_test(args: Sequence[str]) -> None:
    gate([*WORKERS, DURATIONS, *args])


def cmd_check(args: Sequence[str]) -> None:
    gate(None)


def cmd_fmt(args: Sequence[str]) -> None:
    step([tool("ruff"), "format", "."])
    step([tool("ruff"), "check", "--fix", "."])


TARGETS: dict[str, tuple[Callable[[Sequence[str]], None], str]] = {
    "demo": (cmd_demo, "run one training job end to end on a fresh local stack"),
    "test": (cmd_test, "the gate: ruff format --check, ruff check, mypy, lint-imports, pytest"),
    "check": (cmd_check, "the gate without pytest"),
    "fmt": (cmd_fmt, "ruff format, then ruff check --fix"),
    "up": (cmd_up, "start the local stack and keep it running until Ctrl-C"),
}


def print_help() -> None:
    print("usage: python3 dev.py TARGET [ARGS...]\n\ntargets:")
    for name, (_, text) in TARGETS.items():
        print(f"  {name:<6} {text}")
    print(f"  {'help':<6} this list")


def main(argv: Sequence[str]) -> int:
    # A fresh machine's python3 may be older than the project's floor: say so plainly.
    if sys.version_info < (3, 11):  # noqa: UP036
        print("dev.py needs Python 3.11 or newer", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("help", "-h", "--help"):
        print_help()
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in TARGETS:
        print(f"unknown target {name!r}\n", file=sys.stderr)
        print_help()
        return 2
    try:
        ensure_venv()
        TARGETS[name][0](args)
    except StepFailed as exc:
        return exc.status
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
