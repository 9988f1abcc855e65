"""The registry's copies on a local folder: which checkpoint URIs it copies from, and that a
copy is checked against what the job committed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trainyard_platform.services.registry import artifacts
from trainyard_platform.services.registry.artifacts import (
    ArtifactCorrupt,
    ArtifactMismatch,
    CheckpointGone,
    Digest,
    SourceOutsideStore,
)
from trainyard_platform.shared.storage import LocalStore


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "objects store")  # a space: URIs are percent-encoded


def digest(data: bytes) -> Digest:
    return Digest(len(data), hashlib.sha256(data).hexdigest())


def test_a_job_checkpoint_of_the_store_is_a_source(store: LocalStore) -> None:
    key = "jobs/j1/checkpoints/step-00000001/checkpoint.pt"
    assert artifacts.source_key(store, store.uri_for(key)) == key


@pytest.mark.parametrize(
    "uri_of",
    [
        lambda s: "file:///etc/passwd",
        lambda s: s.root_uri + "/../outside/checkpoint.pt",
        lambda s: s.root_uri + "/jobs/%2E%2E/%2E%2E/x",
        lambda s: s.root_uri + "/registry/vision/digits/v/checkpoint.pt",
        lambda s: s.root_uri + "-sibling/jobs/x/checkpoint.pt",
        lambda s: "s3://bucket/jobs/x/checkpoint.pt",
        lambda s: s.root_uri + "/jobs/a%00b",
    ],
    ids=["absolute", "dot-dot", "encoded dot-dot", "registry's own", "sibling", "s3", "NUL"],
)
def test_anything_else_is_not(store: LocalStore, uri_of: object) -> None:
    with pytest.raises(SourceOutsideStore):
        artifacts.source_key(store, uri_of(store))  # type: ignore[operator]


def test_a_copy_is_verified_and_independent_of_its_source(store: LocalStore) -> None:
    store.put_bytes("jobs/j/c.pt", b"weights")
    got = artifacts.copy_verified(store, "jobs/j/c.pt", "registry/t/m/v/c.pt", digest(b"weights"))
    assert got == digest(b"weights")
    store.put_bytes("jobs/j/c.pt", b"changed")
    assert store.get_bytes("registry/t/m/v/c.pt") == b"weights"


def test_a_source_changed_since_its_commit_is_not_copied(store: LocalStore) -> None:
    store.put_bytes("jobs/j/c.pt", b"changed since")
    with pytest.raises(ArtifactMismatch, match="changed after it was committed"):
        artifacts.copy_verified(store, "jobs/j/c.pt", "registry/t/m/v/c.pt", digest(b"weights"))
    assert not store.exists("registry/t/m/v/c.pt")


def test_a_source_deleted_since_its_commit_is_gone_by_its_uri(store: LocalStore) -> None:
    with pytest.raises(CheckpointGone, match="is no longer in the object store") as gone:
        artifacts.copy_verified(store, "jobs/j/c.pt", "registry/t/m/v/c.pt", digest(b"weights"))
    assert store.uri_for("jobs/j/c.pt") in str(gone.value)
    assert not store.exists("registry/t/m/v/c.pt")


def test_serving_verifies_the_bytes_it_serves(store: LocalStore) -> None:
    store.put_bytes("registry/t/m/v/c.pt", b"weights")
    path = artifacts.fetch_verified(store, "registry/t/m/v/c.pt", digest(b"weights"))
    assert path.read_bytes() == b"weights"
    artifacts.discard(path)
    assert not path.parent.exists()
    store.put_bytes("registry/t/m/v/c.pt", b"weightz")  # same size, other bytes
    with pytest.raises(ArtifactCorrupt):
        artifacts.fetch_verified(store, "registry/t/m/v/c.pt", digest(b"weights"))


def test_an_artifact_is_never_read_past_the_size_it_should_have(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object larger than the artifact it should be (replaced in the store, or a
    checkpoint changed since its commit) was downloaded whole to the registry's disk before
    its digest refused it. The read now stops past the size recorded, and is refused as
    before, naming the sizes."""
    bounds: list[int | None] = []
    read = store.get_file

    def recording(key: str, path: Path, *, max_bytes: int | None = None) -> None:
        bounds.append(max_bytes)
        read(key, path, max_bytes=max_bytes)

    monkeypatch.setattr(store, "get_file", recording)
    store.put_bytes("registry/t/m/v/c.pt", b"weights" * 1000)
    with pytest.raises(ArtifactCorrupt):
        artifacts.fetch_verified(store, "registry/t/m/v/c.pt", digest(b"weights"))
    store.put_bytes("jobs/j/c.pt", b"changed since" * 1000)
    with pytest.raises(ArtifactMismatch, match=r"is 13000 bytes, not the 7 bytes its job"):
        artifacts.copy_verified(store, "jobs/j/c.pt", "registry/t/m/v2/c.pt", digest(b"weights"))
    assert not store.exists("registry/t/m/v2/c.pt")
    assert bounds == [7, 7]
