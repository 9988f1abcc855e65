"""Checkpoints between a job's staging folder and the object store; the job holds no keys.

Store layout, under ``jobs/<job_id>/checkpoints/`` (the job's own prefix)::

    step-00000100-a0002/checkpoint.pt    the object, as the job wrote it
    step-00000100-a0002/manifest.json    size, sha256 and the object's key (relative to
                                         the prefix), written by the runner *last*
    step-00000100-a0002/resumed-a0003    empty: attempt 3 resumed from this checkpoint
    step-00000100-a0002/succeeded-a0002  empty: attempt 2 succeeded with it as its artifact

The attempt in the folder name keeps two attempts that both reach step 100 from ever
writing the same keys. A checkpoint is complete when its manifest names an object that
exists; folders of the older layout (``step-00000100/``) are read too.

Staging, in the job's sandbox: the SDK writes ``step-<n>/checkpoint.pt`` then
``step-<n>/manifest.json`` and sends a ``CheckpointMessage``. ``commit_staged`` reads
*only* that step folder of the staging root, refuses links (hard links too) and anything
that resolves outside it (the job owns the folder and could point a file anywhere the runner
can read),
copies the object to a private file while hashing it (the job could change the staged file
while it is uploaded), checks size and sha256 against the manifest, uploads object then
manifest, and removes the staged folder. The private file lies in ``scratch``, a folder of
the runner's on the disk its operator sized for jobs (the supervisor's ``jobs/<job>/``),
never in the host's temporary folder: that may be memory (a ``tmpfs``, charged to the
runner's own cgroup) or a container's writable layer (the node's root disk), and a
checkpoint is up to ``max_bytes``. A copy a runner that died left there (``COPY_PREFIX``)
is removed by the next one before it accepts work (``remove_leftover_copies``): no upload
is under way then, and nothing else would ever remove it.

Size. A checkpoint's size is its apparent size (``st_size``), whatever the disk holds of
it: a sparse file of 10 GiB written with one ``seek`` is 10 GiB read, hashed and uploaded.
So the object is refused before a byte is read when that size differs from its manifest's
or exceeds ``max_bytes`` (``TRAINYARD_RUNNER_MAX_CHECKPOINT_BYTES``), and when it grows or
shrinks while read. The private copy keeps the holes as holes (``SEEK_DATA``/``SEEK_HOLE``),
so it takes no more of the runner's disk than the staged file takes of the job's.

``stage_resume`` is the way back, and the store chooses nothing in it: every runner node
can write any key of the store, so a newer folder under a job's prefix, and a manifest that
matches its object, may be another node's. The checkpoint restored is the one the grant
names (``AllocationGranted.resume``: the newest the job's own allocations reported
committed, ``checkpoint.saved``), downloaded into the staging folder in the SDK's layout and
verified against the size and sha256 of that report, never of the store's manifest. One that
is missing or is other bytes is refused (``ResumeRefused``), and no other is taken instead;
one larger than the job's disk allowance is refused before its download
(``ResumeTooLarge``); no more of an object is read than the grant says it holds. A store
that cannot serve it now (an outage: ``bus.infrastructure_fault``, such as a store folder
on a mount that does not answer) raises as it is, and the launch fetches again once the
store answers.

Retention deletes whole folders, manifest first, and only under the job's prefix:
``apply_retention`` at an attempt's end, among the checkpoints the job committed (never by
the listing), and ``prune_earlier_attempts`` at the start of an attempt that resumes, among
the folders earlier attempts left older than the one it resumed from (by the listing: see
there). A folder a later attempt marked resumed is never deleted by an earlier attempt,
and one an attempt succeeded with (``mark_succeeded``) by none.

An upload given up (``Upload.cancel``: the job's end waited for it as long as it may, and
reports the checkpoint lost) and the store agree: a checkpoint is in the store for every
reader exactly when its manifest is (see above: ``prune_earlier_attempts`` counts the
folders with one, ``stage_resume`` takes only what was reported saved), and the manifest
of an upload given up is never written. The object itself cannot be stopped
halfway (a thread cannot be killed, and the store's ``put_file`` has no way to stop
between parts), so ``commit_staged`` looks at the ``Upload`` before its copy, and after
the object's upload, when it deletes the object it stored and raises ``UploadCancelled``.
Whichever comes first of the give-up and the start of the manifest's upload decides, once
(``Upload``): a give-up that comes after it is refused, and its giver waits for that one
small upload to end and reports what it did. An object left without a manifest (by a
runner that died meanwhile, or a delete the store failed) is no checkpoint to any reader;
no ``checkpoint.saved`` names it, so the registry's storage collector deletes it as
unreferenced.

Each ``commit_staged`` is a ``checkpoint upload`` span (kind ``CLIENT``) in the job's trace
(``parent``: the context its events are published in): the job id, step and attempt, the
object's key in the store (``jobs/<job_id>/checkpoints/step-.../checkpoint.pt``: a key, never
a URI or a credential), its size in bytes once read, and the ERROR status with the error when
the upload (or the check before it) fails; each retry of a failed upload is a span of its own.

Blocking store and file calls: run them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard_platform.shared.events.payloads import CheckpointRef
from trainyard_platform.shared.http_errors import field_errors
from trainyard_platform.shared.metrics import instrument
from trainyard_platform.shared.storage import (
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    key_in_store,
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


class UploadCancelled(Exception):
    """The upload was given up (``Upload.cancel``) before its manifest was written: nothing
    of the checkpoint is left in the store (its object deleted where it had landed)."""


class Upload:
    """The fate of one ``commit_staged``, shared by the thread that uploads and the one that
    may give up waiting for it, decided once: given up (``cancel``, before the manifest's
    upload began) or published (``publish``: the manifest's upload begins), never both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "uploading"

    @property
    def cancelled(self) -> bool:
        return self._state == "cancelled"

    def cancel(self) -> bool:
        """Give the upload up: its manifest will never be written. False, changing nothing,
        when it is too late: the manifest's upload began (wait for the upload's end, which
        says whether the checkpoint is in the store)."""
        with self._lock:
            if self._state == "published":
                return False
            self._state = "cancelled"
            return True

    def publish(self) -> bool:
        """Begin the manifest's upload; False when the upload was given up."""
        with self._lock:
            if self._state == "cancelled":
                return False
            self._state = "published"
            return True


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
    scratch: Path | None = None,
    upload: Upload | None = None,
) -> CheckpointRef:
    """Verify the staged checkpoint of ``step`` and upload it to ``store`` (job ``job_id``'s
    checkpoint prefix), in a ``checkpoint upload`` span child of ``parent`` (the module; a
    key relative to the store, and no job id, when ``job_id`` is None). An object of more
    than ``max_bytes`` (apparent size) is refused unread. Its private copy is made in
    ``scratch`` (made when missing; None: the host's temporary folder, for tests), and is
    removed only once nothing more of this upload is done to the object in the store.
    Raises ``StagedCheckpointInvalid`` for anything the job got wrong, and
    ``UploadCancelled``, with nothing of it left in the store, once ``upload`` (None: never)
    was given up before its manifest's upload began (the module, "given up")."""
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
        ref = _commit_staged(staging, step, store, attempt, max_bytes, scratch, upload or Upload())
        span.set_attribute("trainyard.checkpoint.size_bytes", ref.size_bytes)
        return ref


