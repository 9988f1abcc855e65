"""Checkpoints in an object store: the layout, the background writer, the verified reader.

Layout under a job's checkpoint folder, one folder per step::

    step-00000100/checkpoint.pt     torch.save of the state dict
    step-00000100/manifest.json     CheckpointManifest, written after the object

The manifest is written *last*: a step folder without one is an upload that never
finished and is ignored. A checkpoint is only restored if its object's size and sha256
match the manifest, so a torn or tampered object is skipped in favour of an older one; no
more of it is read than its manifest says (a manifest itself: ``MAX_MANIFEST_BYTES``).

``CheckpointWriter.save`` copies the state to CPU memory and returns; one background
thread serialises, uploads and publishes it. At most one checkpoint is in flight: a
second ``save`` first waits for the previous upload (and re-raises its error), which
bounds memory to one extra copy of the state.

States must hold only what ``torch.load(weights_only=True)`` can read back: tensors,
dicts, lists, tuples and plain scalars. ``snapshot`` refuses anything else up front, at
save time, rather than letting a resume fail hours later.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard.control import CheckpointRef
from trainyard.storage import ObjectNotFound, ObjectStore, ObjectTooLarge, validate_key

log = logging.getLogger("trainyard.sdk")

OBJECT_NAME = "checkpoint.pt"
MANIFEST_NAME = "manifest.json"
_MANIFEST_KEY = re.compile(r"^step-(\d{8,})/" + re.escape(MANIFEST_NAME) + r"$")
_CHUNK = 1024 * 1024
MAX_MANIFEST_BYTES = 64 * 1024
"""The most of a manifest read (one is a few hundred bytes; the runner commits none larger)."""


def step_folder(step: int) -> str:
    """``step-00000042``: zero-padded so keys sort in step order."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def object_key(step: int) -> str:
    return f"{step_folder(step)}/{OBJECT_NAME}"


def manifest_key(step: int) -> str:
    return f"{step_folder(step)}/{MANIFEST_NAME}"


class CheckpointManifest(BaseModel):
    """What a complete checkpoint claims to be; ``object`` is relative to the folder."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    step: int = Field(ge=0)
    object: str
    size_bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: datetime
    job_id: str
    attempt: int


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message names its step."""


def file_digest(path: Path) -> tuple[str, int]:
    """``(sha256 hex, size in bytes)`` of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


# --- snapshot ------------------------------------------------------------------------

_SCALARS = (str, bytes, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


def snapshot(state: Any, path: str = "state") -> Any:
    """A deep copy of ``state`` with every tensor copied to CPU memory.

    The training loop may keep mutating its tensors (or the GPU may reuse their memory)
    while the copy is serialised in the background. Tensors that shared storage (tied
    weights) become separate copies, which ``load_state_dict`` handles the same way.
    Raises ``TypeError`` naming the offending path for values ``weights_only`` can't load.
    """
    if isinstance(state, torch.Tensor):
        # copy=True even on CPU: the caller's tensor is updated in place by the optimizer.
        return state.detach().to("cpu", copy=True)
    if isinstance(state, _SCALARS):
        return state  # immutable
    if type(state) in (dict, OrderedDict):
        copied = type(state)()
        for key, value in state.items():
            if not isinstance(key, _SCALARS):
                raise TypeError(f"{path} has a key of type {type(key).__name__}")
            copied[key] = snapshot(value, f"{path}[{key!r}]")
        # A module's state_dict carries version info in its ``_metadata`` attribute.
        attributes = getattr(state, "__dict__", None)  # plain dicts have none
        if attributes:
            copied.__dict__.update(copy.deepcopy(attributes))
        return copied
    if type(state) in (list, tuple):
        return type(state)(snapshot(v, f"{path}[{i}]") for i, v in enumerate(state))
    raise TypeError(
        f"{path} is a {type(state).__module__}.{type(state).__qualname__}, which "
        "torch.load(weights_only=True) cannot restore; use tensors, dicts, lists, tuples "
        "and plain scalars"
    )


# --- writing -------------------------------------------------------------------------


class CheckpointWriter:
    """Uploads checkpoints from one background thread; see the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        job_id: str,
        attempt: int,
        on_saved: Callable[[CheckpointRef], None] | None = None,
    ) -> None:
        self._store = store
        self._job_id = job_id
        self._attempt = attempt
        self._on_saved = on_saved
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainyard-ckpt")
        self._pending: Future[CheckpointRef] | None = None
        self._pending_step: int | None = None

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Snapshot ``state`` and upload it in the background as the checkpoint of ``step``."""
        step_folder(step)  # validates the step before any work
        if not isinstance(state, dict):
            raise TypeError(f"checkpoint state must be a dict, not {type(state).__name__}")
        self.wait()
        copied = snapshot(state)
        self._pending = self._executor.submit(self._write, step, copied)
        self._pending_step = step

    def wait(self) -> CheckpointRef | None:
        """Block until the upload in flight finishes; re-raise its error as CheckpointError."""
        pending, step = self._pending, self._pending_step
        self._pending, self._pending_step = None, None
        if pending is None:
            return None
        try:
            return pending.result()
        except Exception as exc:
            raise CheckpointError(f"checkpoint for step {step} was not saved: {exc}") from exc

    def close(self) -> None:
        """Wait for the upload in flight, then stop the worker thread."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def _write(self, step: int, state: dict[str, Any]) -> CheckpointRef:
        key, meta_key = object_key(step), manifest_key(step)
        with tempfile.TemporaryDirectory(prefix="trainyard-ckpt-") as tmp:
            path = Path(tmp) / OBJECT_NAME
            torch.save(state, path)
            sha256, size = file_digest(path)
            self._store.put_file(key, path)
        manifest = CheckpointManifest(
            step=step,
            object=key,
            size_bytes=size,
            sha256=sha256,
            created_at=datetime.now(UTC),
            job_id=self._job_id,
            attempt=self._attempt,
        )
        # Only now, with the object fully stored, does the checkpoint become visible.
        self._store.put_bytes(meta_key, manifest.model_dump_json(indent=2).encode())
        ref = CheckpointRef(
            uri=self._store.uri_for(key),
            manifest_uri=self._store.uri_for(meta_key),
            step=step,
            size_bytes=size,
            sha256=sha256,
        )
        log.debug("checkpoint for step %d saved to %s", step, ref.uri)
        if self._on_saved is not None:
            self._on_saved(ref)
        return ref


