"""``LocalStore``: the object-store contract on a local folder (``file://`` URIs).

Each key maps to the file ``root/<key>``. Writes go to a temp file beside the destination
and are moved into place with ``os.replace``, so a crashed writer leaves the previous
object (or none) and never a half-written one; folders are created as needed. Unlike S3,
a filesystem cannot hold both ``a`` and ``a/b``: writing the second raises ``OSError``.
"""

from __future__ import annotations

import builtins
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trainyard.storage.base import (
    TEMP_PREFIX,
    ObjectNotFound,
    ObjectStore,
    bounded,
    check_size,
    read_file_chunks,
    validate_key,
    validate_prefix,
    write_file_atomically,
)

_CHUNK = 1024 * 1024


class LocalStore(ObjectStore):
    """Objects as files under one folder (made absolute at construction)."""

    def __init__(self, root: Path) -> None:
        # Resolve once: a later chdir must not move the store, and uri_for needs a
        # absolute path. The folder itself is created on first write, so opening a store
        # only to read never litters the filesystem.
        self._root = root.expanduser().resolve()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def root_uri(self) -> str:
        return self._root.as_uri()

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*validate_key(key).split("/"))

    def put_bytes(self, key: str, data: bytes) -> None:
        write_file_atomically(self._path(key), [data])

    def put_file(self, key: str, path: Path) -> None:
        write_file_atomically(self._path(key), read_file_chunks(path))

    def _open(self, key: str, max_bytes: int | None) -> BinaryIO:
        target = self._path(key)
        try:
            src = target.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            # A folder (or a path through a file) is not an object either.
            raise ObjectNotFound(key, target.as_uri()) from None
        try:
            check_size(key, os.fstat(src.fileno()).st_size, max_bytes, target.as_uri())
        except BaseException:
            src.close()
            raise
        return src

    def _chunks(self, key: str, src: BinaryIO, max_bytes: int | None) -> Iterator[bytes]:
        # Counted as read too: the file may grow after its size was looked at.
        return bounded(iter(lambda: src.read(_CHUNK), b""), key, max_bytes, self.uri_for(key))

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        with self._open(key, max_bytes) as src:
            return b"".join(self._chunks(key, src, max_bytes))

    def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
        with self._open(key, max_bytes) as src:
            write_file_atomically(path, self._chunks(key, src, max_bytes))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        try:
            found = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        # A folder (or anything but a file) is not an object, as for ``exists``.
        return found.st_size if stat.S_ISREG(found.st_mode) else None

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Empty folders left behind would only slow listings down.
        for folder in path.parents:
            if folder == self._root or not folder.is_relative_to(self._root):
                break
            try:
                folder.rmdir()
            except OSError:
                break

    def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        # Only walk the folder the prefix's complete segments name, not the whole tree.
        folder = prefix.rpartition("/")[0]
        start = self._root.joinpath(*folder.split("/")) if folder else self._root
        if not start.is_dir():
            return []
        keys: builtins.list[str] = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)]
            base = Path(dirpath).relative_to(self._root).as_posix()
            for name in filenames:
                if name.startswith(TEMP_PREFIX):
                    continue  # someone's write in progress, not an object yet
                key = name if base == "." else f"{base}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        return keys

    def uri_for(self, key: str) -> str:
        return self._path(key).as_uri()

    def copy(self, src: str, dst: str) -> None:
        source = self._path(src)
        target = self._path(dst)
        try:
            handle = source.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(src, source.as_uri()) from None
        # A real copy, never a hard link: a later write to the source must not reach it.
        with handle:
            write_file_atomically(target, iter(lambda: handle.read(1024 * 1024), b""))