COPY_PREFIX = "trainyard-commit-"
"""The folders ``commit_staged`` makes in ``scratch`` for its private copy start so."""


def remove_leftover_copies(jobs: Path) -> int:
    """Remove the private copies (``COPY_PREFIX`` folders) a runner that died while it
    uploaded left in the folders of ``jobs`` (the runner's ``jobs/<job>/``: its own, no job
    writes there), then each folder they leave empty; returns how many it removed. Only
    while no upload is under way: at the runner's start."""
    removed = 0
    for copy in jobs.glob(f"*/{COPY_PREFIX}*"):
        if copy.is_dir() and not copy.is_symlink():
            shutil.rmtree(copy, ignore_errors=True)
            removed += 1
            with contextlib.suppress(OSError):  # not empty: an attempt's log is there
                copy.parent.rmdir()
    return removed


def _commit_staged(
    staging: Path,
    step: int,
    store: ObjectStore,
    attempt: int,
    max_bytes: int,
    scratch: Path | None,
    upload: Upload,
) -> CheckpointRef:
    if upload.cancelled:
        raise UploadCancelled(f"checkpoint of step {step}: its upload was given up")
    folder = staging / staged_folder(step)
    manifest_bytes = _read_confined(staging, folder / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    try:
        manifest = Manifest.model_validate_json(manifest_bytes)
    except ValidationError as exc:
        # The job's failure reason, read by its user: each field and why, in plain words.
        said = "; ".join(
            e.message if e.field == "body" else f"{e.field}: {e.message}" for e in field_errors(exc)
        )
        raise StagedCheckpointInvalid(f"manifest of step {step} is invalid: {said}") from None
    try:
        object_key = validate_key(manifest.object)
    except ValueError as exc:
        raise StagedCheckpointInvalid(
            f"manifest of step {step} is invalid: object: {exc}"
        ) from None
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
    if scratch is not None:
        scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=COPY_PREFIX, dir=scratch) as private:
        copy = Path(private) / OBJECT_NAME
        size, digest = _copy_confined(
            staging, folder / inside, copy, manifest.size_bytes, max_bytes
        )
        if (size, digest) != (manifest.size_bytes, manifest.sha256):
            raise StagedCheckpointInvalid(
                f"checkpoint of step {step} does not match its manifest: {size} bytes, "
                f"sha256 {digest[:12]} (manifest: {manifest.size_bytes}, {manifest.sha256[:12]})"
            )
        if upload.cancelled:
            raise UploadCancelled(f"checkpoint of step {step}: its upload was given up")
        uploading = time.perf_counter()
        store.put_file(object_key, copy)
        _upload_seconds.record(time.perf_counter() - uploading)
        _upload_bytes.record(size)
        if not upload.publish():
            # Given up while the object went up: reported lost, so the store must not keep
            # it (the private copy goes only after this: the upload is over then).
            store.delete(object_key)
            raise UploadCancelled(
                f"checkpoint of step {step}: its upload was given up; its object was deleted"
            )
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
    """The checkpoint to resume from is larger, by what its job committed, than the job may
    hold on disk (``max_bytes`` of ``stage_resume``): it is not downloaded."""

    def __init__(self, step: int, size_bytes: int, max_bytes: int) -> None:
        super().__init__(f"checkpoint of step {step} is {size_bytes} bytes, over {max_bytes}")
        self.step = step
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class ResumeRefused(Exception):
    """The checkpoint the grant names is not restored (the message says why: not one of
    the job's own checkpoints, missing from the store, or not the bytes its job committed).
    Nothing of it is left in the staging folder, and no other checkpoint is taken instead."""

    def __init__(self, ref: CheckpointRef, why: str) -> None:
        super().__init__(f"checkpoint of step {ref.step} ({ref.uri}) refused: {why}")
        self.ref = ref
        self.why = why