# --- reading -------------------------------------------------------------------------


class CorruptCheckpoint(Exception):
    """A step folder whose manifest or object can't be trusted."""


def complete_steps(store: ObjectStore) -> list[int]:
    """Steps that have a manifest, highest first (their objects are not verified yet)."""
    steps = []
    for key in store.list("step-"):
        match = _MANIFEST_KEY.match(key)
        if match:
            steps.append(int(match.group(1)))
    return sorted(steps, reverse=True)


def load_verified(store: ObjectStore, step: int) -> dict[str, Any]:
    """Load the checkpoint of ``step`` if its object matches its manifest, else raise
    ``CorruptCheckpoint``. Storage outages propagate: they are not corruption."""
    try:
        manifest = CheckpointManifest.model_validate_json(
            store.get_bytes(manifest_key(step), max_bytes=MAX_MANIFEST_BYTES)
        )
    except ObjectNotFound as exc:
        raise CorruptCheckpoint(f"manifest vanished: {exc}") from exc
    except ObjectTooLarge as exc:
        raise CorruptCheckpoint(f"unreadable manifest: {exc}") from exc
    except ValidationError as exc:
        raise CorruptCheckpoint(f"unreadable manifest: {exc}") from exc
    if manifest.step != step:
        raise CorruptCheckpoint(f"manifest is for step {manifest.step}")
    try:
        key = validate_key(manifest.object)
    except ValueError as exc:
        raise CorruptCheckpoint(str(exc)) from exc
    with tempfile.TemporaryDirectory(prefix="trainyard-ckpt-") as tmp:
        path = Path(tmp) / OBJECT_NAME
        try:
            # No more than the manifest says: a larger object cannot match it.
            store.get_file(key, path, max_bytes=manifest.size_bytes)
        except ObjectNotFound as exc:
            raise CorruptCheckpoint(f"object missing: {exc}") from exc
        except ObjectTooLarge as exc:
            raise CorruptCheckpoint(
                f"object {key!r} is {exc.size}, manifest says {manifest.size_bytes} bytes"
            ) from exc
        sha256, size = file_digest(path)
        if (sha256, size) != (manifest.sha256, manifest.size_bytes):
            raise CorruptCheckpoint(
                f"object {key!r} has {size} bytes with sha256 {sha256[:12]}..., manifest says "
                f"{manifest.size_bytes} bytes with sha256 {manifest.sha256[:12]}..."
            )
        try:
            state = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as exc:  # whatever unpickling raises, the object is unusable
            raise CorruptCheckpoint(f"torch.load failed: {exc}") from exc
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"object holds a {type(state).__name__}, not a dict")
    return state


def restore_latest(store: ObjectStore) -> tuple[int, dict[str, Any]] | None:
    """``(step, state)`` of the newest verified checkpoint, or ``None`` if there is none;
    corrupt ones are logged and skipped."""
    for step in complete_steps(store):
        try:
            return step, load_verified(store, step)
        except CorruptCheckpoint as exc:
            log.warning("skipping checkpoint at step %d in %s: %s", step, store.root_uri, exc)
    return None
