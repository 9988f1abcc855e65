"""What a code bundle may hold: the one rule the submission service checks at upload, the
runner checks again before it unpacks (``check_bundle``), and ``trainyard.bundle.pack``
checks before anything is uploaded (``check_name`` of each file, the limits, then
``check_bundle`` of what it packed). In the client package, which the platform depends on,
so that the CLI and the services hold bundles to the same code.

A bundle is a gzip-compressed tar (``trainyard.bundle`` makes them) of regular files,
folders and symbolic links, every path relative and inside the bundle. Refused, each with
its reason (``BundleRefused``):

- anything that is not a gzip-compressed tar archive (or is cut short);
- an absolute path, a ``..`` part, an empty name (but for the bundle's own folder, ``./``,
  which ``tar -C code .`` writes first), or a name given twice;
- a name no file system holds: a folder or file name over ``NAME_MAX`` (255) bytes, a
  path over ``PATH_MAX`` (4095) bytes, or one nested more than ``MAX_BUNDLE_DEPTH`` (256)
  levels deep; an entry inside a file (``data`` a file and ``data/x`` too);
- a hard link to anything but a regular file before it; a device, a FIFO or any other
  special file;
- a symbolic link with an absolute target, or whose target (through any other links of the
  bundle) leaves the bundle; a member inside a symbolic link (written through it);
- more than ``max_members`` entries, or files adding up to more than ``max_unpacked`` bytes:
  the archive is read as a stream, decompressed bytes counted as they come, so a small
  gzip that unpacks to terabytes is refused after ``max_unpacked`` (plus the headers' share),
  never unpacked whole.

Nothing is written anywhere: the check reads the archive, it does not extract it.
"""

from __future__ import annotations

import gzip
import io
import posixpath
import tarfile
import zlib
from typing import IO, Final

MAX_UNPACKED_BYTES: Final = 4 * 1024**3
"""A bundle may unpack to at most this much (a small gzip of zeros can unpack to terabytes)."""
MAX_BUNDLE_MEMBERS: Final = 200_000
_HEADER_BYTES: Final = 3 * tarfile.BLOCKSIZE
"""What each entry may add beyond its data (its header, a PAX header, padding)."""
_LINK_HOPS: Final = 40
"""As many symbolic links as a path may pass through (Linux's own limit)."""
NAME_MAX: Final = 255
"""The longest folder or file name (bytes) Linux file systems hold."""
PATH_MAX: Final = 4095
"""The longest path (bytes, without the final NUL) Linux takes: a bundle's path is
unpacked below a folder of the node's, so it must be shorter still there."""
MAX_BUNDLE_DEPTH: Final = 256
"""The most levels of folders a bundle's path may have: deeper ones are no project's, and
unpacking one folder level at a time runs out of stack before it runs out of path."""
_SHOWN_CHARS: Final = 80


class BundleRefused(ValueError):
    """The bundle breaks a rule of the module; the message says which, naming the entry."""


