"""Checkpoints between a job's staging folder and the object store; the job holds no keys.

Store layout, under ``jobs/<job_id>/checkpoints/`` (the job's own prefix)::

    step-00000100-a0002/checkpoint.pt    the object, as the job wrote it
    step-00000100-a0002/manifest.json    size, sha256 and the object's key (relative to
                                         the prefix), written by the runner *last*

The attempt in the folder name keeps two attempts that both reach step 100 from ever
writing the same keys. A checkpoint is complete when its manifest names an object that
exists; folders of the older layout (``step-00000100/``) are read too.

Staging, in the job's sandbox: the SDK writes ``step-<n>/checkpoint.pt`` then
``step-<n>/manifest.json`` and sends a ``CheckpointMessage``. ``commit_staged`` reads
*only* that step folder of the staging root, refuses links (hard links too) and anything
that resolves outside it (the job owns the folder and could point a file anywhere the runner
can read),
copies the object to a private file while hashing it, checks size and sha256 against the
manifest, uploads object then manifest, and removes the staged folder.

Size. A checkpoint's size is its apparent size (``st_size``), whatever the disk holds of
it: a sparse file of 10 GiB written with one ``seek`` is 10 GiB read, hashed and uploaded.
So the object is refused before a byte is read when that size differs from its manifest's
or exceeds ``max_bytes`` (``TRAINYARD_RUNNER_MAX_CHECKPOINT_BYTES``), and when it grows or
shrinks while read. The private copy keeps the holes as holes (``SEEK_DATA``/``SEEK_HOLE``),
so it takes no more of the runner's disk than the staged file takes of the job's.

``stage_resume`` is the way back: it downloads the newest complete checkpoint whose object
matches its manifest into the staging folder, in the SDK's layout, so the job restores
exactly what the runner verified, and ``resumed_from`` names what was really loaded. A
checkpoint the store cannot serve now (an outage: ``bus.infrastructure_fault``, such as a
store folder on a mount that does not answer) is no unusable checkpoint: the error is
raised, and the launch fetches again once the store answers, rather than the job
resuming from an older one. Nor is one larger by its manifest than the job's disk allowance
(``ResumeTooLarge``, before any download): the job fails as its own fault. Nothing is read
past what its manifest says (nor a manifest past ``MAX_MANIFEST_BYTES``): an object larger
than its manifest is unusable after at most that much more of it, never downloaded whole.

Each ``commit_staged`` is a ``checkpoint upload`` span (kind ``CLIENT``) in the job's trace
(``parent``: the context its events are published in): the job id, step and attempt, the
object's key in the store (``jobs/<job_id>/checkpoints/step-.../checkpoint.pt``: a key, never
a URI or a credential), its size in bytes once read, and the ERROR status with the error when
the upload (or the check before it) fails; each retry of a failed upload is a span of its own.

Blocking store and file calls: run them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.events.payloads import CheckpointRef
from trainyard_platform.shared.metrics import instrument
from trainyard_platform.shared.storage import (
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    validate_key,
)
from trainyard_platform.shared.telemetry import tracer

log = logging.getLogger(__name__)
_tracer = tracer(__name__)

OBJECT_NAME = "checkpoint.pt"
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 1024
MAX_CHECKPOINT_BYTES = 256 * 1024**3
"""Default of ``max_bytes``: the largest checkpoint object (apparent size) committed."""
_STORE_FOLDER = re.compile(r"^step-(\d{8,})(?:-a(\d{4,}))?/manifest\.json$")
_CHUNK = 1024 * 1024


class StagedCheckpointInvalid(ValueError):
    """What the job staged is not a checkpoint the runner will upload (the message says
    why); the job's earlier checkpoints are unaffected."""


