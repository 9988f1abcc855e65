"""The registry's own copies of artifacts: made at registration, verified whenever served.

Contract:
- ``source_key`` turns a committed checkpoint's URI into its key in the registry's store. A
  URI outside the store's root, or inside the registry's own prefix, is refused
  (``SourceOutsideStore``): the registry copies only job checkpoints of its own store, and
  for a registration only one of the registered job's own (``jobs/<job>/checkpoints/``).
- ``copy_verified`` copies the checkpoint server-side (``ObjectStore.copy``) to a key the
  registry owns, then hashes the *copy*; unless its size and sha256 are what the job
  committed, the copy is deleted and ``ArtifactMismatch`` raised. A checkpoint overwritten
  after it was committed is never registered, and one overwritten after registration does
  not touch the copy. A checkpoint no longer in the store (freed by retention since it was
  committed) raises ``CheckpointGone``, naming it; nothing is copied.
- ``fetch_verified`` downloads an owned artifact to a private temporary file and hashes it;
  a sha256 or size other than the one registered raises ``ArtifactCorrupt`` (logged at
  ERROR), and the file is removed. Neither reads more of an object than the size it should
  have: a larger one is refused after at most a read's chunk more, never downloaded whole. The caller serves that very file (or, for a presigned
  URL, signs the object only after this check), so bytes that fail the check never leave.
- Every function here blocks (object I/O and hashing): call them through
  ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainyard_platform.services.registry.names import REGISTRY_PREFIX
from trainyard_platform.shared.storage import (
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    key_in_store,
)

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024


class SourceOutsideStore(ValueError):
    """The checkpoint's URI does not name a job object of the registry's store."""


class ArtifactMismatch(ValueError):
    """The checkpoint's bytes are not the ones its job committed (changed since)."""


class CheckpointGone(ValueError):
    """The checkpoint was committed, but the store no longer holds it (deleted since)."""


class ArtifactCorrupt(RuntimeError):
    """A registered artifact's bytes no longer match its recorded sha256 or size."""


@dataclass(frozen=True)
class Digest:
    size_bytes: int
    sha256: str


def source_key(store: ObjectStore, uri: str, job_id: str | None = None) -> str:
    """The key of ``uri`` in ``store`` (see the module docstring); with ``job_id``, only a
    key under that job's own checkpoints (``jobs/<job_id>/checkpoints/``, where its runner
    commits them), so no report can make another job's object this job's model."""
    key = key_in_store(store, uri)
    if key is None or key.startswith(REGISTRY_PREFIX):
        raise SourceOutsideStore(
            f"checkpoint {uri!r} is not a job's object in the object store {store.root_uri!r}"
        )
    if job_id is not None and not key.startswith(f"jobs/{job_id}/checkpoints/"):
        raise SourceOutsideStore(f"checkpoint {uri!r} is not one of job {job_id}'s checkpoints")
    return key


def digest_file(path: Path) -> Digest:
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return Digest(size, sha.hexdigest())


def copy_verified(store: ObjectStore, src: str, dst: str, expected: Digest) -> Digest:
    """Copy ``src`` to ``dst`` and check the copy against ``expected`` (module docstring)."""
    try:
        store.copy(src, dst)
    except ObjectNotFound:
        raise CheckpointGone(
            f"checkpoint {store.uri_for(src)} is no longer in the object store: it was deleted "
            "after it was committed (freed by checkpoint retention, or by hand)"
        ) from None
    try:
        with tempfile.TemporaryDirectory(prefix="registry-copy-") as folder:
            local = Path(folder) / "artifact"
            try:
                store.get_file(dst, local, max_bytes=expected.size_bytes)
            except ObjectTooLarge as exc:
                raise ArtifactMismatch(
                    f"checkpoint {store.uri_for(src)} is {exc.size}, not the "
                    f"{expected.size_bytes} bytes its job committed: it changed after it was "
                    "committed"
                ) from None
            got = digest_file(local)
        if got != expected:
            raise ArtifactMismatch(
                f"checkpoint {store.uri_for(src)} is {got.size_bytes} bytes with sha256 "
                f"{got.sha256}, not the {expected.size_bytes} bytes with sha256 "
                f"{expected.sha256} its job committed: it changed after it was committed"
            )
    except BaseException:
        store.delete(dst)
        raise
    return got


def fetch_verified(store: ObjectStore, key: str, expected: Digest) -> Path:
    """A private temporary file holding the artifact under ``key``, verified against
    ``expected``; the caller removes it (``discard``). ``ArtifactCorrupt`` on a mismatch."""
    folder = Path(tempfile.mkdtemp(prefix="registry-serve-"))
    local = folder / "artifact"
    try:
        # Never more than was registered: a larger object is no longer the artifact.
        store.get_file(key, local, max_bytes=expected.size_bytes)
        got = digest_file(local)
    except ObjectTooLarge as exc:
        shutil.rmtree(folder, ignore_errors=True)
        log.error(
            "artifact %s failed its integrity check: %s; registered %d bytes; not served",
            store.uri_for(key),
            exc.size,
            expected.size_bytes,
        )
        raise _corrupt(expected) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if got != expected:
        shutil.rmtree(folder, ignore_errors=True)
        log.error(
            "artifact %s failed its integrity check: %d bytes, sha256 %s; registered %d "
            "bytes, sha256 %s; not served",
            store.uri_for(key),
            got.size_bytes,
            got.sha256,
            expected.size_bytes,
            expected.sha256,
        )
        raise _corrupt(expected)
    return local


def _corrupt(expected: Digest) -> ArtifactCorrupt:
    return ArtifactCorrupt(
        f"the stored artifact no longer matches its registered sha256 {expected.sha256} "
        "(it was changed or damaged in the object store); it is not served"
    )


def discard(path: Path) -> None:
    """Remove a file ``fetch_verified`` made, with its private folder."""
    shutil.rmtree(path.parent, ignore_errors=True)
