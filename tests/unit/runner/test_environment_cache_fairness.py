"""One team naming ever new requirement sets (one package version changed each time, a
cheap stream of jobs) evicts its own job environments, not the other teams': a prune
removes those of the team holding the largest share of the cache first. Before, it removed
the least recently used whoever they were, so such a stream flushed every other team's
environments and their next jobs rebuilt them (minutes each, on the GPU's time)."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.unit.runner.test_launch import GRANT
from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.environments import (
    LAST_USED,
    MARKER,
    SIZE,
    STORE,
    USERS,
    EnvironmentCache,
    RequirementsError,
)
from trainyard_platform.services.runner.sandbox import PlatformError

MIB = 1024**2


@pytest.fixture
def sizes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Builds are fakes (no venv, nothing installed): a build publishes an environment of
    the size this maps its first requirement to (1 MiB when it has none)."""
    chosen: dict[str, int] = {}

    def build(self: EnvironmentCache, key: str, requirements: list[str], base: object) -> None:
        target = self.root / STORE / f"{key}.fake"
        target.mkdir(parents=True)
        (target / SIZE).write_text(f"{chosen.get(requirements[0], MIB)}\n")
        (target / LAST_USED).write_text("")
        (target / MARKER).write_text(json.dumps({"packages": []}))
        self.path(key).symlink_to(os.path.relpath(target, self.root))

    monkeypatch.setattr(EnvironmentCache, "_build", build)
    return chosen


def team_file(team: str) -> str:
    return hashlib.sha256(team.encode()).hexdigest()


class Node:
    """A runner's cache and a clock: each job's use is dated a second after the previous
    one (all in the past, so a build being pruned after is the newest)."""

    def __init__(self, tmp_path: Path, keep: int | None, max_bytes: int | None = None) -> None:
        self.cache = EnvironmentCache(
            tmp_path / "envs", sys.executable, "pip", keep=keep, max_bytes=max_bytes
        )
        self.clock = itertools.count(1_000_000)

    def job(self, team: str | None, package: str) -> str:
        """A job of ``team`` needing ``package``; the key of its environment."""
        env = self.cache.resolve([package], team)
        self.dated(env.key, team)
        return env.key

    def dated(self, key: str, team: str | None) -> None:
        """Date the last use of ``key`` (by ``team``) by the clock."""
        when = float(next(self.clock))
        os.utime(self.cache.path(key) / LAST_USED, (when, when))
        if team is not None:
            os.utime(self.cache.path(key) / USERS / team_file(team), (when, when))

    def key(self, package: str) -> str:
        return self.cache.key([package])

    def left(self) -> list[str]:
        return sorted(
            p.name for p in self.cache.root.iterdir() if len(p.name) == 64 and p.is_symlink()
        )


@pytest.mark.usefixtures("sizes")
def test_a_team_naming_new_sets_evicts_its_own_environments_not_another_teams(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, keep=4)
    a = [node.job("vision", f"a=={n}") for n in range(3)]
    b = [node.job("flood", f"b=={n}") for n in range(6)]
    # Two teams: a fair share of two environments each. vision's two most recent stay;
    # flood's own older ones went to make room for its new ones.
    assert node.left() == sorted([a[1], a[2], b[4], b[5]])

    # A job of vision's again: the environment is there (cached), nothing rebuilt.
    with node.cache.acquire(["a==2"], "vision") as env:
        assert env.cached


@pytest.mark.usefixtures("sizes")
def test_an_environment_in_use_is_never_evicted_whoever_holds_the_most(tmp_path: Path) -> None:
    node = Node(tmp_path, keep=3)
    a = node.job("vision", "a==0")
    first = node.job("flood", "b==0")
    lease = node.cache.acquire(["b==0"], "flood")  # a job of flood's runs in its oldest
    node.dated(first, "flood")
    try:
        b = [node.job("flood", f"b=={n}") for n in range(1, 5)]
        assert node.left() == sorted([a, first, b[2], b[3]])  # passed over: it stays
    finally:
        lease.release()
    assert node.cache.prune(3) == [first]


