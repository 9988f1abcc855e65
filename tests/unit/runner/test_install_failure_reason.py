"""A job whose requirements fail to install reads why in its own terms: the requirement the
installer named and its last relevant lines, none of the runner's paths.

It read "uv pip install failed (exit status 1):" and the installer's last 20 lines as they
were: "Using Python 3.12 environment at: /var/lib/trainyard/envs/.store/<key>.<random>",
progress lines, and the venv's interpreter and the constraints file by their paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainyard_platform.services.runner.environments import EnvironmentCache, RequirementsError

CROSS = "\u00d7"
"""The mark uv starts an error with."""


def _installer(tmp_path: Path, output: str) -> list[str]:
    """A stand-in installer that prints ``output`` and fails."""
    script = tmp_path / "installer.py"
    script.write_text(f"import sys\nprint({output!r}, end='')\nsys.exit(1)\n")
    return [sys.executable, str(script)]


def test_the_reason_names_the_requirement_and_quotes_the_installer_without_its_paths(
    tmp_path: Path,
) -> None:
    root = tmp_path / "envs"
    venv = root / ".store" / "0a1b2c.d3e4"
    output = (
        f"Using Python 3.12.3 environment at: {venv}\n"
        "Resolved 3 packages in 12ms\n"
        f"  {CROSS} No solution found when resolving dependencies:\n"
        "  ╰─▶ Because there is no version of numpy==99 and you require numpy==99, we can\n"
        "      conclude that your requirements are unsatisfiable.\n"
        f"hint: {venv}/bin/python was asked for\n"
    )
    cache = EnvironmentCache(root, sys.executable, "uv")
    argv = [*_installer(tmp_path, output), "--python", str(venv / "bin" / "python")]
    with pytest.raises(RequirementsError) as raised:
        cache._run(argv, "uv pip install", installing=True, requirements=["numpy==99", "Pillow>=9"])
    assert str(raised.value) == (
        "uv pip install failed (exit status 1) on the requirement 'numpy==99'; it said:\n"
        f"    {CROSS} No solution found when resolving dependencies:\n"
        "    ╰─▶ Because there is no version of numpy==99 and you require numpy==99, we can\n"
        "        conclude that your requirements are unsatisfiable.\n"
        "  hint: <runner path> was asked for"
    )


def test_a_failure_no_requirement_is_named_in_keeps_only_the_last_relevant_lines(
    tmp_path: Path,
) -> None:
    root = tmp_path / "envs"
    noise = "".join(f"Downloading pkg{i} (1.0MiB)\n" for i in range(30))
    output = noise + "".join(f"error: line {i}\n" for i in range(12))
    cache = EnvironmentCache(root, sys.executable, "uv")
    with pytest.raises(Exception) as raised:
        cache._run(
            _installer(tmp_path, output), "uv pip install", installing=True, requirements=["x1"]
        )
    said = str(raised.value)
    assert said.splitlines()[0] == "uv pip install failed (exit status 1); it said:"
    assert said.splitlines()[1:] == [f"  error: line {i}" for i in range(4, 12)]
