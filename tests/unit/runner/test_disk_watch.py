"""The measurement of a job's disk use (``disk_watch``) and the reason a job over its limit
fails with."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from trainyard_platform.services.runner import disk_watch
from trainyard_platform.services.runner.disk_watch import DiskUse, measure, over_limit
from trainyard_platform.services.runner.domain import StopRequest, decide_outcome

MIB = 1024**2


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        out.write(os.urandom(size))  # incompressible: a compressing file system counts it all


def test_files_count_what_they_take_on_disk(tmp_path: Path) -> None:
    write(tmp_path / "a" / "b" / "data", 2 * MIB)
    # A sparse file of 1 TiB apparent size takes (almost) nothing.
    with (tmp_path / "sparse").open("wb") as sparse:
        sparse.truncate(1024**4)
    use = measure([tmp_path])
    assert 2 * MIB <= use.bytes < 3 * MIB
    assert use.entries == 5 and not use.stopped_early  # the root, a, b, data, sparse


def test_links_are_not_followed_and_hard_links_count_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside / "big", 4 * MIB)
    box = tmp_path / "box"
    write(box / "mine", MIB)
    (box / "to-outside").symlink_to(outside)
    (box / "to-big").symlink_to(outside / "big")
    os.link(box / "mine", box / "mine-again")
    use = measure([box])
    assert MIB <= use.bytes < 2 * MIB


def test_the_walk_stops_once_over_the_limit_or_past_its_entries(tmp_path: Path) -> None:
    for i in range(20):
        write(tmp_path / f"f{i}", MIB)
    use = measure([tmp_path], limit_bytes=3 * MIB)
    assert use.stopped_early and use.entries < 10 and use.bytes > 3 * MIB
    assert over_limit(use, 3 * MIB) is not None
    many = measure([tmp_path], max_entries=5)
    assert many.stopped_early and many.entries == 6
    assert over_limit(many, 100 * MIB, max_entries=5) == (
        "the job made over 5 files and folders in its sandbox, over its disk limit "
        "(TRAINYARD_RUNNER_JOB_DISK_GIB bounds 0.098 GiB in at most 5 entries)"
    )


def test_what_vanishes_or_cannot_be_read_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert measure([tmp_path / "gone"]) == DiskUse(0, 0, False)
    write(tmp_path / "kept", MIB)
    write(tmp_path / "vanishing" / "f", MIB)
    real_scandir = os.scandir

    def scandir(folder: str | int) -> object:  # the folder removed between listing and reading
        path = folder if isinstance(folder, str) else os.readlink(f"/proc/self/fd/{folder}")
        if path.endswith("vanishing"):
            raise FileNotFoundError(path)
        return real_scandir(folder)

    monkeypatch.setattr(disk_watch.os, "scandir", scandir)
    use = measure([tmp_path])
    assert MIB <= use.bytes < 2 * MIB


def test_the_reason_names_the_use_the_limit_and_the_setting() -> None:
    use = DiskUse(int(12.3 * 1024**3), 10, True)
    assert over_limit(use, 10 * 1024**3) == (
        "the job wrote 12.3 GiB to its sandbox, over its disk limit of 10 GiB "
        "(TRAINYARD_RUNNER_JOB_DISK_GIB)"
    )
    assert over_limit(DiskUse(10 * 1024**3, 10, False), 10 * 1024**3) is None


def test_a_job_stopped_over_a_limit_fails_as_user_error_whatever_its_exit() -> None:
    stop = StopRequest("over_limit", "the job wrote ...")
    for exit_code in (0, -15, -9, 1):
        outcome = decide_outcome(exit_code, stop)
        assert (outcome.kind, outcome.failure_kind, outcome.reason) == (
            "failed",
            "user_error",
            "the job wrote ...",
        )


def test_folders_nested_past_what_a_path_names_are_over_the_limit(tmp_path: Path) -> None:
    """A folder whose path is longer than the kernel takes (``ENAMETOOLONG``) cannot be
    listed by its path: what lies below it was not counted, so a job could keep any amount
    of data there. Such nesting is over the limit, as too many entries are."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):  # 20 x 256 bytes: past the 4096 bytes of a path
            os.mkdir("d" * 255, dir_fd=fd)
            inner = os.open("d" * 255, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        data = os.open("data", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        try:
            os.write(data, os.urandom(2 * MIB))
        finally:
            os.close(data)
    finally:
        os.close(fd)
    use = measure([tmp_path], limit_bytes=1 * MIB)
    why = over_limit(use, 1 * MIB)
    assert why is not None and "path" in why


@pytest.mark.parametrize("listing", ["d", "e"])
def test_a_folder_swapped_for_a_link_while_measured_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listing: str
) -> None:
    """The job changes its sandbox while it is measured: ``sandbox/d`` is replaced by a
    link once the walk has listed it as a folder (``listing`` "d": the next step is into it)
    or once it has listed what ``d`` holds (``listing`` "e": a step into ``d/e`` then goes
    through the link). Neither leads the walk, with the runner's privileges, out of the
    sandbox."""
    sandbox, outside = tmp_path / "sandbox", tmp_path / "outside"
    (sandbox / "d" / "e").mkdir(parents=True)
    write(outside / "e" / "data", 4 * MIB)
    listed = os.scandir
    swapped = []

    def listing_then_swap(folder: object) -> object:
        with listed(folder) as it:  # type: ignore[call-overload]
            entries = list(it)
        for entry in entries:
            entry.stat(follow_symlinks=False)  # cached as the walk saw it
        if not swapped and [e.name for e in entries] == [listing]:
            swapped.append(True)
            os.rename(sandbox / "d", tmp_path / "moved")
            (sandbox / "d").symlink_to(outside)
        return contextlib.nullcontext(entries)

    monkeypatch.setattr(disk_watch.os, "scandir", listing_then_swap)
    use = measure([sandbox])
    assert swapped
    assert use.bytes < 4 * MIB