def test_the_byte_bound_evicts_the_team_holding_the_most_bytes(
    tmp_path: Path, sizes: dict[str, int]
) -> None:
    sizes.update({"a==0": 2 * MIB, "a==1": 2 * MIB})
    node = Node(tmp_path, keep=None, max_bytes=6 * MIB)
    a = [node.job("vision", f"a=={n}") for n in range(2)]
    b = [node.job("flood", f"b=={n}") for n in range(6)]
    # A fair share of 3 MiB each: vision keeps its most recent 2 MiB, flood the rest.
    assert node.left() == sorted([a[1], *b[2:]])


@pytest.mark.usefixtures("sizes")
def test_an_environment_shared_with_a_team_under_its_share_stays(tmp_path: Path) -> None:
    node = Node(tmp_path, keep=3)
    a = node.job("vision", "a==0")
    shared = node.job("vision", "shared==1")
    assert node.job("flood", "shared==1") == shared  # flood uses it too, later than vision
    b = [node.job("flood", f"b=={n}") for n in range(4)]
    # The shared one counts half for each: vision holds 1.5 (its fair share, not over it),
    # so what it uses stays although flood used the shared one before its own.
    assert node.left() == sorted([a, shared, b[3]])
    records = sorted(p.name for p in (node.cache.path(shared) / USERS).iterdir())
    assert records == sorted([team_file("vision"), team_file("flood")])


@pytest.mark.usefixtures("sizes")
def test_environments_no_team_is_recorded_on_go_first_the_oldest_first(tmp_path: Path) -> None:
    node = Node(tmp_path, keep=4)
    old = [node.job(None, f"old=={n}") for n in range(2)]  # as a cache of before: no record
    assert not (node.cache.path(old[0]) / USERS).exists()
    a = node.job("vision", "a==0")
    b = [node.job("flood", f"b=={n}") for n in range(4)]
    assert old[0] not in node.left()  # the oldest went first
    assert node.left() == sorted([a, *b[1:]])

    # An old one used by a team again is that team's from then on.
    node = Node(tmp_path / "again", keep=2)
    old = [node.job(None, f"old=={n}") for n in range(2)]
    node.job("vision", "old==0")
    new = node.job("flood", "b==0")
    assert node.left() == sorted([old[0], new])


@pytest.mark.usefixtures("sizes")
def test_a_use_is_recorded_per_team_in_a_folder_job_users_cannot_read(tmp_path: Path) -> None:
    node = Node(tmp_path, keep=None)
    key = node.job("vision", "a==0")
    node.job("vision", "a==0")
    node.job("nlp", "a==0")
    folder = node.cache.path(key) / USERS
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [team_file("vision"), team_file("nlp")]
    )


def test_without_any_team_recorded_the_least_recently_used_go_first(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    for n in range(1, 5):
        target = root / STORE / f"{n:064x}.test"
        target.mkdir(parents=True)
        (target / MARKER).write_text(json.dumps({"packages": []}))
        (target / LAST_USED).write_text("")
        os.utime(target / LAST_USED, (1000.0 + n, 1000.0 + n))
        (root / f"{n:064x}").symlink_to(os.path.relpath(target, root))
    fd = os.open(root / f"{1:064x}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)  # in use: kept, and counted among those beyond keep
    try:
        cache = EnvironmentCache(root, sys.executable, "pip")
        assert cache.prune(2) == [f"{2:064x}"]
    finally:
        os.close(fd)


class _Environments:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str | None]] = []

    def acquire(self, requirements: list[str], team: str | None = None) -> Iterator[Any]:
        self.calls.append((requirements, team))
        raise RequirementsError("stop here")


def test_the_runner_resolves_a_jobs_environment_for_the_jobs_team() -> None:
    environments = _Environments()
    with pytest.raises(PlatformError):
        launch.prepare(
            GRANT, cast(Any, None), cast(Any, None), cast(Any, None), cast(Any, environments), {}
        )
    assert environments.calls == [(GRANT.spec.requirements, GRANT.spec.team)]
