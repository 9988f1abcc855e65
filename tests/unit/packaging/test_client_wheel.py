"""The client distribution (client/) as a user installs it: the wheel's dependency list holds
no server package and no torch, its only top-level package is ``trainyard``, it carries
what the CLI and the SDK read at run time, and the platform pins exactly its version."""

from __future__ import annotations

import tomllib
import zipfile
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.fixtures.packaging import (
    ROOT,
    SERVER_PACKAGES,
    build_client_wheel,
    requires_dist,
    wheel_files,
    wheel_metadata,
)

CLIENT_DEPENDENCIES = {
    "httpx",
    "pydantic",
    "pydantic-settings",
    "pyyaml",
    "jsonschema",
    "shtab",
    "pathspec",
    "opentelemetry-api",
}
"""Everything the CLI, the HTTP client and the SDK need; adding to it is a decision (each
one lands in every user's training environment), so this list says it out loud."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield build_client_wheel(tmp_path_factory.mktemp("client-wheel"))


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> Message:
    return wheel_metadata(wheel)


def test_the_wheel_is_the_trainyard_distribution(metadata: Message) -> None:
    assert metadata["Name"] == "trainyard"
    platform = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [Requirement(r) for r in platform["dependencies"]]
    (pin,) = [r for r in pins if canonicalize_name(r.name) == "trainyard"]
    assert str(pin.specifier) == f"=={metadata['Version']}", (
        "the platform must depend on exactly the client version of the same checkout"
    )


def test_the_dependency_list_is_the_clients_alone(metadata: Message) -> None:
    requires = requires_dist(metadata)
    assert not requires.keys() & SERVER_PACKAGES, "server packages in the client"
    assert "torch" not in requires, "the SDK uses the torch of the user's environment"
    assert "numpy" not in requires
    assert set(requires) == CLIENT_DEPENDENCIES


def test_s3_is_an_extra_a_training_environment_does_without(metadata: Message) -> None:
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    extras = [r for r in requirements if r.marker is not None]
    assert {canonicalize_name(r.name) for r in extras} == {"minio"}
    (minio,) = extras
    assert minio.marker is not None and minio.marker.evaluate({"extra": "s3"})
    assert not minio.marker.evaluate({"extra": ""})


def test_the_only_top_level_package_is_trainyard(wheel: Path) -> None:
    top = {name.split("/", 1)[0] for name in wheel_files(wheel)}
    assert {t for t in top if not t.endswith(".dist-info")} == {"trainyard"}


def test_the_wheel_carries_its_data_files_and_license(wheel: Path, metadata: Message) -> None:
    files = set(wheel_files(wheel))
    assert "trainyard/schemas/job.v1.json" in files  # `trainyard schema`, spec checks
    assert "trainyard/py.typed" in files
    assert {
        "trainyard/control.py",
        "trainyard/storage/local.py",
        "trainyard/sdk/context.py",
    } <= files
    assert metadata["License"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"  # the file the metadata names is inside
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)


def test_the_cli_entry_point_is_declared(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(name).decode()
    assert "trainyard = trainyard.launch:main" in entry_points
