"""The images' lock files (deploy/requirements/): every requirement pinned with sha256
hashes, every dependency of both distributions (pyproject.toml, the platform, and
client/pyproject.toml, the client it depends on) locked, the client itself not (the images
install it from client/), the runner's torch the version that
pyproject.toml pins, and no torch in the services' lock (no service imports it)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
REQUIREMENTS = ROOT / "deploy" / "requirements"


def locked(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of a ``uv pip compile --generate-hashes`` file."""
    entries: dict[str, tuple[str, int]] = {}
    current = None
    for line in path.read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line):
            current = canonicalize_name(m.group(1))
            entries[current] = (m.group(2), 0)
        elif current and re.match(r"^\s+--hash=sha256:[0-9a-f]{64}", line):
            version, hashes = entries[current]
            entries[current] = (version, hashes + 1)
        elif line and not line.startswith((" ", "#", "--index-url")):
            pytest.fail(f"{path.name}: unexpected line {line!r}")
    return entries


PROJECTS = (ROOT / "pyproject.toml", ROOT / "client" / "pyproject.toml")
CLIENT = "trainyard"
"""The client distribution: a dependency of the platform, installed from this checkout."""


def project_dependencies() -> dict[str, Requirement]:
    """Every dependency of the two distributions but the client itself, by name."""
    requirements = [
        Requirement(r)
        for path in PROJECTS
        for r in tomllib.loads(path.read_text())["project"]["dependencies"]
    ]
    return {
        canonicalize_name(r.name): r for r in requirements if canonicalize_name(r.name) != CLIENT
    }


def test_both_distributions_are_read() -> None:
    """The client's own dependencies are checked too, and the platform needs the client."""
    names = project_dependencies()
    assert {"httpx", "pyyaml", "shtab"} <= names.keys()  # the client's
    assert {"nats-py", "asyncpg", "torch"} <= names.keys()  # the platform's
    platform = tomllib.loads(PROJECTS[0].read_text())["project"]["dependencies"]
    assert CLIENT in {canonicalize_name(Requirement(r).name) for r in platform}


@pytest.mark.parametrize("name", ["services.txt", "runner.txt"])
def test_the_client_is_not_locked(name: str) -> None:
    """Locked, it would be fetched from an index (where the name may be someone else's);
    the images install it from client/ instead."""
    assert CLIENT not in locked(REQUIREMENTS / name)


@pytest.mark.parametrize("name", ["services.txt", "runner.txt", "build.txt"])
def test_every_requirement_is_pinned_with_hashes(name: str) -> None:
    entries = locked(REQUIREMENTS / name)
    assert entries
    unhashed = [n for n, (_, hashes) in entries.items() if hashes == 0]
    assert not unhashed, f"{name}: no hash for {unhashed}"


@pytest.mark.parametrize("name", ["services.txt", "runner.txt"])
def test_every_project_dependency_is_locked_at_an_allowed_version(name: str) -> None:
    entries = locked(REQUIREMENTS / name)
    for dep, requirement in project_dependencies().items():
        if name == "services.txt" and dep == "torch":
            continue
        assert dep in entries, f"{name} lacks {dep}: run deploy/requirements/compile.sh"
        assert requirement.specifier.contains(entries[dep][0], prereleases=True), (
            f"{name}: {dep}=={entries[dep][0]} breaks {requirement}: run compile.sh"
        )


def test_the_runner_has_the_pinned_torch_and_the_services_none() -> None:
    (pin,) = project_dependencies()["torch"].specifier
    assert locked(REQUIREMENTS / "runner.txt")["torch"][0] == pin.version
    services = locked(REQUIREMENTS / "services.txt")
    assert "torch" not in services
    assert not [n for n in services if n.startswith("nvidia-") and n != "nvidia-ml-py"]


def test_the_services_start_without_torch() -> None:
    """The services' image has no torch: importing each service's entry point must not
    need it (torch is made unimportable in a fresh interpreter)."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "for s in ('submission', 'scheduler', 'registry', 'billing'):\n"
        "    __import__(f'trainyard_platform.services.{s}.__main__'); __import__(f'trainyard_platform.services.{s}.service')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