class _Counted(io.RawIOBase):
    """The decompressed stream, refused once more than ``limit`` bytes have come."""

    def __init__(self, raw: gzip.GzipFile, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._raw.read(min(len(buffer), self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise _Overflow
        buffer[: len(data)] = data
        return len(data)


class _Overflow(Exception):
    pass


def check_bundle(
    archive: IO[bytes],
    *,
    max_unpacked: int = MAX_UNPACKED_BYTES,
    max_members: int = MAX_BUNDLE_MEMBERS,
) -> None:
    """Raise ``BundleRefused`` unless ``archive`` (a binary file, read from its current
    position) is a bundle the module allows."""
    limit = max_unpacked + max_members * _HEADER_BYTES + 2 * tarfile.RECORDSIZE
    stream = io.BufferedReader(_Counted(gzip.GzipFile(fileobj=archive, mode="rb"), limit))
    names: set[str] = set()
    links: dict[str, str] = {}
    files: set[str] = set()
    not_folders: set[str] = set()
    unpacked = count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                count += 1
                if count > max_members:
                    raise BundleRefused(f"it has more than {max_members} entries")
                if member.isdir() and set(member.name.split("/")) <= {"", "."}:
                    continue  # the bundle's own folder (tar -C dir . writes "./" first)
                name = check_name(member.name)
                if name in names:
                    raise BundleRefused(f"{member.name!r} is in it twice")
                names.add(name)
                if member.isreg() or member.islnk():
                    not_folders.add(name)
                if member.isreg():
                    files.add(name)
                    unpacked += member.size
                    if unpacked > max_unpacked:
                        raise BundleRefused(
                            f"it unpacks to more than {max_unpacked} bytes (a bomb, or "
                            "files to leave out with .trainyardignore)"
                        )
                elif member.islnk():  # another name for a file before it (tar writes them)
                    if _relative(member.linkname) not in files:
                        raise BundleRefused(
                            f"hard link {member.name!r} points to {member.linkname!r}, which "
                            "is not a file before it in the bundle"
                        )
                elif member.issym():
                    if member.linkname.startswith("/") or not member.linkname:
                        raise BundleRefused(
                            f"symbolic link {member.name!r} points to {member.linkname!r}: "
                            "only a relative target inside the bundle is allowed"
                        )
                    links[name] = member.linkname
                elif not member.isdir():
                    raise BundleRefused(
                        f"{member.name!r} is a {_kind(member)}: only regular files, folders "
                        "and symbolic links are allowed"
                    )
    except _Overflow:
        raise BundleRefused(
            f"it unpacks to more than {max_unpacked} bytes (a bomb, or files to leave out "
            "with .trainyardignore)"
        ) from None
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError) as exc:
        raise BundleRefused(f"it is not a gzip-compressed tar archive ({exc})") from None
    for name in names:
        through = next((p for p in _parents(name) if p in links), None)
        if through is not None:
            raise BundleRefused(f"{name!r} is inside symbolic link {through!r}")
        inside = next((p for p in _parents(name) if p in not_folders), None)
        if inside is not None:
            raise BundleRefused(
                f"{shown(name)} is inside file {shown(inside)}: a name cannot be a file and a "
                "folder both"
            )
    for name, target in links.items():
        _inside(name, target, links)


def check_name(name: str) -> str:
    """``name`` (an entry's path, ``/``-separated) as the bundle holds it, without ``./``
    parts; ``BundleRefused`` when absolute, empty, with a ``..`` part, or one no file system
    holds (a name over ``NAME_MAX`` bytes, a path over ``PATH_MAX``, deeper than
    ``MAX_BUNDLE_DEPTH``)."""
    relative = _relative(name)
    _holdable(relative)
    return relative


def _relative(name: str) -> str:
    """``name`` without ``./`` parts; refused when absolute, empty or with a ``..`` part."""
    if name.startswith("/"):
        raise BundleRefused(f"{name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleRefused(f"{name!r} has a '..' part")
    if not parts:
        raise BundleRefused(f"an entry has no name ({name!r})")
    return "/".join(parts)


def _holdable(name: str) -> None:
    """Refuse ``name`` (relative, normalised) when no file system could hold it."""
    for part in name.split("/"):
        size = len(_encoded(part))
        if size > NAME_MAX:
            raise BundleRefused(
                f"{shown(name)} has a folder or file name of {size} bytes: file systems hold "
                f"names of at most {NAME_MAX} bytes"
            )
    size = len(_encoded(name))
    if size > PATH_MAX:
        raise BundleRefused(
            f"{shown(name)} is a path of {size} bytes: a path holds at most {PATH_MAX} bytes"
        )
    depth = name.count("/") + 1
    if depth > MAX_BUNDLE_DEPTH:
        raise BundleRefused(
            f"{shown(name)} is {depth} levels deep: at most {MAX_BUNDLE_DEPTH} levels deep "
            "are allowed"
        )


def _encoded(name: str) -> bytes:
    # As tarfile writes the name to the file system (undecodable bytes kept as they were).
    return name.encode("utf-8", "surrogateescape")


def shown(name: str) -> str:
    """``name`` quoted for a reason, its middle left out when it is long (a name may be
    thousands of bytes)."""
    if len(name) <= _SHOWN_CHARS:
        return repr(name)
    half = _SHOWN_CHARS // 2
    return f"{name[:half]!r}...{name[-half:]!r} ({len(_encoded(name))} bytes)"


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _inside(link: str, target: str, links: dict[str, str]) -> None:
    """Refuse ``link`` unless ``target`` (relative to its folder, through the bundle's other
    links) resolves inside the bundle."""
    pending = [*posixpath.dirname(link).split("/"), *target.split("/")]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise BundleRefused(
                    f"symbolic link {link!r} points to {target!r}, outside the bundle"
                )
            resolved.pop()
            continue
        here = "/".join([*resolved, part])
        if here in links:
            hops += 1
            if hops > _LINK_HOPS:
                raise BundleRefused(f"symbolic link {link!r} loops")
            pending = [*links[here].split("/"), *pending]
            continue
        resolved.append(part)


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "FIFO"
    return "special file"