_COMMITTED_OBJECT = re.compile(r"^step-(\d{8,})(?:-a(\d{4,}))?/" + re.escape(OBJECT_NAME) + "$")


def committed_key(store: ObjectStore, ref: CheckpointRef) -> str | None:
    """The key in ``store`` (one job's checkpoint prefix) of the committed object ``ref``
    names: one of ``commit_staged``'s (``step-<ref.step>-.../checkpoint.pt``) right under
    its root, or None for any other URI (another job's, another store's, a manifest,
    another step's folder)."""
    key = key_in_store(store, ref.uri)
    match = None if key is None else _COMMITTED_OBJECT.match(key)
    if match is None or int(match.group(1)) != ref.step:
        return None
    return key


def stage_resume(
    store: ObjectStore,
    ref: CheckpointRef | None,
    staging: Path,
    max_bytes: int | None = None,
    *,
    job_id: str = "",
    attempt: int | None = None,
) -> CheckpointRef | None:
    """Download exactly the checkpoint ``ref`` names (the grant's ``resume``: what the job's
    own allocations reported committed) from ``store`` (the job's checkpoint prefix) into
    ``staging``, in the SDK's layout, and return ``ref``; None, staging nothing, when
    ``ref`` is None. The store's listing and manifests choose nothing: any node can write
    any key, so a newer folder there, or a manifest matching its object, proves nothing.

    Raises, with nothing of it left staged and no other checkpoint taken instead:
    ``ResumeTooLarge`` when ``ref`` is larger than ``max_bytes`` (None: no bound), before
    a byte is read; ``ResumeRefused`` when ``ref`` names no committed object of ``store``,
    when the object is missing, or when its size or sha256 is not ``ref``'s (no more than
    ``ref.size_bytes`` is read). A store that does not answer now raises as it is
    (``bus.infrastructure_fault``).

    ``attempt`` (the attempt resuming; None: none is marked): before the download, the
    checkpoint's folder is marked resumed by it (``resumed_mark``), so that an earlier
    attempt still running (a failover) does not delete it in its end's retention
    (``apply_retention``); the mark goes again when the checkpoint is refused. Left open: a
    retention that read the folder just before the mark was written still deletes it,
    the mark with it (the download is then refused, or the store no longer holds what
    was restored)."""
    if ref is None:
        return None
    key = committed_key(store, ref)
    if key is None:
        raise ResumeRefused(ref, f"not a checkpoint of this job's store {store.root_uri}")
    if max_bytes is not None and ref.size_bytes > max_bytes:
        raise ResumeTooLarge(ref.step, ref.size_bytes, max_bytes)
    local = staging / staged_folder(ref.step)
    mark = None if attempt is None else f"{key.rsplit('/', 1)[0]}/{resumed_mark(attempt)}"
    if mark is not None:
        store.put_bytes(mark, b"")
    try:
        store.get_file(key, local / OBJECT_NAME, max_bytes=ref.size_bytes)
        size = (local / OBJECT_NAME).stat().st_size
        digest = file_sha256(local / OBJECT_NAME)
    except ObjectNotFound:
        shutil.rmtree(local, ignore_errors=True)
        _unmark(store, mark)
        raise ResumeRefused(ref, "it is missing from the store (deleted since)") from None
    except ObjectTooLarge as exc:
        shutil.rmtree(local, ignore_errors=True)
        _unmark(store, mark)
        raise ResumeRefused(
            ref,
            f"the store's object is {exc.size}, not the {ref.size_bytes} bytes the job "
            "committed: it was overwritten since",
        ) from None
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    if (size, digest) != (ref.size_bytes, ref.sha256):
        shutil.rmtree(local, ignore_errors=True)
        _unmark(store, mark)
        raise ResumeRefused(
            ref,
            f"the store's object is {size} bytes with sha256 {digest}, not the "
            f"{ref.size_bytes} bytes with sha256 {ref.sha256} the job committed: it was "
            "overwritten since",
        )
    named = _COMMITTED_OBJECT.match(key)
    local_manifest = {
        "step": ref.step,
        "object": f"{staged_folder(ref.step)}/{OBJECT_NAME}",
        "size_bytes": ref.size_bytes,
        "sha256": ref.sha256,
        # The SDK's manifest has these too. The store's manifest, which any node could have
        # written, is not read: the time is the restore's, the attempt the folder's.
        "created_at": datetime.now(UTC).isoformat(),
        "job_id": job_id,
        "attempt": int(named.group(2) or 0) if named else 0,
    }
    (local / MANIFEST_NAME).write_text(json.dumps(local_manifest))
    return ref


