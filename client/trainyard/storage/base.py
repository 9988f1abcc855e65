"""The object-store contract every backend honours, and the key rules they share.

An ``ObjectStore`` is rooted at one URI (``file:///abs/dir`` or ``s3://bucket/prefix``) and
addresses objects by *keys*: ``/``-separated relative names such as
``step-00000010/checkpoint.pt``. The contract:

* ``put_bytes``/``put_file`` replace the whole object atomically: a reader sees the old
  object or the new one, never a torn mix.
* ``get_bytes``/``get_file``/``exists`` on a key that holds no object raise
  ``ObjectNotFound`` (``get_*``) or return ``False`` (``exists``).
* ``get_file`` writes the destination atomically, creating its parent folders.
* ``get_bytes``/``get_file`` with ``max_bytes`` read at most that many bytes of the object
  (and at most one read's chunk past them): a larger one raises ``ObjectTooLarge`` naming
  the bound (and the object's size where the backend said it before the read), and
  ``get_file`` leaves no destination. A caller that knows how large an object should be
  (a manifest, a spec), or how much it may hold, passes it, so an object larger than it
  was said to be is never downloaded whole.
* ``list(prefix)`` returns the keys (relative to the root) that start with ``prefix`` as a
  plain string prefix, like S3 (``"step-"`` matches ``"step-00000001/manifest.json"``),
  sorted.
* ``uri_for(key)`` is the object's absolute URI; ``split_uri`` in ``trainyard.storage`` splits
  it into the URI of the object's folder and its name, which open the object again.
* ``copy(src, dst)`` makes ``dst`` an independent copy of ``src`` (server-side where the
  backend can), replacing ``dst`` atomically; later writes to ``src`` do not change it.
* ``presign_get(key, expires_s)`` is a URL anyone may GET the one object with until it
  expires, or ``None`` when the backend has no such URLs (a local folder).

The interface is synchronous; async callers wrap calls in ``asyncio.to_thread``.

Keys are validated before they reach a backend: joining an unchecked user-supplied name
onto a filesystem path is how MLflow got its path-traversal CVEs, so a key with an empty
or ``.``/``..`` segment, a leading ``/``, a backslash or a NUL byte is refused with
``ValueError`` everywhere, even by backends where it would be harmless. Segments starting
with ``.trainyard-tmp-`` are reserved for in-progress local writes.
"""

from __future__ import annotations

import abc
import builtins
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

TEMP_PREFIX = ".trainyard-tmp-"
"""Names starting with this are in-progress writes: never valid keys, never listed."""


class ObjectNotFound(KeyError):
    """No object is stored under ``key``."""

    def __init__(self, key: str, uri: str | None = None) -> None:
        self.key = key
        self.uri = uri
        where = f" ({uri})" if uri else ""
        self.message = f"no object stored under key {key!r}{where}"
        super().__init__(self.message)

    def __str__(self) -> str:
        # KeyError.__str__ repr()s its argument, which would wrap the message in quotes.
        return self.message


class ObjectTooLarge(Exception):
    """The object under ``key`` is larger than the ``max_bytes`` its reader allowed; it was
    not read past them. ``size_bytes`` is its size where the backend said it up front
    (a file's size, an HTTP ``Content-Length``), else None: only "more than ``max_bytes``"
    is known."""

    def __init__(
        self, key: str, max_bytes: int, uri: str | None = None, size_bytes: int | None = None
    ) -> None:
        self.key = key
        self.max_bytes = max_bytes
        self.uri = uri
        self.size_bytes = size_bytes
        where = f" ({uri})" if uri else ""
        super().__init__(
            f"object {key!r}{where} is {self.size}, over the {max_bytes} bytes allowed: "
            "not read past them"
        )

    @property
    def size(self) -> str:
        """What is known of its size: ``"N bytes"``, or ``"more than N bytes"``."""
        if self.size_bytes is not None:
            return f"{self.size_bytes} bytes"
        return f"more than {self.max_bytes} bytes"


def bounded(
    chunks: Iterable[bytes], key: str, max_bytes: int | None, uri: str | None = None
) -> Iterator[bytes]:
    """``chunks`` as they come, until more than ``max_bytes`` (None: no bound) have: then
    ``ObjectTooLarge``, and no further chunk is asked for."""
    if max_bytes is None:
        yield from chunks
        return
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise ObjectTooLarge(key, max_bytes, uri)
        yield chunk


