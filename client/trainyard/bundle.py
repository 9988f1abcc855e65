"""Code bundles: a working directory packed into a deterministic ``.tar.gz``.

``pack(workdir)`` writes the bundle a job's code travels in and returns
``Bundle(path, sha256, size_bytes, names)``. Contract:

- **Deterministic.** Entries are sorted by path; every entry has mtime 0, uid/gid 0, no owner
  names, mode 0644 (0755 for folders and for files with any execute bit); the gzip header
  has no name and mtime 0. The same contents give the same bytes, hence the same sha256,
  so an unchanged directory is uploaded once.
- **Ignore rules** (gitignore syntax, via ``pathspec``): every ``.gitignore`` (the root's
  and nested ones, each relative to its own folder; a deeper file overrides a shallower
  one, ``!`` re-includes), then ``.trainyardignore`` at the root, which overrides them all.
  ``.git/``, ``.venv/``, ``__pycache__/`` and ``.trainyard/`` are always left out, whatever
  the files say. As in git, a file in an excluded folder cannot be re-included.
- **Symlinks** are kept as links when they point to something packed in the bundle
  (rewritten relative); a link that points outside the directory, to an excluded path or
  to nothing is skipped with a warning. Links are never followed. Sockets, FIFOs and
  devices are skipped.
- **Size.** A bundle larger than ``max_bytes`` (compressed; default 100 MiB) raises
  ``BundleTooLarge`` naming the largest files and how to leave them out.
- **The platform's rules** (``trainyard.bundle_archive``, the code the submission service
  and the runner check bundles with): a file or folder whose name no file system holds
  (over 255 bytes; a path over 4095 bytes or more than 256 levels deep), more than 200,000
  entries, or more than 4 GiB of files raises ``BundleRefusedHere`` naming the file and
  the rule before anything is written; the packed archive is then checked whole by
  ``check_bundle``, as the service will check it, before it is returned.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

import pathspec

from trainyard.bundle_archive import (
    MAX_BUNDLE_MEMBERS,
    MAX_UNPACKED_BYTES,
    BundleRefused,
    check_bundle,
    check_name,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
"""Largest compressed bundle ``pack`` writes (the CLI reads ``TRAINYARD_BUNDLE_MAX_BYTES``)."""
ALWAYS_EXCLUDED = (".git/", ".venv/", "__pycache__/", ".trainyard/")
"""Folders never packed, at any depth."""
IGNORE_FILE = ".trainyardignore"
GITIGNORE = ".gitignore"
_LARGEST_SHOWN = 5
_COMPRESS_LEVEL = 6


class Bundle(NamedTuple):
    """A packed bundle: the ``.tar.gz`` file (the caller deletes it), its sha256 (hex), its
    size in bytes, and the relative paths of the files and links in it (``/``-separated)."""

    path: Path
    sha256: str
    size_bytes: int
    names: frozenset[str] = frozenset()


class BundleError(Exception):
    """The directory cannot be packed (not a directory, unreadable, too large)."""


class BundleTooLarge(BundleError):
    """The compressed bundle would exceed the size limit."""


class BundleRefusedHere(BundleError):
    """The directory would pack into a bundle the platform refuses
    (``trainyard.bundle_archive``); the message names the file and the rule."""


@dataclass(frozen=True)
class _Entry:
    name: str
    """Path relative to the root, ``/``-separated."""
    kind: str
    """``dir``, ``file`` or ``link``."""
    mode: int = 0o644
    size: int = 0
    link: str = ""


@dataclass
class _Rules:
    """The ignore specs in force in one folder: ``(base, spec)`` from the root down."""

    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = field(default_factory=list)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        decision = False
        for base, spec in self.specs:
            if base and not rel.startswith(base + "/"):
                continue
            local = rel[len(base) + 1 :] if base else rel
            result = spec.check_file(local + "/" if is_dir else local)
            if result.include is not None:
                decision = bool(result.include)
        return decision


_ALWAYS = pathspec.GitIgnoreSpec.from_lines(ALWAYS_EXCLUDED)


def pack(
    workdir: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    out_dir: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> Bundle:
    """Pack ``workdir`` into a new ``.tar.gz`` (in ``out_dir``, default the system temp
    folder) and return it; see the module doc for what goes in. Raises ``BundleError``."""
    say = warn or log.warning
    root = workdir.expanduser()
    if not root.is_dir():
        raise BundleError(f"{workdir} is not a directory")
    root = root.resolve()
    entries = _collect(root, say)
    _platform_rules(root, entries)
    fd, name = tempfile.mkstemp(prefix="trainyard-bundle-", suffix=".tar.gz", dir=out_dir)
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            digest = _write(root, entries, raw, max_bytes)
        size = path.stat().st_size
        if size > max_bytes:
            raise _too_large(entries, max_bytes)
        with path.open("rb") as packed:
            check_bundle(packed)  # as the submission service will, before it is uploaded
    except BundleRefused as exc:
        path.unlink(missing_ok=True)
        raise _refused(root, str(exc)) from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    names = frozenset(e.name for e in entries if e.kind != "dir")
    return Bundle(path=path, sha256=digest, size_bytes=size, names=names)


def list_files(workdir: Path, warn: Callable[[str], None] | None = None) -> list[str]:
    """The paths ``pack`` would put in the bundle (folders end with ``/``), sorted."""
    root = workdir.expanduser().resolve()
    if not root.is_dir():
        raise BundleError(f"{workdir} is not a directory")
    return [
        e.name + "/" if e.kind == "dir" else e.name for e in _collect(root, warn or log.warning)
    ]


# --- collecting ------------------------------------------------------------------------------


def _collect(root: Path, say: Callable[[str], None]) -> list[_Entry]:
    entries: list[_Entry] = []
    links: list[tuple[str, Path]] = []
    rules: dict[str, _Rules] = {}
    root_specs = _Rules()
    _add_spec(root_specs, "", root / GITIGNORE, say)
    _add_spec(root_specs, "", root / IGNORE_FILE, say)
    rules[""] = root_specs
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base
        here = rules.pop(base)
        names = sorted([(d, True) for d in dirnames] + [(f, False) for f in filenames])
        dirnames.clear()
        for name, listed_as_dir in names:
            rel = f"{base}/{name}" if base else name
            full = root / rel
            try:
                info = full.lstat()
            except OSError as exc:
                raise BundleError(f"cannot read {rel}: {exc.strerror or exc}") from None
            is_link = stat.S_ISLNK(info.st_mode)
            is_dir = listed_as_dir and not is_link
            if _ALWAYS.match_file(rel + "/" if is_dir else rel) or here.ignored(rel, is_dir):
                continue
            if is_link:
                links.append((rel, full))
            elif is_dir:
                entries.append(_Entry(rel, "dir", 0o755))
                child = _Rules(list(here.specs))
                _add_spec(child, rel, full / GITIGNORE, say)
                rules[rel] = child
                dirnames.append(name)
            elif stat.S_ISREG(info.st_mode):
                executable = bool(info.st_mode & 0o111)
                entries.append(_Entry(rel, "file", 0o755 if executable else 0o644, info.st_size))
            else:
                say(f"skipping {rel}: not a regular file, folder or symlink")
    packed = {e.name for e in entries}
    for rel, full in links:
        target, problem = _link_target(root, full, packed)
        if problem:
            say(f"skipping symlink {rel}: {problem}")
        else:
            entries.append(_Entry(rel, "link", 0o777, link=target))
    entries.sort(key=lambda e: e.name)
    return entries


def _link_target(root: Path, full: Path, packed: set[str]) -> tuple[str, str]:
    """``(target relative to the link's folder, "")``, or ``("", why it is skipped)``."""
    try:
        target = full.resolve(strict=True)
    except (OSError, RuntimeError):
        return "", "it points to nothing (or loops)"
    try:
        inside = target.relative_to(root).as_posix()
    except ValueError:
        return "", f"it points outside {root} (to {target})"
    if inside not in packed:
        return "", f"its target {inside} is not in the bundle (excluded)"
    return os.path.relpath(target, full.parent).replace(os.sep, "/"), ""


def _add_spec(rules: _Rules, base: str, path: Path, say: Callable[[str], None]) -> None:
    if not path.is_file():
        return
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        say(f"cannot read {path}: {exc.strerror or exc}; its rules are not applied")
        return
    rules.specs.append((base, pathspec.GitIgnoreSpec.from_lines(lines)))


def _raise(exc: OSError) -> None:
    raise BundleError(f"cannot read {exc.filename}: {exc.strerror or exc}")


def _platform_rules(root: Path, entries: list[_Entry]) -> None:
    """Raise ``BundleRefusedHere`` when ``entries`` break a rule the platform holds
    bundles to (``trainyard.bundle_archive``), naming the first file that does."""
    if len(entries) > MAX_BUNDLE_MEMBERS:
        raise _refused(
            root, f"it has {len(entries)} files and folders to pack, more than {MAX_BUNDLE_MEMBERS}"
        )
    for entry in entries:
        try:
            check_name(entry.name)
        except BundleRefused as exc:
            raise _refused(root, str(exc)) from None
    total = sum(e.size for e in entries if e.kind == "file")
    if total > MAX_UNPACKED_BYTES:
        files = sorted((e for e in entries if e.kind == "file"), key=lambda e: (-e.size, e.name))
        largest = ", ".join(f"{e.name} ({format_size(e.size)})" for e in files[:_LARGEST_SHOWN])
        raise _refused(
            root,
            f"its files add up to {format_size(total)}, more than a bundle may unpack to "
            f"({format_size(MAX_UNPACKED_BYTES)}); largest files: {largest}",
        )


def _refused(root: Path, reason: str) -> BundleRefusedHere:
    return BundleRefusedHere(
        f"the code in {root} cannot be uploaded: {reason}. The platform refuses such a "
        f"bundle: leave it out with {IGNORE_FILE} (gitignore syntax) in the working "
        "directory, or submit with --no-code"
    )


# --- writing ---------------------------------------------------------------------------------


class _Limited:
    """A write-only file that hashes what passes and stops once past ``limit`` bytes."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self.written = 0
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self._limit:
            raise _Overflow
        self.hash.update(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()


class _Overflow(Exception):
    pass


def _write(root: Path, entries: Iterable[_Entry], raw: IO[bytes], max_bytes: int) -> str:
    entries = list(entries)
    out = _Limited(raw, max_bytes)
    try:
        with (
            gzip.GzipFile(
                filename="", mode="wb", fileobj=out, mtime=0, compresslevel=_COMPRESS_LEVEL
            ) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for entry in entries:
                _add(tar, root, entry)
    except _Overflow:
        raise _too_large(entries, max_bytes) from None
    return out.hash.hexdigest()


def _add(tar: tarfile.TarFile, root: Path, entry: _Entry) -> None:
    info = tarfile.TarInfo(entry.name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif entry.kind == "link":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.link
        tar.addfile(info)
    else:
        path = root / entry.name
        try:
            with path.open("rb") as src:
                info.size = os.fstat(src.fileno()).st_size
                tar.addfile(info, src)
        except OSError as exc:
            raise BundleError(f"cannot read {entry.name}: {exc.strerror or exc}") from None


def _too_large(entries: Iterable[_Entry], max_bytes: int) -> BundleTooLarge:
    files = sorted((e for e in entries if e.kind == "file"), key=lambda e: (-e.size, e.name))
    largest = ", ".join(f"{e.name} ({format_size(e.size)})" for e in files[:_LARGEST_SHOWN])
    return BundleTooLarge(
        f"the code bundle is larger than {format_size(max_bytes)} compressed "
        f"(TRAINYARD_BUNDLE_MAX_BYTES); largest files: {largest or 'none'}. "
        f"Add what the job does not need (data, checkpoints, outputs) to {IGNORE_FILE} "
        "(gitignore syntax) in the working directory, or submit with --no-code"
    )


def format_size(size: int) -> str:
    """``1258291`` -> ``1.2 MiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
