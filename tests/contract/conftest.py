"""Fixtures for the object-store contract: one ``backend`` per ``ObjectStore`` implementation.

The S3 backend is marked ``integration`` and starts a moto server only when a test that
uses it runs, so ``-m "not integration"`` needs nothing but the filesystem.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.shared.settings import StorageSettings
from trainyard_platform.shared.storage import ObjectStore, open_store


@dataclass(frozen=True)
class Backend:
    """Where a test's stores live: ``open(name)`` roots a store at ``<base>/<name>``."""

    kind: str
    base_uri: str
    settings: StorageSettings | None

    def open(self, name: str = "root") -> ObjectStore:
        return open_store(f"{self.base_uri}/{name}", self.settings)

    def open_uri(self, uri: str) -> ObjectStore:
        return open_store(uri, self.settings)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        # A space in the path checks that file URIs are encoded and decoded consistently.
        return Backend("local", (tmp_path / "object store").as_uri(), None)
    server: S3Server = request.getfixturevalue("s3_server")
    # A fresh prefix per test in one bucket: tests can't see each other's objects.
    return Backend("s3", f"s3://contract/{uuid.uuid4().hex}", server.storage_settings())


@pytest.fixture
def store(backend: Backend) -> ObjectStore:
    return backend.open()