def resumed_mark(attempt: int) -> str:
    """The name of the key, in a checkpoint's folder, that says attempt ``attempt`` resumed
    from it (``stage_resume``; empty)."""
    return f"resumed-a{attempt:04d}"


def succeeded_mark(attempt: int) -> str:
    """The name of the key, in a checkpoint's folder, that says attempt ``attempt``
    succeeded with it as its artifact (``mark_succeeded``; empty)."""
    return f"succeeded-a{attempt:04d}"


_MARK = re.compile(r"^(resumed|succeeded)-a(\d{4,})$")


def _unmark(store: ObjectStore, mark: str | None) -> None:
    if mark is not None:
        store.delete(mark)


def mark_succeeded(store: ObjectStore, ref: CheckpointRef, attempt: int) -> bool:
    """Mark the folder of ``ref``, the artifact attempt ``attempt`` succeeded with, so that
    no attempt's retention deletes it (``held``): a success its node reports late, after a
    later attempt began, is registered from it. False, marking nothing, when ``ref`` names
    no committed object of ``store``."""
    key = committed_key(store, ref)
    if key is None:
        return False
    store.put_bytes(f"{key.rsplit('/', 1)[0]}/{succeeded_mark(attempt)}", b"")
    return True


def _holds(name: str, attempt: int) -> bool:
    """Whether the key ``name`` of a folder keeps it from attempt ``attempt``'s retention:
    a success's mark, or the resumed mark of a later attempt."""
    match = _MARK.match(name)
    if match is None:
        return False
    return match.group(1) == "succeeded" or int(match.group(2)) > attempt


