"""The cache of job environments is bounded by the disk it takes as well as by its count:
the least recently used environments no job is in go until both bounds hold, sizes read
from what each build recorded (no walk of every environment on every prune)."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_platform.services.runner import disk_watch
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.environments import (
    DEFAULT_MAX_SHARE,
    LAST_USED,
    MARKER,
    MAX_SETTING,
    SIZE,
    STORE,
    EnvironmentBuildError,
    EnvironmentCache,
    InstallError,
    out_of_space,
)

MIB = 1024**2


def key(n: int) -> str:
    return f"{n:064x}"


def publish(root: Path, n: int, size: int, used: float) -> None:
    """A published environment of ``size`` bytes of data, last used at ``used``."""
    target = root / STORE / f"{key(n)}.test"
    target.mkdir(parents=True)
    with (target / "data").open("wb") as out:
        out.write(os.urandom(size))  # incompressible: every byte takes disk
    (target / MARKER).write_text(json.dumps({"packages": []}))
    (target / LAST_USED).write_text("")
    os.utime(target / LAST_USED, (used, used))
    (root / key(n)).symlink_to(os.path.relpath(target, root))


@pytest.fixture
def cache(tmp_path: Path) -> EnvironmentCache:
    root = tmp_path / "envs"
    for n in range(1, 5):  # 1 is the least recently used
        publish(root, n, MIB, used=1000.0 + n)
    return EnvironmentCache(root, sys.executable, "pip")


@pytest.fixture
def in_use(cache: EnvironmentCache) -> Iterator[None]:
    """Environment 1 held as a job's lease holds it (its lock shared)."""
    fd = os.open(cache.root / f"{key(1)}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    yield
    os.close(fd)


def left(cache: EnvironmentCache) -> list[str]:
    return sorted(k for k in (key(n) for n in range(1, 5)) if cache.path(k).exists())


def test_the_least_recently_used_go_until_the_cache_fits(cache: EnvironmentCache) -> None:
    assert cache.prune(10, max_bytes=int(2.5 * MIB)) == [key(1), key(2)]
    assert left(cache) == [key(3), key(4)]
    assert sorted(p.name for p in (cache.root / STORE).iterdir()) == [
        f"{key(3)}.test",
        f"{key(4)}.test",
    ]


def test_both_bounds_hold_after_a_prune(cache: EnvironmentCache) -> None:
    assert cache.prune(1, max_bytes=10 * MIB) == [key(1), key(2), key(3)]
    assert left(cache) == [key(4)]


@pytest.mark.usefixtures("in_use")
def test_an_environment_in_use_is_never_removed_for_its_size(
    cache: EnvironmentCache, caplog: pytest.LogCaptureFixture
) -> None:
    assert cache.prune(10, max_bytes=int(2.5 * MIB)) == [key(2), key(3)]
    assert left(cache) == [key(1), key(4)]
    with caplog.at_level(logging.WARNING):
        assert cache.prune(10, max_bytes=MIB // 2) == [key(4)]  # key(1) alone is over
    assert left(cache) == [key(1)]
    assert MAX_SETTING in caplog.text and "in use" in caplog.text


def test_sizes_are_recorded_once_and_read_after(
    cache: EnvironmentCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = cache.size(key(4))  # built before sizes were recorded: measured once
    assert size is not None and MIB <= size < 2 * MIB
    assert int((cache.path(key(4)) / SIZE).read_text()) == size

    def walked(*args: object, **kwargs: object) -> None:
        raise AssertionError("an environment's tree was walked again")

    assert cache.prune(10, max_bytes=100 * MIB) == []  # records the others' sizes
    monkeypatch.setattr(disk_watch, "measure", walked)
    assert cache.size(key(4)) == size
    assert cache.prune(10, max_bytes=int(2.5 * MIB)) == [key(1), key(2)]


# -- built for real: venvs of the test interpreter, nothing installed ---------------------
# ``pytest`` is provided and the base has it, so each of these requirement sets is met by
# the base: a build makes the venv and installs nothing (no index needed).


def real_cache(tmp_path: Path, max_bytes: int | None) -> EnvironmentCache:
    return EnvironmentCache(
        tmp_path / "envs", sys.executable, "pip", provided=("pytest",), max_bytes=max_bytes
    )


def test_a_build_records_its_size_and_the_cache_is_pruned_to_fit(tmp_path: Path) -> None:
    cache = real_cache(tmp_path, None)
    first = cache.acquire(["pytest"])  # a job runs in it
    target = cache.path(first.env.key).resolve()
    size = int((target / SIZE).read_text())
    assert 0 < size <= disk_watch.measure([target]).bytes
    cache.max_bytes = int(1.5 * size)

    second = cache.resolve(["pytest>=1"])  # over the bound, but both in use while it prunes
    assert cache.path(first.env.key).exists() and cache.path(second.key).exists()

    first.release()
    os.utime(cache.path(first.env.key) / LAST_USED, (1000.0, 1000.0))
    os.utime(cache.path(second.key) / LAST_USED, (2000.0, 2000.0))
    third = cache.resolve(["pytest>=2"])
    assert not cache.path(first.env.key).exists()
    assert not cache.path(second.key).exists()
    assert cache.path(third.key).exists()
    assert [p.name.split(".")[0] for p in (cache.root / STORE).iterdir()] == [third.key]


def test_an_environment_larger_than_the_bound_still_runs_its_job_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = real_cache(tmp_path, max_bytes=1)
    with caplog.at_level(logging.WARNING):
        lease = cache.acquire(["pytest"])
    assert cache.path(lease.env.key).exists() and not lease.env.cached
    assert "more than the whole cache" in caplog.text and MAX_SETTING in caplog.text
    lease.release()
    assert cache.prune(None, 1) == [lease.env.key]  # unused now: the first prune removes it


@pytest.fixture
def admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_ADMIN_TOKEN", "op-token")


@pytest.mark.usefixtures("admin_token")
def test_the_setting_in_bytes(tmp_path: Path) -> None:
    assert Settings(environments_max_gib=0).environments_max_bytes() is None
    assert Settings(environments_max_gib=1.5).environments_max_bytes() == int(1.5 * 1024**3)
    settings = Settings(environments_dir=tmp_path / "not" / "yet")  # made at the first build
    fs = os.statvfs(tmp_path)
    assert settings.environments_max_bytes() == int(fs.f_blocks * fs.f_frsize * DEFAULT_MAX_SHARE)


# -- a build that runs out of disk: the cache makes room ----------------------------------


def venv_fails_once(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """``_create_venv`` fails as a full disk makes it fail, the first time only."""
    tries: list[Path] = []
    real = EnvironmentCache._create_venv

    def create(self: EnvironmentCache, target: Path) -> None:
        tries.append(target)
        if len(tries) == 1:
            target.mkdir(parents=True)  # what it wrote before the disk was full
            raise EnvironmentBuildError(
                "creating the virtual environment failed (exit status 1):\n"
                "Error: [Errno 28] No space left on device"
            )
        real(self, target)

    monkeypatch.setattr(EnvironmentCache, "_create_venv", create)
    return tries


def test_a_build_out_of_disk_removes_the_unused_environments_and_builds_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = real_cache(tmp_path, None)
    for n in range(1, 4):
        publish(cache.root, n, MIB, used=1000.0 + n)
    fd = os.open(cache.root / f"{key(3)}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a job runs in environment 3
    tries = venv_fails_once(monkeypatch)
    try:
        with cache.acquire(["pytest"]) as env:
            assert len(tries) == 2 and not env.cached
            assert Path(env.python).exists()
        assert left(cache) == [key(3)]
    finally:
        os.close(fd)


def test_a_build_out_of_disk_fails_as_before_when_nothing_could_be_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = real_cache(tmp_path, None)
    tries = venv_fails_once(monkeypatch)
    with pytest.raises(EnvironmentBuildError, match="No space left on device"):
        cache.acquire(["pytest"])
    assert len(tries) == 1
    assert list((cache.root / STORE).iterdir()) == []  # nothing of the failed build is left


def test_what_says_the_disk_was_full() -> None:
    assert out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    assert out_of_space(
        InstallError("pip install failed; it said:\n  OSError: [Errno 122] Disk quota exceeded")
    )
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as exc:
            raise EnvironmentBuildError("could not write") from exc
    except EnvironmentBuildError as exc:
        assert out_of_space(exc)
    assert not out_of_space(InstallError("pip install failed: Failed to fetch"))
    assert not out_of_space(OSError(errno.EACCES, "Permission denied"))