class Manifest(BaseModel):
    """The fields of the SDK's manifest the runner relies on (others are kept as is)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    step: int = Field(ge=0)
    object: str
    size_bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/checkpoints"


def store_folder(step: int, attempt: int) -> str:
    return f"step-{step:08d}-a{attempt:04d}"


def staged_folder(step: int) -> str:
    """The SDK's folder name for ``step`` (``trainyard.sdk.checkpoints.step_folder``)."""
    return f"step-{step:08d}"


# --- job -> store --------------------------------------------------------------------


_upload_seconds = instrument("trainyard.runner.checkpoint.upload.duration")
_upload_bytes = instrument("trainyard.runner.checkpoint.upload.bytes")


def commit_staged(
    staging: Path,
    step: int,
    store: ObjectStore,
    attempt: int,
    *,
    job_id: str | None = None,
    parent: otel_context.Context | None = None,
    max_bytes: int = MAX_CHECKPOINT_BYTES,
) -> CheckpointRef:
    """Verify the staged checkpoint of ``step`` and upload it to ``store`` (job ``job_id``'s
    checkpoint prefix), in a ``checkpoint upload`` span child of ``parent`` (the module; a
    key relative to the store, and no job id, when ``job_id`` is None). An object of more
    than ``max_bytes`` (apparent size) is refused unread.
    Raises ``StagedCheckpointInvalid`` for anything the job got wrong."""
    key = f"{store_folder(step, attempt)}/{OBJECT_NAME}"
    attributes: dict[str, str | int] = {
        "trainyard.checkpoint.step": step,
        "trainyard.checkpoint.attempt": attempt,
        "trainyard.checkpoint.key": key if job_id is None else f"{job_prefix(job_id)}/{key}",
    }
    if job_id is not None:
        attributes["trainyard.job_id"] = job_id
    with _tracer.start_as_current_span(
        "checkpoint upload", context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        ref = _commit_staged(staging, step, store, attempt, max_bytes)
        span.set_attribute("trainyard.checkpoint.size_bytes", ref.size_bytes)
        return ref


def _commit_staged(
    staging: Path, step: int, store: ObjectStore, attempt: int, max_bytes: int
) -> CheckpointRef:
    folder = staging / staged_folder(step)
    manifest_bytes = _read_confined(staging, folder / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    try:
        manifest = Manifest.model_validate_json(manifest_bytes)
        object_key = validate_key(manifest.object)
    except (ValidationError, ValueError) as exc:
        raise StagedCheckpointInvalid(f"manifest of step {step} is invalid: {exc}") from None
    # The SDK names the object relative to the checkpoint root: it must be in this step's
    # folder, one level down, and nowhere else.
    inside = object_key.removeprefix(staged_folder(step) + "/")
    if manifest.step != step or inside == object_key or "/" in inside:
        raise StagedCheckpointInvalid(
            f"manifest of step {step} names step {manifest.step}, object {object_key!r}"
        )
    target = store_folder(step, attempt)
    object_key = f"{target}/{OBJECT_NAME}"
    manifest_key = f"{target}/{MANIFEST_NAME}"
    with tempfile.TemporaryDirectory(prefix="trainyard-commit-") as private:
        copy = Path(private) / OBJECT_NAME
        size, digest = _copy_confined(
            staging, folder / inside, copy, manifest.size_bytes, max_bytes
        )
        if (size, digest) != (manifest.size_bytes, manifest.sha256):
            raise StagedCheckpointInvalid(
                f"checkpoint of step {step} does not match its manifest: {size} bytes, "
                f"sha256 {digest[:12]} (manifest: {manifest.size_bytes}, {manifest.sha256[:12]})"
            )
        uploading = time.perf_counter()
        store.put_file(object_key, copy)
        _upload_seconds.record(time.perf_counter() - uploading)
        _upload_bytes.record(size)
    committed = manifest.model_dump(mode="json") | {
        "object": object_key,
        "attempt": attempt,
        "committed_at": datetime.now(UTC).isoformat(),
    }
    # Only now, with the object fully stored, does the checkpoint become visible.
    store.put_bytes(manifest_key, json.dumps(committed, indent=2).encode())
    shutil.rmtree(folder, ignore_errors=True)
    return CheckpointRef(
        uri=store.uri_for(object_key),
        manifest_uri=store.uri_for(manifest_key),
        step=step,
        size_bytes=size,
        sha256=digest,
    )


def _open_confined(root: Path, path: Path) -> int:
    """An fd of the regular file ``path``, which must really lie under ``root``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise StagedCheckpointInvalid(f"cannot open {path.name}: {exc.strerror}") from None
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}")) if Path("/proc/self/fd").is_dir() else None
        if real is None:
            real = path.resolve()
        if not real.is_relative_to(root.resolve()):
            raise StagedCheckpointInvalid(f"{path.name} lies outside the staging folder")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StagedCheckpointInvalid(f"{path.name} is not a regular file")
        # A hard link lies inside the folder and is another file all the same (one the job
        # may not read, where the kernel lets users link others' files): never uploaded.
        if st.st_nlink != 1:
            raise StagedCheckpointInvalid(
                f"{path.name} is a hard link ({st.st_nlink} names): stage a file of its own"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_confined(root: Path, path: Path, limit: int) -> bytes:
    fd = _open_confined(root, path)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise StagedCheckpointInvalid(f"{path.name} is larger than {limit} bytes")
    return data


def _copy_confined(
    root: Path, path: Path, dest: Path, expected: int, max_bytes: int
) -> tuple[int, str]:
    """Copy the confined file ``path`` to ``dest``, holes kept as holes; its size and
    sha256. Refused unread when its apparent size is not ``expected`` or exceeds
    ``max_bytes``, and when it changes size while read (module docstring, "Size")."""
    fd = _open_confined(root, path)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise StagedCheckpointInvalid(
                f"{path.name} is {size} bytes (its apparent size, holes of a sparse file "
                f"included); at most {max_bytes} bytes are uploaded"
            )
        if size != expected:
            raise StagedCheckpointInvalid(
                f"{path.name} is {size} bytes, its manifest says {expected}: not read"
            )
        with dest.open("wb") as sink:
            digest = _copy_extents(fd, sink.fileno(), size)
            os.ftruncate(sink.fileno(), size)  # a hole at the end is a hole of the copy too
        if os.pread(fd, 1, size):
            raise StagedCheckpointInvalid(f"{path.name} grew while it was read")
    finally:
        os.close(fd)
    return size, digest


_ZEROS = bytes(_CHUNK)


def _copy_extents(source: int, sink: int, size: int) -> str:
    """Copy the first ``size`` bytes of ``source`` to the same offsets of ``sink``, writing
    only its data extents; the sha256 of all ``size`` bytes (a hole hashes as zeros)."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        data = min(_seek(source, offset, os.SEEK_DATA, size), size)
        while offset < data:  # a hole: zeros, not read, not written
            step = min(_CHUNK, data - offset)
            digest.update(_ZEROS[:step])
            offset += step
        hole = min(_seek(source, offset, os.SEEK_HOLE, size), size)
        while offset < hole:
            chunk = os.pread(source, min(_CHUNK, hole - offset), offset)
            if not chunk:
                raise StagedCheckpointInvalid("the checkpoint shrank while it was read")
            digest.update(chunk)
            os.pwrite(sink, chunk, offset)
            offset += len(chunk)
    return digest.hexdigest()


def _seek(fd: int, offset: int, whence: int, size: int) -> int:
    """``lseek`` for ``SEEK_DATA``/``SEEK_HOLE``; ``size`` past the last data (``ENXIO``)."""
    try:
        return os.lseek(fd, offset, whence)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return size
        if exc.errno == errno.EINVAL:  # a file system without them: all of it is data
            return offset if whence == os.SEEK_DATA else size
        raise


# --- store -> job --------------------------------------------------------------------


def complete_folders(store: ObjectStore) -> list[tuple[int, int, str]]:
    """``(step, attempt, folder)`` of every checkpoint with a manifest, oldest first."""
    found = []
    for key in store.list("step-"):
        match = _STORE_FOLDER.match(key)
        if match:
            found.append((int(match.group(1)), int(match.group(2) or 0), key.rsplit("/", 1)[0]))
    return sorted(found)


class ResumeTooLarge(Exception):
    """The newest usable checkpoint is larger, by its manifest, than the job may hold on
    disk (``max_bytes`` of ``stage_resume``): it is not downloaded."""

    def __init__(self, step: int, size_bytes: int, max_bytes: int) -> None:
        super().__init__(f"checkpoint of step {step} is {size_bytes} bytes, over {max_bytes}")
        self.step = step
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


def stage_resume(
    store: ObjectStore, staging: Path, max_bytes: int | None = None
) -> CheckpointRef | None:
    """Download the newest checkpoint that matches its manifest into ``staging`` (the SDK's
    layout); returns its reference in the store, or None when there is none. One whose
    manifest says more than ``max_bytes`` (None: no bound) raises ``ResumeTooLarge`` before
    a byte of it is downloaded; no older one is taken instead, which would drop the job's
    newer steps unsaid."""
    for step, _attempt, folder in reversed(complete_folders(store)):
        try:
            manifest = Manifest.model_validate_json(
                store.get_bytes(f"{folder}/{MANIFEST_NAME}", max_bytes=MAX_MANIFEST_BYTES)
            )
            object_key = validate_key(manifest.object)
            if max_bytes is not None and manifest.size_bytes > max_bytes:
                raise ResumeTooLarge(step, manifest.size_bytes, max_bytes)
            local = staging / staged_folder(step)
            # Read no more than the manifest says: a larger object cannot match it, and
            # may be larger than the job's disk allowance, which its manifest's size met.
            store.get_file(object_key, local / OBJECT_NAME, max_bytes=manifest.size_bytes)
            size = (local / OBJECT_NAME).stat().st_size
            digest = file_sha256(local / OBJECT_NAME)
        except (ObjectNotFound, ObjectTooLarge, ValidationError, ValueError, OSError) as exc:
            if isinstance(exc, OSError) and infrastructure_fault(exc) is not None:
                raise  # the store not answering now: not a reason to lose the newer steps
            log.warning("checkpoint %s is unusable, trying an older one: %s", folder, exc)
            shutil.rmtree(staging / staged_folder(step), ignore_errors=True)
            continue
        if (size, digest) != (manifest.size_bytes, manifest.sha256):
            log.warning(
                "checkpoint %s does not match its manifest (%d bytes, sha256 %s): skipped",
                folder,
                size,
                digest[:12],
            )
            shutil.rmtree(local, ignore_errors=True)
            continue
        local_manifest = manifest.model_dump(mode="json") | {
            "object": f"{staged_folder(step)}/{OBJECT_NAME}"
        }
        (local / MANIFEST_NAME).write_text(json.dumps(local_manifest))
        return CheckpointRef(
            uri=store.uri_for(object_key),
            manifest_uri=store.uri_for(f"{folder}/{MANIFEST_NAME}"),
            step=step,
            size_bytes=size,
            sha256=digest,
        )
    return None


def apply_retention(store: ObjectStore, keep: int, protected: set[str]) -> int:
    """Delete all but the newest ``keep`` complete checkpoints (never one whose object URI
    is in ``protected``, e.g. the one a job resumed from); returns how many were deleted."""
    folders = complete_folders(store)
    deleted = 0
    for _step, _attempt, folder in folders[: max(0, len(folders) - keep)]:
        if store.uri_for(f"{folder}/{OBJECT_NAME}") in protected:
            continue
        # The manifest first: a checkpoint without one is incomplete, never half-deleted.
        store.delete(f"{folder}/{MANIFEST_NAME}")
        for key in store.list(f"{folder}/"):
            store.delete(key)
        deleted += 1
    return deleted


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
