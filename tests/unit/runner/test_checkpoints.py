"""Checkpoints between a job's staging folder and the store: verified, confined, retained."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainyard_platform.services.runner.checkpoints import (
    MAX_MANIFEST_BYTES,
    ResumeTooLarge,
    StagedCheckpointInvalid,
    apply_retention,
    commit_staged,
    complete_folders,
    stage_resume,
)
from trainyard_platform.shared.storage import LocalStore


def stage(staging: Path, step: int, data: bytes = b"weights", **overrides: object) -> None:
    """What the SDK writes: the object, then its manifest (object named from the root)."""
    folder = staging / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint.pt").write_bytes(data)
    manifest = {
        "step": step,
        "object": f"step-{step:08d}/checkpoint.pt",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "created_at": datetime.now(UTC).isoformat(),
        "job_id": "job-1",
        "attempt": 1,
    } | overrides
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_staged_checkpoint_is_uploaded_with_its_manifest_last(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 10, b"abc")
    ref = commit_staged(staging, 10, store, attempt=2)
    assert ref.step == 10 and ref.size_bytes == 3
    assert ref.uri == store.uri_for("step-00000010-a0002/checkpoint.pt")
    manifest = json.loads(store.get_bytes("step-00000010-a0002/manifest.json"))
    assert manifest["object"] == "step-00000010-a0002/checkpoint.pt"
    assert manifest["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert not (staging / "step-00000010").exists(), "the staged copy is removed"


def test_attempts_never_write_the_same_keys(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 10, b"first")
    commit_staged(staging, 10, store, attempt=1)
    stage(staging, 10, b"second")
    commit_staged(staging, 10, store, attempt=2)
    assert [f for _, _, f in complete_folders(store)] == [
        "step-00000010-a0001",
        "step-00000010-a0002",
    ]
    assert store.get_bytes("step-00000010-a0001/checkpoint.pt") == b"first"


def test_an_object_that_does_not_match_its_manifest_is_refused(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 3, b"abc", sha256="0" * 64)
    with pytest.raises(StagedCheckpointInvalid, match="does not match"):
        commit_staged(staging, 3, store, attempt=1)
    assert store.list() == []


def test_a_link_to_a_file_outside_the_staging_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "runner-secret"
    secret.write_bytes(b"s3 keys")
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, b"s3 keys")
    target = staging / "step-00000001" / "checkpoint.pt"
    target.unlink()
    os.symlink(secret, target)
    with pytest.raises(StagedCheckpointInvalid):
        commit_staged(staging, 1, store, attempt=1)
    assert store.list() == []


@pytest.mark.parametrize("which", ["checkpoint.pt", "manifest.json"])
def test_a_hard_link_to_a_file_outside_the_staging_folder_is_refused(
    tmp_path: Path, which: str
) -> None:
    """A hard link resolves inside the folder, yet is another file's: where the kernel lets
    a user link files of others (fs.protected_hardlinks=0), a job could have the runner
    upload a file it cannot read into its own prefix, and read it back on resume."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, b"s3 keys")
    staged = staging / "step-00000001" / which
    secret = tmp_path / "runner-secret"
    secret.write_bytes(staged.read_bytes())
    staged.unlink()
    os.link(secret, staged)
    with pytest.raises(StagedCheckpointInvalid, match="hard link"):
        commit_staged(staging, 1, store, attempt=1)
    assert store.list() == []


@pytest.mark.parametrize(
    "object_key", ["../../runner-secret", "step-00000002/checkpoint.pt", "other/checkpoint.pt"]
)
def test_a_manifest_naming_another_object_is_refused(tmp_path: Path, object_key: str) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, object=object_key)
    with pytest.raises(StagedCheckpointInvalid):
        commit_staged(staging, 1, store, attempt=1)