def held(store: ObjectStore, folder: str, attempt: int) -> bool:
    """Whether ``folder`` is kept from attempt ``attempt``'s retention: some attempt
    succeeded with it, or a later attempt resumed from it."""
    return any(_holds(key.rsplit("/", 1)[1], attempt) for key in store.list(f"{folder}/"))


def apply_retention(
    store: ObjectStore,
    keep: int,
    own: Sequence[CheckpointRef],
    protected: set[str],
    *,
    attempt: int,
) -> int:
    """Delete all but the newest ``keep`` (by step) of ``own``, the checkpoints the job's
    own attempts committed (the grant's resume ref, the ones attempt ``attempt`` saved),
    never one whose object URI is in ``protected`` (the one the job resumed from, its
    last), nor one ``held``: a later attempt marked it as the one it resumed from
    (``stage_resume``: this attempt was lost and went on, and the job runs again from it),
    or an attempt succeeded with it; returns how many were deleted. The store's listing
    chooses nothing, as for ``stage_resume``: any node can write any key, so folders
    another wrote (of later steps) neither push the job's checkpoints out nor are deleted
    themselves; a ref that names no committed object of ``store`` is skipped."""
    folders = sorted(
        {
            (ref.step, key.rsplit("/", 1)[0], ref.uri)
            for ref in own
            if (key := committed_key(store, ref)) is not None
        }
    )
    deleted = 0
    for _step, folder, uri in folders[: max(0, len(folders) - keep)]:
        if uri in protected or held(store, folder, attempt):
            continue
        delete_folder(store, folder)
        deleted += 1
    return deleted


_LISTED = re.compile(r"^(step-(\d{8,})(?:-a(\d{4,}))?)/([^/]+)$")


