"""The scheduler's policy compiled to C with mypyc, where an installation allows it.

The policy (``policy/``) is pure, fully typed Python with no I/O, the code mypyc is made
for: compiled, a full pass at 10,000 nodes and 100,000 pending jobs takes about a quarter
less CPU, with the same decisions (``bench/policy_compiled.py`` measures both and compares
their decisions; ``tests/integration/scheduler/test_compiled_policy.py`` checks that they
agree). The services' image compiles it at build time (``deploy/images/services.Dockerfile``);
a source checkout runs it interpreted, as the tests do.

Compiling writes a C extension next to each module, which Python then imports instead of
the ``.py`` beside it: in a source checkout an edit of a module would silently not run. So
``compile_policy`` refuses a tree whose ``trainyard_platform`` holds the checkout's links
(``trainyard_platform/services`` -> ``services/``) and compiles only an installed copy or
one made by ``copy_for_compiling``.

    python -m trainyard_platform.services.scheduler.compiled           # the installed package
    python -m trainyard_platform.services.scheduler.compiled --root DIR  # DIR/trainyard_platform
    python -m trainyard_platform.services.scheduler.compiled --with /opt/tools/bin/python
"""

from __future__ import annotations

import argparse
import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

from trainyard_platform.services.scheduler.policy import engine

POLICY = Path("trainyard_platform", "services", "scheduler", "policy")
"""The package compiled, relative to the folder that holds ``trainyard_platform``."""


class CannotCompile(Exception):
    """The policy cannot be compiled where asked (the reason says why and what to do)."""


def is_compiled() -> bool:
    """Whether the policy running in this process is the compiled one (an extension module,
    not a ``.py`` or a ``.pyc`` of one)."""
    return engine.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def installed_root() -> Path:
    """The folder that holds the ``trainyard_platform`` package this process imports."""
    return Path(engine.__file__).resolve().parents[len(POLICY.parts)]


def copy_for_compiling(source_root: Path, into: Path) -> Path:
    """A copy of ``source_root``'s ``trainyard_platform`` in ``into``, its links followed
    (so it can be compiled without touching the checkout); returns ``into``."""
    shutil.copytree(
        source_root / "trainyard_platform",
        into / "trainyard_platform",
        symlinks=False,
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    return into


def compile_policy(root: Path, python: str = sys.executable) -> list[Path]:
    """Compile every module of ``root``'s policy package with mypyc, in place; return the
    extensions made. ``python``: the interpreter whose mypyc builds them (an environment of
    build tools; it must be the same Python version as the one that will import them).
    ``CannotCompile`` for a source checkout, a tree without the package, an interpreter
    that cannot be run, or a failed build (mypyc's output in the message)."""
    package = root / POLICY
    if not package.is_dir():
        raise CannotCompile(f"{package} does not exist: --root must hold trainyard_platform/")
    if (root / "trainyard_platform" / "services").is_symlink():
        raise CannotCompile(
            f"{root} is a source checkout: compiled modules would shadow its .py files; "
            "compile an installed copy, or a copy made with copy_for_compiling"
        )
    modules = sorted(str(p.relative_to(root)) for p in package.glob("*.py"))
    # mypyc writes its build folder and the shared runtime library in the working folder.
    try:
        done = subprocess.run(
            [python, "-m", "mypyc", *modules],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:  # no such interpreter, or not one that can run
        raise CannotCompile(f"cannot run {python}: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        raise CannotCompile(f"mypyc failed:\n{done.stdout}{done.stderr}")
    shutil.rmtree(root / "build", ignore_errors=True)
    return sorted(package.glob("*.so"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.services.scheduler.compiled",
        description="Compile the scheduler's policy with mypyc, in place.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the folder that holds trainyard_platform/ (default: the installed package's)",
    )
    parser.add_argument(
        "--with",
        dest="python",
        default=sys.executable,
        help="the interpreter whose mypyc compiles (default: this one)",
    )
    args = parser.parse_args(argv)
    try:
        made = compile_policy(args.root or installed_root(), args.python)
    except CannotCompile as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"compiled {len(made)} modules of the scheduler's policy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
