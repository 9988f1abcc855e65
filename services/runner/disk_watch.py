"""A job's disk use, measured the way kubelet bounds ephemeral storage without quotas: the
runner walks the folders the job writes to (its sandbox: code, home, tmp and checkpoint
staging) every few seconds, and a job over its limit is stopped (``JobRun``) and fails as
``user_error``, its reason naming the limit and the setting.

The walk is cheap and safe: ``os.scandir`` without following symbolic links (a link
counts as itself, never as what it points to, and a folder the job swaps for a link while
it is measured is not entered: each is opened ``O_NOFOLLOW`` and must still be where it
was listed), ``st_blocks * 512`` per entry, so a sparse
file counts what it takes on disk, not its apparent size, and hard links to one inode count
once. It stops as soon as the use is over the limit, and after ``MAX_ENTRIES`` files and
folders: a job that makes more than that is over its limit too (inodes fill a disk as bytes
do), so the bound on the walk leaves no way around the limit. So is a job that nests
folders deeper than a path can name (``ENAMETOOLONG``, 4096 bytes on Linux): the walk
reaches each by its path, and what lies below would go uncounted. Files and folders vanishing
or unreadable during the walk are skipped (the job writes while it is measured); the walk
never raises for them.

The limit holds from the moment the sandbox exists, not only once the job runs: what is
written there before (git fetching the job's code, its bundle unpacked, its checkpoint
restored, its interpreter probed) is the job's too. ``Watch`` measures the sandbox in a
thread of its own while those blocking steps run, every ``interval_s`` as the running
job's watch does, calls its ``stop`` once (the launch kills the job's processes: git and
the probe run as the job) when the sandbox is over the limit, and measures once more when
the steps end; the launch then fails the job as ``user_error``, naming the limit.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
MAX_ENTRIES = 1_000_000
"""Files and folders a job may have in its sandbox; the walk stops here."""
SETTING = "TRAINYARD_RUNNER_JOB_DISK_GIB"


@dataclass(frozen=True)
class DiskUse:
    bytes: int
    """Bytes taken on disk (``st_blocks * 512``), counted up to where the walk stopped."""
    entries: int
    """Files and folders counted."""
    stopped_early: bool
    """The walk stopped before the end (over the limit in bytes, ``max_entries``, or a
    path too long)."""
    path_too_long: bool = False
    """A file or folder's path was longer than the kernel takes (``ENAMETOOLONG``): what
    lies there and below cannot be measured by its path."""


def measure(
    roots: Iterable[Path], limit_bytes: int | None = None, max_entries: int = MAX_ENTRIES
) -> DiskUse:
    """The disk use of everything under ``roots`` (the roots included), stopping once it is
    over ``limit_bytes`` (None: no stop for bytes) or past ``max_entries``."""
    total = 0
    entries = 0
    seen: set[tuple[int, int]] = set()
    pending: list[str] = []
    for root in roots:
        try:
            info = os.lstat(root)
        except OSError:
            continue
        total += info.st_blocks * 512
        entries += 1
        if stat.S_ISDIR(info.st_mode):
            pending.append(os.path.realpath(root))
    while pending:
        folder = pending.pop()
        try:
            fd = _open_folder(folder)
        except OSError as exc:  # the folder gone, not ours to read, or not where it was
            if exc.errno == errno.ENAMETOOLONG:  # not unreadable: a place to hide data
                return DiskUse(total, entries, True, path_too_long=True)
            continue
        try:
            with os.scandir(fd) as listing:
                for entry in listing:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:  # gone since it was listed
                        continue
                    entries += 1
                    if info.st_nlink > 1:
                        key = (info.st_dev, info.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(os.path.join(folder, entry.name))
                    if (limit_bytes is not None and total > limit_bytes) or entries > max_entries:
                        return DiskUse(total, entries, True)
        except OSError:  # the folder gone while listed: what it held is not counted
            continue
        finally:
            os.close(fd)
    return DiskUse(total, entries, False)


def _open_folder(path: str) -> int:
    """A descriptor of the folder ``path`` (a real path), opened only where it still is
    that folder: the job may swap a folder of its sandbox for a link between the moment it
    was listed and now (at the last step of the path or any before it), and the walk would
    then measure, with the runner's privileges, whatever the link points to. ``OSError``
    when it is not (``ELOOP``: a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if _FDS.is_dir() and os.readlink(_FDS / str(fd)) != path:
            raise OSError(errno.ELOOP, "reached through a link", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


_FDS = Path("/proc/self/fd")


def over_limit(use: DiskUse, limit_bytes: int, max_entries: int = MAX_ENTRIES) -> str | None:
    """Why ``use`` is over the job's disk limit (the reason its attempt fails with), or
    None when it is within it."""
    if use.bytes > limit_bytes:
        return (
            f"the job wrote {gib(use.bytes)} to its sandbox, over its disk limit of "
            f"{gib(limit_bytes)} ({SETTING})"
        )
    if use.entries > max_entries:
        return (
            f"the job made over {max_entries} files and folders in its sandbox, over its "
            f"disk limit ({SETTING} bounds {gib(limit_bytes)} in at most {max_entries} entries)"
        )
    if use.path_too_long:
        return (
            "the job nested folders in its sandbox deeper than a path can name, over its "
            f"disk limit (what lies there cannot be measured; {SETTING})"
        )
    return None


def gib(size: int) -> str:
    """``size`` in GiB for a reason: ``12.3 GiB``, ``10 GiB``, ``0.02 GiB``."""
    value = size / GIB
    text = f"{value:.1f}" if value >= 1 else f"{value:.2g}"
    return f"{text.removesuffix('.0')} GiB"


class Watch:
    """Measure ``roots`` every ``interval_s`` in a thread of its own, from ``__enter__`` to
    ``__exit__`` (the steps before a job starts, blocking), and call ``stop`` once, from
    that thread, when they are over ``limit_bytes`` (``over_limit``); ``over`` is why, once
    the steps have ended. A measurement that fails is tried again at the next interval."""

    def __init__(
        self,
        roots: Iterable[Path],
        limit_bytes: int,
        interval_s: float,
        stop: Callable[[], None],
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._roots = list(roots)
        self._limit_bytes = limit_bytes
        self._interval_s = interval_s
        self._stop = stop
        self._max_entries = max_entries
        self._ended = threading.Event()
        self._why: str | None = None
        self._thread = threading.Thread(target=self._watch, name="disk watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._ended.set()
        self._thread.join()

    def over(self) -> str | None:
        """Why the roots went over the limit while watched, or are over it now (measured
        again: what the steps wrote last, within one interval), else None. Call it once
        the watch has ended."""
        if self._why is None:
            self._why = self._measure()
        return self._why

    def _measure(self) -> str | None:
        try:
            use = measure(self._roots, self._limit_bytes, self._max_entries)
        except OSError:
            return None
        return over_limit(use, self._limit_bytes, self._max_entries)

    def _watch(self) -> None:
        while not self._ended.wait(self._interval_s):
            why = self._measure()
            if why is not None:
                self._why = why
                self._stop()
                return
