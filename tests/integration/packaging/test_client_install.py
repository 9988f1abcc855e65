"""``pip install`` of the client wheel into an empty virtual environment, as a user would
into a training environment: what it pulls holds no server package and no torch, the
``trainyard`` command runs, and the SDK says plainly that it needs the user's torch.

Its dependencies come from the package index pip is configured with; when none is
reachable the test is skipped (saying so), any other install failure fails it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.fixtures.packaging import SERVER_PACKAGES, build_client_wheel

pytestmark = pytest.mark.integration

INSTALL_TIMEOUT_S = 300
_UNREACHABLE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Could not fetch URL",
    "ConnectTimeoutError",
)
"""pip's words for "no package index reachable"."""


def run(argv: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a program of the new environment from ``cwd``, out of reach of the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def test_the_client_installs_alone_into_an_empty_environment(tmp_path: Path) -> None:
    wheel = build_client_wheel(tmp_path)
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        cwd=tmp_path,
    )
    if installed.returncode != 0 and any(w in installed.stderr for w in _UNREACHABLE):
        pytest.skip(f"no package index reachable: {installed.stderr.strip()[-300:]}")
    assert installed.returncode == 0, installed.stderr[-3000:]

    listed = run([python, "-m", "pip", "list", "--format=json"], cwd=tmp_path)
    names = {canonicalize_name(p["name"]) for p in json.loads(listed.stdout)}
    assert "trainyard" in names
    assert not names & SERVER_PACKAGES, f"server packages installed: {names & SERVER_PACKAGES}"
    assert not names & {"torch", "numpy"}, "the user's environment brings its own torch"

    imports = "import trainyard.cli, trainyard.client, trainyard.spec, trainyard.storage"
    assert run([python, "-c", imports], cwd=tmp_path).returncode == 0
    for platform in ("trainyard_platform", "shared", "services", "deploy", "examples"):
        absent = run([python, "-c", f"import {platform}"], cwd=tmp_path)
        assert absent.returncode != 0, f"the client installed a top-level {platform!r}"

    cli = run([env / "bin" / "trainyard", "--help"], cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "submit" in cli.stdout

    sdk = run([python, "-c", "import trainyard.sdk"], cwd=tmp_path)
    assert sdk.returncode != 0
    assert "trainyard.sdk needs PyTorch" in sdk.stderr