def prune_earlier_attempts(
    store: ObjectStore, attempt: int, resumed: CheckpointRef, keep: int
) -> int:
    """At the start of attempt ``attempt``, once it has restored ``resumed`` (its grant's
    checkpoint, verified: ``stage_resume``), delete the checkpoint folders of the job's
    earlier attempts that it no longer needs; returns how many folders were deleted.

    ``store`` is the job's own checkpoint prefix; only folders right under it named as
    ``commit_staged`` names them (``step-<n>-a<attempt>``, or the older ``step-<n>``, of
    attempt 0) are looked at. A folder is deleted when all of these hold:
    - its attempt is lower than ``attempt`` (this attempt's own, and any later attempt's,
      are never touched);
    - its step is lower than ``resumed.step`` (the grant names the newest checkpoint the
      job's allocations reported: what an earlier attempt still running during a failover
      saves after it is of a later step, and stays);
    - it is not ``resumed``'s folder, nor one ``held`` (an attempt succeeded with it: a
      lost attempt's success, reported late, is registered from it);
    - it is not one of the ``keep - 1`` newest (by step, then attempt) of those folders
      that have a manifest (``resumed`` counts as the first of the job's ``keep``). A folder
      without a manifest was never reported committed, so no grant or registration can
      name it: it is deleted and not counted;
    - it is not the newest folder with a manifest of its attempt: an earlier attempt may be
      lost, not dead, and still running after it stopped saving (later attempts got further
      meanwhile); its late success registers its last checkpoint, which its end marks
      succeeded only then. Nothing here tells a dead attempt from a lost one, so each earlier
      attempt keeps its newest, one folder per attempt at most (the registry's collector
      keeps the same while the job may still succeed).
    Unlike ``apply_retention`` this reads the store's listing (nothing else says which
    folders earlier attempts left, and an attempt that died never pruned its own). A
    folder another node forged there can therefore take one of the ``keep - 1`` places, or
    be deleted: it never protects or costs ``resumed`` or anything newer than it, and
    every delete stays within the job's own prefix (one forged under an earlier attempt's
    number keeps one folder of that attempt at most, or takes the place of that attempt's
    real newest, which the prune then deletes as it did before each attempt kept one). A
    folder already gone (another pruner, the registry's collector) is no error."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, not {keep}")
    resumed_key = committed_key(store, resumed)
    if resumed_key is None:
        return 0
    resumed_folder = resumed_key.rsplit("/", 1)[0]
    folders: dict[str, tuple[int, int, bool]] = {}
    kept_held: set[str] = set()
    for key in store.list("step-"):
        match = _LISTED.match(key)
        if match is None:
            continue
        folder, step, of = match.group(1), int(match.group(2)), int(match.group(3) or 0)
        complete = match.group(4) == MANIFEST_NAME or folders.get(folder, (0, 0, False))[2]
        folders[folder] = (step, of, complete)
        if _holds(match.group(4), attempt):
            kept_held.add(folder)
    earlier = [
        (step, of, folder, complete)
        for folder, (step, of, complete) in folders.items()
        if of < attempt
        and step < resumed.step
        and folder != resumed_folder
        and folder not in kept_held
    ]
    reported = sorted((step, of, folder) for step, of, folder, done in earlier if done)
    kept = {folder for _, _, folder in reported[max(0, len(reported) - (keep - 1)) :]}
    kept |= _newest_of_each_attempt(folders)
    doomed = sorted(folder for _, _, folder, _ in earlier if folder not in kept)
    for folder in doomed:
        delete_folder(store, folder)
    return len(doomed)


def _newest_of_each_attempt(folders: dict[str, tuple[int, int, bool]]) -> set[str]:
    """The newest folder with a manifest of each attempt of ``folders`` (folder: its step,
    attempt and whether it has one), by step, then name."""
    newest: dict[int, tuple[int, str]] = {}
    for folder, (step, of, complete) in folders.items():
        if complete and (step, folder) > newest.get(of, (-1, "")):
            newest[of] = (step, folder)
    return {folder for _, folder in newest.values()}


def delete_folder(store: ObjectStore, folder: str) -> None:
    """Delete one checkpoint folder of ``store``, its manifest first: a checkpoint without
    one is incomplete to every reader, never half-deleted. Keys already gone are no error."""
    store.delete(f"{folder}/{MANIFEST_NAME}")
    for key in store.list(f"{folder}/"):
        store.delete(key)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
