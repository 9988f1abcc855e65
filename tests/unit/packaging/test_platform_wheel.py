"""The platform distribution installs one top-level package, ``trainyard_platform``, and the
code imports the platform only by that name.

The source keeps the project's layout (``services/``, ``shared/``, ``deploy/`` at the top of
the repository) and ``trainyard_platform/`` links to them. A bare ``import shared...`` would
still work in a checkout, but it would load a second copy of every module it reaches (two
metric registries, two settings classes that compare unequal) and fail once installed."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

from tests.fixtures.packaging import ROOT, build_platform_wheel, wheel_files

BARE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(shared|services|deploy)\b", re.MULTILINE)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    yield wheel_files(build_platform_wheel(tmp_path_factory.mktemp("platform-wheel")))


def test_the_wheel_has_one_top_level_package(files: list[str]) -> None:
    top = {name.split("/")[0] for name in files if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"trainyard_platform"}


def test_the_wheel_carries_every_service_and_what_they_read_at_run_time(files: list[str]) -> None:
    names = set(files)
    for service in ("submission", "scheduler", "runner", "registry", "billing"):
        assert f"trainyard_platform/services/{service}/__main__.py" in names
    for folder in ("shared", "services/scheduler"):
        migrations = sorted(p.name for p in (ROOT / folder / "migrations").glob("*.sql"))
        assert migrations, folder
        packaged = f"trainyard_platform/{folder}/migrations/"
        assert (
            sorted(n.removeprefix(packaged) for n in names if n.startswith(packaged)) == migrations
        )
    assert "trainyard_platform/services/submission/web/index.html" in names
    assert "trainyard_platform/deploy/local/__main__.py" in names


def test_no_code_imports_the_platform_by_a_bare_name() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = [
        f"{name}: {match.group(0).strip()}"
        for name in tracked
        if (ROOT / name).is_file()
        for match in BARE_IMPORT.finditer((ROOT / name).read_text())
    ]
    assert offenders == [], "import trainyard_platform.<...> instead"