def test_resume_stages_the_newest_checkpoint_that_verifies(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    for step, data in ((5, b"five"), (9, b"nine")):
        stage(staging, step, data)
        commit_staged(staging, step, store, attempt=1)
    # The newest one is tampered with after its manifest was written.
    store.put_bytes("step-00000009-a0001/checkpoint.pt", b"zeroed")
    resume = tmp_path / "resume"
    ref = stage_resume(store, resume)
    assert ref is not None and ref.step == 5
    assert ref.uri == store.uri_for("step-00000005-a0001/checkpoint.pt")
    assert (resume / "step-00000005" / "checkpoint.pt").read_bytes() == b"five"
    local = json.loads((resume / "step-00000005" / "manifest.json").read_text())
    assert local["object"] == "step-00000005/checkpoint.pt"
    assert not (resume / "step-00000009").exists()


def test_a_checkpoint_the_store_cannot_serve_now_is_not_skipped_for_an_older_one(
    tmp_path: Path,
) -> None:
    """A store folder on a mount that times out raised an OSError (TimeoutError) that was
    taken for an unusable checkpoint: the job resumed from an older step, its newer ones
    lost to a passing outage. The error is raised now (the grant comes again)."""
    staging = tmp_path / "staging"

    class NotAnswering(LocalStore):
        def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
            if key.startswith("step-00000009"):
                raise TimeoutError(110, "Connection timed out")
            super().get_file(key, path, max_bytes=max_bytes)

    store = NotAnswering(tmp_path / "store")
    for step in (5, 9):
        stage(staging, step)
        commit_staged(staging, step, store, attempt=1)
    with pytest.raises(TimeoutError):
        stage_resume(store, tmp_path / "resume")


def test_resume_reads_the_older_layout_and_skips_broken_manifests(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = b"old"
    store.put_bytes("step-00000001/checkpoint.pt", data)
    manifest = {
        "step": 1,
        "object": "step-00000001/checkpoint.pt",
        "size_bytes": 3,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    store.put_bytes("step-00000001/manifest.json", json.dumps(manifest).encode())
    store.put_bytes("step-00000002/manifest.json", b"{not json")
    store.put_bytes(
        "step-00000003/manifest.json", json.dumps(manifest | {"object": "../x"}).encode()
    )
    ref = stage_resume(store, tmp_path / "resume")
    assert ref is not None and ref.step == 1


def test_no_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    assert stage_resume(LocalStore(tmp_path / "store"), tmp_path / "resume") is None


def test_retention_keeps_the_newest_and_protected_ones(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    for step in range(1, 7):
        stage(staging, step, f"s{step}".encode())
        commit_staged(staging, step, store, attempt=1)
    protected = {store.uri_for("step-00000001-a0001/checkpoint.pt")}
    assert apply_retention(store, 2, protected) == 3
    assert [s for s, _, _ in complete_folders(store)] == [1, 5, 6]
    assert store.list("step-00000002") == []


def stage_sparse(staging: Path, step: int, apparent: int, tail: bytes) -> bytes:
    """A sparse object: a hole of ``apparent - len(tail)`` bytes, then ``tail``; returns
    the bytes it reads as (what its manifest describes)."""
    folder = staging / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "checkpoint.pt").open("wb") as handle:
        handle.seek(apparent - len(tail))
        handle.write(tail)
    digest = hashlib.sha256()
    digest.update(bytes(apparent - len(tail)))
    digest.update(tail)
    manifest = {
        "step": step,
        "object": f"step-{step:08d}/checkpoint.pt",
        "size_bytes": apparent,
        "sha256": digest.hexdigest(),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return tail


def test_a_sparse_checkpoint_counts_its_holes_against_the_cap(tmp_path: Path) -> None:
    # 64 MiB to read, hash and upload, though the disk holds a few bytes of it.
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage_sparse(staging, 1, 64 * 1024**2, b"end")
    with pytest.raises(StagedCheckpointInvalid, match=r"67108864 bytes \(its apparent size"):
        commit_staged(staging, 1, store, attempt=1, max_bytes=1024**2)
    assert store.list() == []


def test_an_object_of_another_size_than_its_manifest_says_is_refused_unread(
    tmp_path: Path,
) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 2, b"abc", size_bytes=2)
    with pytest.raises(StagedCheckpointInvalid, match="is 3 bytes, its manifest says 2"):
        commit_staged(staging, 2, store, attempt=1)
    assert store.list() == []


def test_a_sparse_checkpoint_within_the_cap_is_copied_with_its_holes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    apparent = 256 * 1024**2
    stage_sparse(staging, 3, apparent, b"weights")
    copies: list[os.stat_result] = []
    real_put = store.put_file

    def put_file(key: str, path: Path) -> None:
        copies.append(path.stat())  # the runner's private copy, before it is uploaded
        real_put(key, path)

    monkeypatch.setattr(store, "put_file", put_file)
    ref = commit_staged(staging, 3, store, attempt=1)
    assert ref.size_bytes == apparent
    [copy] = copies
    assert copy.st_size == apparent
    assert copy.st_blocks * 512 < 1024**2, "the private copy was written dense"


def test_a_checkpoint_larger_than_the_allowance_is_refused_before_its_download(
    tmp_path: Path,
) -> None:
    """Its manifest gives its size: a checkpoint over ``max_bytes`` (the job's disk
    allowance) raised nothing and was downloaded whole, filling the node's disk. It is
    refused now, naming the step and both sizes, and nothing is downloaded; an older one
    that fits is not taken instead (the job would lose its newer steps unsaid)."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 5, b"x" * 10)
    commit_staged(staging, 5, store, attempt=1)
    stage(staging, 9, b"x" * 4096)
    commit_staged(staging, 9, store, attempt=1)
    resume = tmp_path / "resume"
    with pytest.raises(ResumeTooLarge) as refused:
        stage_resume(store, resume, max_bytes=4095)
    assert (refused.value.step, refused.value.size_bytes, refused.value.max_bytes) == (
        9,
        4096,
        4095,
    )
    assert not resume.exists() or list(resume.rglob("*.pt")) == []
    ref = stage_resume(store, resume, max_bytes=4096)  # one that fits is staged as ever
    assert ref is not None and ref.step == 9


def test_no_more_of_a_checkpoint_is_read_than_its_manifest_says(tmp_path: Path) -> None:
    """The allowance is checked against the manifest's size: a manifest that understated
    its object (3 MiB, said to be 4096 bytes, over an allowance of 1 MiB) had the runner
    download the whole object before the size check skipped it. The store is now asked
    for no more than the manifest says (a manifest for no more than ``MAX_MANIFEST_BYTES``),
    so the object is refused unread and an older checkpoint is taken, as for any object
    that does not match its manifest."""
    reads: list[tuple[str, int | None]] = []

    class Recording(LocalStore):
        def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
            reads.append((key, max_bytes))
            super().get_file(key, path, max_bytes=max_bytes)

        def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
            reads.append((key, max_bytes))
            return super().get_bytes(key, max_bytes=max_bytes)

    staging, store = tmp_path / "staging", Recording(tmp_path / "store")
    stage(staging, 5, b"five")
    commit_staged(staging, 5, store, attempt=1)
    stage(staging, 9, b"x" * 4096)
    commit_staged(staging, 9, store, attempt=1)
    store.put_bytes("step-00000009-a0001/checkpoint.pt", b"x" * (3 * 1024 * 1024))
    reads.clear()
    resume = tmp_path / "resume"
    ref = stage_resume(store, resume, max_bytes=1024 * 1024)
    assert ref is not None and ref.step == 5
    assert ("step-00000009-a0001/checkpoint.pt", 4096) in reads
    assert ("step-00000009-a0001/manifest.json", MAX_MANIFEST_BYTES) in reads
    assert None not in {bound for _, bound in reads}
    assert not (resume / "step-00000009").exists()
