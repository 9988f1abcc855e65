"""The scheduler's policy compiled with mypyc (``services/scheduler/compiled.py``, as the
services' image builds it) decides exactly as it does interpreted: the golden decisions and
the incremental and property tests run against a compiled copy, in a process of their own.

Compiled code also checks every annotated type at run time, which the interpreter does not:
the first such run found test worlds that built ``RunningJob`` with a notice time in its
``borrowed`` field (``test_golden_mixed``, since fixed and its digests retaken)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from trainyard_platform.services.scheduler.compiled import (
    CannotCompile,
    compile_policy,
    copy_for_compiling,
)

REPO = Path(__file__).parents[3]
POLICY_TESTS = "tests/unit/scheduler/policy"
DECISION_TESTS = [
    f"{POLICY_TESTS}/test_golden.py",
    f"{POLICY_TESTS}/test_golden_mixed.py",
    f"{POLICY_TESTS}/test_incremental.py",
    f"{POLICY_TESTS}/test_properties.py",
    f"{POLICY_TESTS}/test_properties_holds.py",
]
"""Tests of what the policy decides, not of how (tests that replace a method or a module's
constant see no effect in compiled code, whose calls are bound when it is built)."""

# ``-P``: the working folder (the checkout) must not come before the compiled copy on the path.
RUN_AGAINST_THE_COPY = """
import sys
import pytest
from trainyard_platform.services.scheduler.compiled import is_compiled
print("compiled policy:", is_compiled(), flush=True)
sys.exit(pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", "--import-mode=append",
                      *sys.argv[1:]]))
"""


def _can_build_extensions() -> bool:
    """A C compiler and this Python's headers (a distribution's Python may ship without
    them: Debian's python3-dev)."""
    compiler = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(compiler) is not None and headers.exists()


@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    not _can_build_extensions(), reason="no C compiler or Python headers to build the policy"
)
def test_the_compiled_policy_decides_as_the_interpreted_one(tmp_path: Path) -> None:
    root = copy_for_compiling(REPO, tmp_path)
    made = compile_policy(root)
    modules = {p.stem for p in (REPO / "services" / "scheduler" / "policy").glob("*.py")}
    assert {p.name.split(".")[0] for p in made} == modules
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    run = subprocess.run(
        [sys.executable, "-P", "-c", RUN_AGAINST_THE_COPY, *DECISION_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    out = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.stdout.startswith("compiled policy: True"), out
    assert run.returncode == 0, out


def test_a_source_checkout_is_never_compiled_in_place() -> None:
    """Extensions written beside the checkout's modules would be imported instead of them,
    so an edit would silently not run."""
    with pytest.raises(CannotCompile, match="source checkout"):
        compile_policy(REPO)
    assert not list((REPO / "services" / "scheduler" / "policy").glob("*.so"))