def check_size(key: str, size_bytes: int | None, max_bytes: int | None, uri: str) -> None:
    """``ObjectTooLarge`` when the size a backend says an object has before it is read is
    over ``max_bytes``: then not a byte of it is read."""
    if max_bytes is not None and size_bytes is not None and size_bytes > max_bytes:
        raise ObjectTooLarge(key, max_bytes, uri, size_bytes)


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key, else raise ``ValueError``."""
    reason = _key_problem(key, allow_prefix=False)
    if reason is not None:
        raise ValueError(f"invalid object key {key!r}: {reason}")
    return key


def validate_prefix(prefix: str) -> str:
    """Like ``validate_key`` but for ``list``: empty is fine, and so is a trailing ``/``."""
    if prefix == "":
        return prefix
    reason = _key_problem(prefix, allow_prefix=True)
    if reason is not None:
        raise ValueError(f"invalid object key prefix {prefix!r}: {reason}")
    return prefix


def _key_problem(key: str, *, allow_prefix: bool) -> str | None:
    if not isinstance(key, str):
        return f"must be a str, not {type(key).__name__}"
    if key == "":
        return "must not be empty"
    if "\x00" in key:
        return "must not contain a NUL byte"
    if "\\" in key:
        return "must not contain a backslash"
    if key.startswith("/"):
        return "must be relative (no leading '/')"
    segments = key.split("/")
    if allow_prefix and segments[-1] == "":
        # "step-00000001/" is a useful listing prefix; its empty last segment is not a name.
        segments = segments[:-1]
    for segment in segments:
        if segment == "":
            return "must not contain an empty segment ('//' or a trailing '/')"
        if segment in (".", ".."):
            return f"must not contain a {segment!r} segment"
        if segment.startswith(TEMP_PREFIX):
            return f"must not contain a segment starting with the reserved {TEMP_PREFIX!r}"
    return None


def write_file_atomically(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` via a temp file in the same folder and ``os.replace``.

    The temp file lives beside the destination so the final rename stays on one
    filesystem, which is what makes it atomic. Parent folders are created; the data and
    then the folder entry are fsynced, so a checkpoint that was reported saved survives
    a crash of the machine.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.")
    try:
        with os.fdopen(fd, "wb") as tmp:
            for chunk in chunks:
                tmp.write(chunk)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Persist the rename itself: without this a power cut can undo a finished write."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # some filesystems refuse to open folders; the write itself is complete
    try:
        os.fsync(fd)
    except OSError:
        pass  # not supported here (e.g. some network filesystems); best effort only
    finally:
        os.close(fd)


def read_file_chunks(path: Path, chunk_size: int = 1024 * 1024) -> Iterable[bytes]:
    """Yield the bytes of ``path`` in chunks, so large files never sit whole in memory."""
    with path.open("rb") as src:
        while chunk := src.read(chunk_size):
            yield chunk


class ObjectStore(abc.ABC):
    """Objects under one root URI, addressed by validated relative keys (see module doc)."""

    @property
    @abc.abstractmethod
    def root_uri(self) -> str:
        """The URI this store is rooted at (what ``open_store`` was given, normalised)."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store the contents of the local file ``path`` under ``key``."""

    @abc.abstractmethod
    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The object's bytes; ``ObjectNotFound`` if there is none, ``ObjectTooLarge`` if it
        is larger than ``max_bytes`` (None: no bound), read no further than that."""

    @abc.abstractmethod
    def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
        """Download the object to ``path`` (atomically); ``ObjectNotFound`` if there is none,
        ``ObjectTooLarge`` if it is larger than ``max_bytes`` (None: no bound), read no
        further than that and with no file left at ``path``."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """The size in bytes of the object under ``key``, None if there is none: one look
        at its metadata (an S3 HEAD), its bytes unread."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object under ``key``; no error if there is none."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> builtins.list[str]:
        """Sorted keys (relative to the root) that start with ``prefix``."""

    @abc.abstractmethod
    def uri_for(self, key: str) -> str:
        """The absolute URI of the object under ``key`` (whether or not it exists)."""

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """Copy the object under ``src`` to ``dst`` (replacing it); ``ObjectNotFound`` if
        ``src`` holds none."""

    def presign_get(self, key: str, expires_s: int) -> str | None:
        """A URL that GETs the object under ``key`` for ``expires_s`` seconds, signed for that
        one key; ``None`` where the backend cannot sign URLs (the default)."""
        validate_key(key)
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root_uri!r})"
