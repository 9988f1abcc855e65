"""Job Python environments, cached by the hash of their requirement set.

A job with ``requirements`` runs in a virtual environment of its own, built once per
requirement set and reused by every later job that asks for the same set. A job without
any runs on the base interpreter as is.

**Layering.** The platform's base layer (torch, the ``trainyard`` SDK, and whatever else is
installed in ``base_python``'s environment) stays visible in every job environment: the
venv is created from ``base_python`` and gets a ``.pth`` file (``_trainyard_base.pth``) that
runs ``site.addsitedir`` on the base environment's site-packages. ``addsitedir`` appends, so
the job's own packages come first on ``sys.path`` and win over the base's (a requirement
``six==1.16.0`` shadows a base ``six 1.17``); it also processes the base's own ``.pth``
files, so an editable ``trainyard`` install (an import-hook ``.pth``) keeps working.

**Provided packages** (``provided``, default ``torch`` and ``trainyard``) are the base
layer's: a job never gets a second copy of one (gigabytes, and a build that may not match
the node's driver). Of those the base has:

- A requirement naming one (``torch``, ``torch>=2``) that the base's version satisfies is
  met by the base: it is not passed to the installer, and the job imports the base's. One
  the base's version does not satisfy (``torch==2.1.0``), or one naming a URL, fails the
  build with a :class:`RequirementsError` naming the requirement, the base's version and
  what to write instead.
- The rest is resolved with each one pinned to the base's version (a constraints file,
  ``name==version``), so a dependant of torch resolves to a version whose metadata accepts
  the base's torch (torchvision, say) or, where there is none, the build fails with the
  installer's account of the conflict (a :class:`RequirementsError`). Versions only: the
  build variant (CPU or a CUDA version) is whatever the index serves, so the index must
  serve the base torch's variant (a ``+cpu`` torch needs a ``+cpu`` torchvision). Nothing pinned is installed into
  the venv: a build that did is refused.

The installers differ in how they see the base layer while installing: ``pip`` runs under
the job venv's interpreter and sees the base packages on ``sys.path`` (the pins are
installed already, and it skips every requirement the base satisfies; a conflicting
version of a package that is not provided is installed into the venv and shadows the
base's). ``uv`` only looks at the venv's own site-packages (astral-sh/uv#4466): while it
installs, each pinned package has a metadata-only record in the venv (a ``.dist-info``
with its name and version, no files, no dependencies), so uv takes it as installed and
keeps it; the records are removed after the install. uv installs the rest of the
requirements' dependency closure into the venv, even packages the base has. A provided
name the base does not have is an ordinary package.

**Cache layout** under ``root``::

    <key>              symlink -> .store/<key>.<random>   the published environment
    <key>.lock         flock: exclusive while building, shared while in use
    .store/<key>.<random>/
        bin/python ...                                     the venv
        .trainyard-size                                    bytes it takes on disk, measured
                                                           once, when its build finished
        .trainyard-ready                                   JSON, written last (the freeze)
        .trainyard-wheels/                                 the job's wheel URLs' files,
                                                           while they are installed
        .last-used                                         touched on every resolve
        .used-by/<sha256 of a team>                        one empty file per team whose
                                                           jobs used it, touched on each
                                                           of its resolves (0700)

**Wheel URLs.** The installer never fetches a URL a job names: the runner downloads each
wheel URL of the requirements into the environment being built (``WHEELS``) with
``wheels.fetch_wheel`` (the address judged as a job's git code is, connected to exactly
that one, no redirect, at most ``max_wheel_bytes`` and ``timeout`` seconds for all the
wheels of the environment together) and gives the installer the file
(``name @ file:///...``); the folder is removed once they are installed. A wheel whose
metadata names a dependency by URL is refused (``wheels.refuse_direct_references``): the
installer would fetch that URL itself, unjudged. A download the
requirement is at fault for raises :class:`RequirementsError`, one the network or server is
(as an unreachable index) :class:`InstallError`, each naming the requirement
(``EnvironmentBuildError.requirement``). The sha256 of each file is recorded in the marker
(``wheels``, by URL); the key is the URL's, as for any requirement: a URL whose content
changed later still gets the environment built from what it served first, since the key
must be known before anything is downloaded (else every resolve would download every
wheel); a URL's ``#sha256=`` fragment pins its content, and is part of the key.

``key`` is the sha256 of how environments are built (a recipe number), the normalised,
sorted requirements, the base interpreter's
version, the installer, the base's site-packages paths and package list, and the
``provided`` names: a change of base layer gets new environments rather than reusing ones
built against the old one.

**Atomic publication.** An environment is built at its final physical path under
``.store/`` and published by atomically replacing the ``<key>`` symlink once it is complete
(marker included). A venv cannot be built in a temporary folder and renamed afterwards:
installers write absolute paths into it (console-script shebangs, ``RECORD``), which a
rename would break. A crash mid-build therefore leaves an unpublished folder in ``.store/``
(removed by ``prune``) and never a ``<key>`` that looks ready.

**Bounds.** The cache holds at most ``keep`` environments and ``max_bytes`` bytes on disk:
:meth:`EnvironmentCache.prune` removes environments no job is in until both hold, at the
runner's start and after each build: those no team is recorded on first, then those of
the team holding the largest share of the cache, each team's least recently used first,
so one team naming ever new requirement sets evicts its own environments, not the other
teams' (the order is :meth:`EnvironmentCache.prune`'s). Sizes are read from each
environment's ``.trainyard-size`` (measured by walking it once, when its build finished:
blocks taken, a file hard-linked with the installer's cache counted in full), so a prune
walks no environment's tree. Environments in use are never removed, so the cache may stay
over its bound while they are; one that alone is larger than ``max_bytes`` is still built and
its job runs (a warning says so), and it goes at the first prune that finds it unused.
**A build's own bound.** While an environment is built, what it writes (the venv, the
wheels downloaded into it, what the installer unpacks there) is measured every
``build_check_s`` (``disk_watch.Watch``, as a job's sandbox is) and once more when its steps
end, against ``build_max_bytes`` (``TRAINYARD_RUNNER_ENV_BUILD_MAX_GIB``): the requirements
are a tenant's, and a wheel that unpacks to a huge size, or many large ones, would
otherwise fill the node's disk. A build over it has its running command killed (its
process group), its folder removed, nothing published, and fails with a
:class:`RequirementsError` naming the bound (:class:`BuildTooLarge`), whatever the
command said (out of disk included). A build that runs out of disk (:func:`out_of_space`)
within its bound removes every environment no job is in and, when that removed any, is
tried once more: the cache gives up its disk before a job fails for it; what fails again
fails as it would have. Not covered: the installer's own cache. uv unpacks each wheel into
it (``UV_CACHE_DIR``) before it links the files into the environment, so with uv a wheel
that unpacks to more than the disk has free fills the disk there, before the environment
grows: that build fails out of disk within its bound, and so removes the cached
environments no job is in (pip unpacks into the environment itself). So does any build
within its bound on a disk with less than that bound free.

**Concurrency.** Resolves of the same key, from threads or from other runner processes on
the same ``root``, build once: the builder holds ``fcntl.flock(LOCK_EX)`` on
``<key>.lock``; everyone else waits for it and then finds the environment ready (a
launch's wait for it is the platform's time, not its job's: ``deadline.platform_time``). A
resolve takes the lock shared to check readiness, and an :class:`EnvironmentLease` keeps
it shared for as long as a job runs, so :meth:`EnvironmentCache.prune`, which only removes
an environment whose lock it can take exclusively without waiting, never removes one in
use. Lock files are never deleted (deleting a lock file others may have open breaks
mutual exclusion).

**Nothing of the packages runs while building.** Requirements are a tenant's choice and
the build runs as the runner: only wheels are installed (``uv --no-build``, ``pip
--only-binary=:all:``: a source distribution's ``setup.py`` is code, so a requirement
available only as source fails to build, saying so); bytecode is compiled by the
interpreter the venv was made from, started with ``-I -S`` (``site`` would run the ``.pth``
files of the installed wheels), never by the venv's ``bin/python``, which pip lets a
wheel's ``.data`` replace (a build where one did is refused, as the requirements' fault);
the package list is read from their metadata in the runner's own process
(:func:`installed_packages`). The installers get an environment of their own settings
(``UV_*``, ``PIP_*``, proxies, certificates, ``PATH``, ``HOME``: ``installer_environment``),
never the runner's credentials. The job runs the ``.pth`` files, as its own user.

**Permissions.** Jobs run as an unprivileged uid, so every environment must be readable by
others: the installers run with umask 022, and after a build every directory of it is set
to 0755 and every file gets read (and, where its owner has it, execute) permission for
group and others, otherwise keeping its mode. ``root`` and ``.store`` are 0711: a job
reaches the environment it is given but lists neither, so it cannot find the environments
of other teams (their markers and ``direct_url.json`` records name their requirements).
The one folder job users cannot read is ``.used-by`` (0700, made at the first resolve for a
team): which teams use an environment is the runner's alone. The process-wide umask is not touched
(the runner is multi-threaded); ``root``'s parents must be traversable by the job's uid.

Every method blocks (subprocesses, file locks): call them in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Literal

from trainyard_platform.services.runner import disk_watch
from trainyard_platform.services.runner.deadline import cap_timeout, platform_time
from trainyard_platform.services.runner.git_remote import PUBLIC_ONLY, PrivateAllowed
from trainyard_platform.services.runner.wheels import (
    MAX_WHEEL_BYTES,
    WheelRefused,
    WheelTooLarge,
    WheelUnreachable,
    fetch_wheel,
    refuse_direct_references,
)
from trainyard_platform.shared.requirements import (
    WHEEL_URL,
    requirement_problem,
    without_credentials,
)

log = logging.getLogger(__name__)

Installer = Literal["uv", "pip"]

MARKER = ".trainyard-ready"
LAST_USED = ".last-used"
USERS = ".used-by"
"""Folder in an environment of one empty file per team that used it (named by the sha256 of
the team's name), its modification time the team's last use."""
SIZE = ".trainyard-size"
WHEELS = ".trainyard-wheels"
"""Folder in an environment being built where the job's wheel URLs are downloaded to
(``wheels``), removed once they are installed."""
MAX_SETTING = "TRAINYARD_RUNNER_ENVIRONMENTS_MAX_GIB"
DEFAULT_MAX_SHARE = 0.2
"""Share of its file system's size the cache takes at most when ``MAX_SETTING`` is unset."""
BUILD_MAX_SETTING = "TRAINYARD_RUNNER_ENV_BUILD_MAX_GIB"
BUILD_MAX_BYTES = 32 * disk_watch.GIB
"""Default of ``build_max_bytes``: the most one environment takes on disk while it is built."""
BUILD_CHECK_S = 5.0
"""Default of ``build_check_s``: how often a build's disk use is measured."""
BASE_PTH = "_trainyard_base.pth"
STORE = ".store"
ERROR_TAIL_LINES = 20
DEFAULT_PROVIDED = ("torch", "trainyard")

_KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")
_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*"
    r"(?:\[(?P<extras>[^\]]*)\])?\s*(?P<rest>.*?)\s*$",
    re.DOTALL,
)

# Run with ``python -I``: the interpreter's version, its site-packages folders, and the
# distributions it imports, the first one per name along sys.path (the one that wins).
_PROBE = r"""
import importlib.metadata, json, os, re, site, sys, sysconfig
packages = {}
for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        packages.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
print(json.dumps({
    "version": sys.version,
    "site": [p for p in site.getsitepackages() if os.path.isdir(p)],
    "purelib": sysconfig.get_path("purelib"),
    "packages": sorted(f"{k}=={v}" for k, v in packages.items()),
}))
"""


class EnvironmentBuildError(RuntimeError):
    """A job environment could not be built; the message ends with the installer's last
    lines of output (the runner reports it as a ``platform_error``). ``requirement``: the
    one requirement (normalised) it is about, when it is about one alone (a wheel URL that
    could not be downloaded), so that the job's failure can name its field."""

    def __init__(self, message: str, requirement: str | None = None) -> None:
        super().__init__(message)
        self.requirement = requirement


class InstallError(EnvironmentBuildError):
    """Installing (or compiling) the job's requirements failed, for a reason the installer's
    output does not pin on them: the index or a download failed or ran out of time, the
    wheels did not fit on the disk, a package brought a provided one along. What is
    installed is the tenant's choice (a requirement may name any URL, any size), so the
    runner reports it as a ``platform_error`` that is retried but never held against the
    node; a failure of the build's other steps (the venv, the base's probe) is the node's."""


class RequirementsError(InstallError):
    """The job's requirements cannot be met, whatever the platform does: a package or
    version the index does not have, no wheel for this platform, requirements that
    conflict (with each other or with the base layer's provided packages). The job's own
    failure (the runner reports it as a ``user_error``), not the platform's."""


class BuildTooLarge(RequirementsError):
    """The environment took more disk while it was built than ``build_max_bytes``: what the
    job's requirements install is the tenant's choice, so it is the job's failure."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            "installing them took over "
            f"{disk_watch.gib(limit_bytes)} of disk (or over {disk_watch.MAX_ENTRIES} files), "
            "the most a job's environment may take while it is built "
            f"({BUILD_MAX_SETTING}): the build was stopped"
        )


# An installer's output that says the requirements cannot be met (uv, pip)...
_UNMET = (
    "No solution found when resolving dependencies",
    "Could not find a version that satisfies the requirement",
    "No matching distribution found",
    "ResolutionImpossible",
    "conflicting dependencies",
    "is not a supported wheel on this platform",
)
# ...unless it also says the index or the disk failed (then the verdict is not trustworthy:
# an unreachable index looks like a package that does not exist).
_PLATFORM_FAULTS = (
    "Failed to fetch",
    "error sending request",
    "Connection refused",
    "Connection reset",
    "ConnectionError",
    "NewConnectionError",
    "timed out",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "No space left on device",
    "Disk quota exceeded",
    "Permission denied",
)


_OUT_OF_SPACE = ("No space left on device", "Disk quota exceeded")


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the disk was full: an ``OSError``
    of ``ENOSPC`` or ``EDQUOT``, or an installer's output saying so."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(current, EnvironmentBuildError) and any(
            m in str(current) for m in _OUT_OF_SPACE
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def requirements_at_fault(output: str) -> bool:
    """Whether an installer's failing ``output`` blames the requirements (see
    :class:`RequirementsError`) and nothing of the platform."""
    return any(m in output for m in _UNMET) and not any(m in output for m in _PLATFORM_FAULTS)


@dataclass(frozen=True)
class JobEnvironment:
    """The interpreter a job runs with and what it sees."""

    python: str
    """The interpreter to run the job with."""
    bin_dir: Path | None
    """The venv's ``bin`` (to put first on ``PATH``); None for the base interpreter."""
    key: str
    packages: list[str]
    """``name==version`` of every distribution the job imports (its own over the base's),
    names normalised (PEP 503), sorted."""
    cached: bool
    """True when nothing had to be installed by this resolve."""
    seconds: float


@dataclass(frozen=True)
class _Probe:
    version: str
    site: tuple[str, ...]
    purelib: str
    packages: tuple[str, ...]


def canonical_name(name: str) -> str:
    """PEP 503 normalisation of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def normalize_requirement(requirement: str) -> str:
    """A textual normal form of a PEP 508 requirement: canonical name, sorted extras,
    whitespace-free sorted version specifiers, marker stripped. Two spellings of the same
    requirement that still differ (say, in a marker's spacing) only cost an extra build.
    Raises ValueError, naming the requirement and why, for one the submission API would
    refuse (``shared.requirements``: a ``file:`` URL, a local path, an installer option, a
    URL that is not a wheel's...): a grant may come from an old job or another producer
    than the API, and the installer runs as the runner."""
    problem = requirement_problem(requirement)
    if problem is not None:
        raise ValueError(f"requirement {without_credentials(requirement)!r}: {problem}")
    if "\n" in requirement or "\r" in requirement:
        raise ValueError(f"requirement {requirement!r} spans several lines")
    match = _REQUIREMENT.match(requirement)
    if match is None or not match["name"]:
        raise ValueError(f"requirement {requirement!r} does not start with a package name")
    name = canonical_name(match["name"])
    extras = ""
    if match["extras"] is not None:
        names = sorted({canonical_name(e.strip()) for e in match["extras"].split(",") if e.strip()})
        extras = f"[{','.join(names)}]" if names else ""
    rest = match["rest"]
    if rest.startswith("@"):
        # PEP 508 ends a URL at " ;" only: "x.whl;m" is one URL, the installers' too, and
        # not a wheel's (``requirement_problem`` refused it already, as ``wheel_url`` reads).
        url, *marker_part = re.split(r"\s;", rest[1:], maxsplit=1)
        if not WHEEL_URL.fullmatch(url.strip()):
            raise ValueError(
                f"requirement {requirement!r} names a URL that is not a wheel: only wheels are "
                "installed (building a source distribution or a git checkout runs its code)"
            )
        body = f" @ {url.strip()}"
        marker = marker_part[0].strip() if marker_part else ""
    else:
        spec, _, marker = rest.partition(";")
        spec = re.sub(r"\s+", "", spec)
        if spec.startswith("(") and spec.endswith(")"):
            spec = spec[1:-1]
        body = ",".join(sorted(s for s in spec.split(",") if s))
        marker = marker.strip()
    # After a URL, " ; ": PEP 508 reads "x.whl; m" as the URL "x.whl;" and then a marker
    # where none may be (``packaging`` refuses it, and the runner reads it to download).
    separator = " ; " if body.startswith(" @ ") else "; "
    return f"{name}{extras}{body}" + (f"{separator}{marker}" if marker else "")


def normalize_requirements(requirements: Sequence[str]) -> list[str]:
    """Normalised, deduplicated and sorted (see :func:`normalize_requirement`)."""
    return sorted({normalize_requirement(r) for r in requirements})


def _requirement_name(normalized: str) -> str:
    match = _REQUIREMENT.match(normalized)
    assert match is not None
    return match["name"]


class EnvironmentLease:
    """A resolved environment held in use: until :meth:`release` (or the end of a
    ``with`` block), :meth:`EnvironmentCache.prune` will not remove it."""

    def __init__(self, env: JobEnvironment, fd: int | None) -> None:
        self.env = env
        self._fd = fd
        self._lock = threading.Lock()

    def release(self) -> None:
        """Idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> JobEnvironment:
        return self.env

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class EnvironmentCache:
    """Job environments under ``root`` (see the module docstring).

    ``installer_env`` is added to the installers' environment (an index URL, a cache
    folder, ``UV_NO_CACHE``...); ``timeout`` bounds each installer command in seconds.
    ``keep`` and ``max_bytes``: after each build, :meth:`prune` to this many environments
    and bytes on disk (None: no such bound), so a stream of jobs with new requirement sets
    cannot fill the disk between restarts. ``fetch_allowed``: what the job's wheel URLs may
    name although it is not public (``Settings.fetch_allow_private``), ``max_wheel_bytes``
    the most bytes downloaded from them for one environment, all together (``wheels``).
    ``build_max_bytes``: the most disk one environment takes while it is built (None: no
    bound), measured every ``build_check_s`` (module docstring, "A build's own bound").
    """

    def __init__(
        self,
        root: Path,
        base_python: str,
        installer: Installer = "uv",
        *,
        provided: Sequence[str] = DEFAULT_PROVIDED,
        installer_env: Mapping[str, str] | None = None,
        timeout: float = 1800.0,
        interpreter: str | None = None,
        keep: int | None = None,
        max_bytes: int | None = None,
        fetch_allowed: PrivateAllowed = PUBLIC_ONLY,
        max_wheel_bytes: int = MAX_WHEEL_BYTES,
        build_max_bytes: int | None = BUILD_MAX_BYTES,
        build_check_s: float = BUILD_CHECK_S,
    ) -> None:
        if installer not in ("uv", "pip"):
            raise ValueError(f"installer must be 'uv' or 'pip', not {installer!r}")
        self.root = Path(root).absolute()
        # Absolute (installers run in ``root``), but not resolved: a venv's python is a
        # symlink whose location decides which environment it is.
        if os.sep in base_python:
            self.base_python = os.path.abspath(base_python)
        else:
            self.base_python = shutil.which(base_python) or base_python
        self.interpreter = os.path.abspath(interpreter) if interpreter else self.base_python
        """What job venvs are made from: ``base_python`` unless that one cannot be run by
        the job's users (e.g. it lives under ``/root``); then a system interpreter of the
        same version, and even a job without requirements gets a (cached) venv."""
        self.installer: Installer = installer
        self.provided = tuple(sorted({canonical_name(p) for p in provided}))
        self.installer_env = dict(installer_env or {})
        self.timeout = timeout
        self.keep = keep
        self.max_bytes = max_bytes
        self.fetch_allowed = fetch_allowed
        self.max_wheel_bytes = max_wheel_bytes
        self.build_max_bytes = build_max_bytes
        self.build_check_s = build_check_s
        self._building = threading.local()
        """``stopper``: the :class:`_Stopper` of the build this thread runs, if any."""
        self._base: _Probe | None = None
        self._base_lock = threading.Lock()

    # -- public ---------------------------------------------------------------------------

    def key(self, requirements: Sequence[str]) -> str:
        """The cache key of ``requirements`` on this base and installer."""
        return self._key(normalize_requirements(requirements))

    def path(self, key: str) -> Path:
        """Where the environment of ``key`` is published (it may not exist)."""
        return self.root / key

    def resolve(self, requirements: Sequence[str], team: str | None = None) -> JobEnvironment:
        """The environment for ``requirements``, built if needed, its use recorded for
        ``team`` (the job's: :meth:`prune` evicts by team; None: recorded for no team).
        Raises :class:`EnvironmentBuildError` when it cannot be built and ValueError for a
        requirement that is not a PEP 508 string."""
        lease = self.acquire(requirements, team)
        lease.release()
        return lease.env

    def acquire(self, requirements: Sequence[str], team: str | None = None) -> EnvironmentLease:
        """Like :meth:`resolve`, and keep the environment from being pruned until the
        lease is released: hold it for as long as the job runs."""
        started = time.monotonic()
        normalized = normalize_requirements(requirements)
        base = self._probe_base()
        key = self._key(normalized)
        if not normalized and self.interpreter == self.base_python:
            env = JobEnvironment(
                python=self.base_python,
                bin_dir=None,
                key=key,
                packages=list(base.packages),
                cached=True,
                seconds=time.monotonic() - started,
            )
            return EnvironmentLease(env, None)
        self._ensure_dir(self.root)
        fd = os.open(self._lock_path(key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            built = False
            while True:
                # Blocked only by a build of the same environment, another launch's: the
                # platform's queue, not this job's time (``deadline.platform_time``); a
                # build its own job's deadline cuts short is then this one's to make.
                with platform_time():
                    fcntl.flock(fd, fcntl.LOCK_SH)
                packages = self._ready_packages(key)
                if packages is not None:
                    break
                with platform_time():
                    fcntl.flock(fd, fcntl.LOCK_EX)  # not atomic: check again once held
                if self._ready_packages(key) is None:
                    self._build_making_room(key, normalized, base)
                    built = True
                # back to shared, and check again: a prune may slip in between
            self._touch(self.path(key) / LAST_USED)
            if team:
                self._record_use(key, team)
            env = JobEnvironment(
                python=str(self.path(key) / "bin" / "python"),
                bin_dir=self.path(key) / "bin",
                key=key,
                packages=packages,
                cached=not built,
                seconds=time.monotonic() - started,
            )
        except BaseException:
            os.close(fd)
            raise
        if built and (self.keep is not None or self.max_bytes is not None):
            # This one is held (shared lock): prune passes over it, and over any in use.
            self.prune(self.keep, self.max_bytes)
        return EnvironmentLease(env, fd)

    def size(self, key: str) -> int | None:
        """Bytes the published environment of ``key`` takes on disk, as recorded when its
        build finished (measured now, and recorded, for one built before sizes were); None
        when there is none."""
        target = self._published_target(key)
        return None if target is None else self._size(target)

    def prune(self, keep: int | None, max_bytes: int | None = None) -> list[str]:
        """Remove environments no job is in (resolving, building or leased), in the order
        below, until the cache holds at most ``keep`` (None: no bound on the count) and
        takes at most ``max_bytes`` on disk (None: no bound on the size). One in use is
        never removed but keeps its place in the order: for the count, the ``keep`` last
        in the order stay and so do those in use (one in use among the first is kept, and
        none goes in its stead); for the size, the next in the order goes instead, until
        the cache fits or all that is left is in use (a warning says so). Also removes
        leftovers of crashed builds. Returns the keys removed.

        **The order** (each next one chosen among those not yet passed over):

        1. Environments no team is recorded on (built before teams were recorded, or
           resolved without a team), the least recently used first: nobody holds a share
           of them.
        2. Then those whose teams all hold more than their fair share, then the rest.
           Within each, the team holding the largest share goes first (ties: the one whose
           use is the oldest), and of its environments the one it used least recently.

        A team's **holding** is what stays if the next one goes (those not yet passed over
        and those in use): each environment counts ``1/k`` for each of its ``k`` teams,
        in bytes (its size ``/ k``) while the cache is over ``max_bytes``, in
        environments while it is over ``keep`` only. Its **fair share** is the bound
        divided by the number of teams holding any. Fractional because the holdings then
        add up to what the teams hold: counted in full for each, an environment shared
        would make its teams look larger than they are, and a team could push another
        over its share by using that team's environments (and have them go first);
        fractionally, using another team's environment lowers that team's holding.

        So an environment any team under its fair share used stays while one used only
        by teams over theirs (or by none) can go, and a team naming ever new requirement
        sets is the largest holder and gives its own least recently used environments:
        it cannot flush the other teams'. Without any team recorded the order is the
        least recently used first."""
        if keep is not None and keep < 0:
            raise ValueError("keep must be >= 0")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if not self.root.is_dir():
            return []
        # A cache made before these folders were closed is closed at the runner's start.
        self._ensure_dir(self.root)
        if (self.root / STORE).is_dir():
            self._ensure_dir(self.root / STORE)
        waiting: list[_Cached] = []  # not yet passed over
        for entry in self.root.iterdir():
            if _KEY_PATTERN.match(entry.name) and entry.is_symlink():
                waiting.append(_Cached(entry.name, self._last_used(entry), self._users(entry)))
        sizes = {e.key: self.size(e.key) or 0 for e in waiting} if max_bytes is not None else {}
        total = sum(sizes.values())
        beyond_keep = len(waiting) - keep if keep is not None else 0
        kept: list[_Cached] = []  # passed over while in use: they stay
        removed: list[str] = []
        passed = 0
        while waiting:
            over_size = max_bytes is not None and total > max_bytes
            if passed >= beyond_keep and not over_size:
                break
            if over_size:
                assert max_bytes is not None
                going = _next_to_go(waiting, kept, sizes, max_bytes)
            else:
                assert keep is not None
                going = _next_to_go(waiting, kept, None, keep)
            waiting.remove(going)
            passed += 1
            with self._try_exclusive(going.key) as held:
                if not held:
                    kept.append(going)
                    continue
                target = self._published_target(going.key)
                self.path(going.key).unlink(missing_ok=True)
                if target is not None:
                    shutil.rmtree(target, ignore_errors=True)
                removed.append(going.key)
                total -= sizes.get(going.key, 0)
        if max_bytes is not None and total > max_bytes:
            log.warning(
                "job environments in use take %s on disk, over the %s the cache may take "
                "(%s): none is removed while a job runs in it",
                disk_watch.gib(total),
                disk_watch.gib(max_bytes),
                MAX_SETTING,
            )
        self._remove_leftovers()
        return removed

    # -- building -------------------------------------------------------------------------

    def _build_making_room(self, key: str, requirements: list[str], base: _Probe) -> None:
        """:meth:`_build`; one that ran out of disk (:func:`out_of_space`) removes every
        environment no job is in and, when that removed any, builds once more: the cache
        gives up its disk to the build rather than fail the job (as the node's fault, when
        the venv could not be made) for space the cache itself held. The caller holds the
        lock of ``key`` exclusively, so the prune passes over it."""
        try:
            self._build(key, requirements, base)
        except (EnvironmentBuildError, OSError) as exc:
            if not out_of_space(exc):
                raise
            removed = self.prune(0)
            if not removed:
                raise
            log.warning(
                "building job environment %s ran out of disk: removed the %d cached "
                "environments no job was in, and building it again",
                key[:12],
                len(removed),
            )
            self._build(key, requirements, base)

    def _build(self, key: str, requirements: list[str], base: _Probe) -> None:
        """Build and publish ``key``; the caller holds its lock exclusively."""
        store = self.root / STORE
        self._ensure_dir(store)
        stale = self._published_target(key)
        link = self.path(key)
        if link.exists() or link.is_symlink():  # not ready: a leftover, never in use
            if link.is_dir() and not link.is_symlink():
                shutil.rmtree(link)
            else:
                link.unlink()
            if stale is not None:
                shutil.rmtree(stale, ignore_errors=True)
        target = store / f"{key}.{secrets.token_hex(4)}"
        try:
            purelib, wheels = self._write_watched(target, requirements, base)
            _make_readable(target)
            packages = installed_packages([str(purelib), *base.site])
            size = self._record_size(target)
            if self.max_bytes is not None and size > self.max_bytes:
                log.warning(
                    "job environment %s takes %s on disk, more than the whole cache of job "
                    "environments may take (%s, %s): its jobs run in it, and it is removed "
                    "at the first prune that finds no job in it",
                    key[:12],
                    disk_watch.gib(size),
                    disk_watch.gib(self.max_bytes),
                    MAX_SETTING,
                )
            marker = {
                "key": key,
                "requirements": requirements,
                "installer": self.installer,
                "base_python": self.base_python,
                "base_version": base.version,
                "base_site": list(base.site),
                "provided": list(self.provided),
                "packages": list(packages),
                "wheels": wheels,
                "built_at": time.time(),
            }
            self._write_file(target / LAST_USED, "")
            self._write_file(target / MARKER, json.dumps(marker, indent=1) + "\n")
            temp_link = self.root / f".{key}.{secrets.token_hex(4)}.link"
            os.symlink(os.path.relpath(target, self.root), temp_link)
            os.replace(temp_link, link)  # the publication: atomic
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise

    def _write_watched(
        self, target: Path, requirements: list[str], base: _Probe
    ) -> tuple[Path, dict[str, str]]:
        """:meth:`_write` under the build's bound (module docstring, "A build's own
        bound"): a build over ``build_max_bytes`` has its running command killed and
        raises :class:`BuildTooLarge`, whatever the steps raised (out of disk included:
        this build filled it, the cache's environments are not removed for it)."""
        if self.build_max_bytes is None:
            return self._write(target, requirements, base)
        stopper = _Stopper()
        failure: EnvironmentBuildError | OSError | None = None
        written: tuple[Path, dict[str, str]] | None = None
        self._building.stopper = stopper
        try:
            with disk_watch.Watch(
                [target], self.build_max_bytes, self.build_check_s, stopper.stop
            ) as watch:
                try:
                    written = self._write(target, requirements, base)
                except (EnvironmentBuildError, OSError) as exc:
                    failure = exc
        finally:
            self._building.stopper = None
        # Raised here, outside the handler: the command's failure is not its cause.
        if watch.over() is not None:
            raise BuildTooLarge(self.build_max_bytes)
        if failure is not None:
            raise failure
        assert written is not None
        return written

    def _write(
        self, target: Path, requirements: list[str], base: _Probe
    ) -> tuple[Path, dict[str, str]]:
        """Make the venv at ``target`` and install ``requirements`` into it; its
        site-packages and the sha256 of each wheel URL's file, by its URL."""
        self._create_venv(target)
        purelib = Path(self._probe(str(target / "bin" / "python"), with_packages=False).purelib)
        self._write_file(purelib / BASE_PTH, _base_pth(base.site))
        pins = self._pins(base)
        wanted = _beyond_the_base(requirements, pins)
        wheels: dict[str, str] = {}
        if wanted:
            interpreter = _identity(target / "bin" / "python")
            wheels = self._install(target, purelib, wanted, pins)
            if _identity(target / "bin" / "python") != interpreter:
                # pip writes a wheel's ``.data/data/bin/python`` over it; uv refuses.
                raise RequirementsError(
                    "a package of the requirements installs a bin/python of its own over "
                    "the environment's interpreter: refused"
                )
            self._compile(purelib)
        return purelib, wheels

    def _create_venv(self, target: Path) -> None:
        if self.installer == "uv":
            argv = [_uv_bin(), "venv", "--no-project", "--python", self.interpreter, str(target)]
        else:
            argv = [self.interpreter, "-m", "venv", "--without-pip", str(target)]
        self._run(argv, "creating the virtual environment")

    def _pins(self, base: _Probe) -> dict[str, str]:
        """The provided packages the base has, with their versions."""
        versions = dict(p.split("==", 1) for p in base.packages)
        return {name: versions[name] for name in self.provided if name in versions}

    def _install(
        self, target: Path, purelib: Path, requirements: list[str], pins: Mapping[str, str]
    ) -> dict[str, str]:
        """Install ``requirements`` into ``target`` with ``pins`` held at their versions
        (see the module docstring), none of them into the venv, each wheel URL from the
        file the runner downloaded (:meth:`_download_wheels`); the sha256 of each wheel
        downloaded, by its URL."""
        try:
            installable, digests = self._download_wheels(target / WHEELS, requirements)
            if installable:  # else all were wheel URLs whose markers do not hold here
                self._run_installer(target, purelib, requirements, installable, pins)
        finally:
            shutil.rmtree(target / WHEELS, ignore_errors=True)
        return digests

    def _download_wheels(
        self, folder: Path, requirements: list[str]
    ) -> tuple[list[str], dict[str, str]]:
        """``requirements`` with each wheel URL downloaded into ``folder``
        (``wheels.fetch_wheel``: the address judged as a job's git code is, no redirect, at
        most ``max_wheel_bytes`` and ``timeout`` seconds for all of them together) and
        named by its file instead, so the installer never
        fetches a URL a job names; and the sha256 of each file, by its URL. One whose
        marker does not hold here is left out (nothing to install). A wheel that cannot be
        downloaded raises :class:`RequirementsError` when the requirement is at fault,
        :class:`InstallError` when the network or the server is (as an unreachable index),
        each naming its ``requirement``."""
        from packaging.requirements import Requirement

        installable: list[str] = []
        digests: dict[str, str] = {}
        # One bound for them all: a hundred requirements of 4 GiB each would fill the disk
        # (and then flush the cache: ``_build_making_room``), each slow one take its time.
        bytes_left = self.max_wheel_bytes
        end = time.monotonic() + self.timeout
        for index, text in enumerate(requirements):
            if "@" not in text:
                installable.append(text)
                continue
            requirement = Requirement(text)
            if requirement.url is None:
                installable.append(text)
                continue
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            # A folder each: two URLs may end in the same file name.
            own = folder / str(index)
            own.mkdir(parents=True)
            shown = without_credentials(text)
            left = end - time.monotonic()
            if left <= 0:
                raise InstallError(
                    f"requirement {shown!r}: could not download the wheel: the requirements' "
                    f"wheels took over the {self.timeout:.0f} s they may take together",
                    text,
                )
            try:
                path, digests[requirement.url] = fetch_wheel(
                    requirement.url,
                    own,
                    self.fetch_allowed,
                    max_bytes=bytes_left,
                    # A launch's deadline stops the download too, as the installer's: each
                    # socket operation waits at most what is left of it (``wheels``).
                    deadline=cap_timeout(left),
                )
                refuse_direct_references(path)
            except WheelTooLarge as exc:
                said = (
                    str(exc)
                    if bytes_left == self.max_wheel_bytes
                    else (
                        f"the requirements' wheels are larger than {self.max_wheel_bytes} bytes "
                        "together, the most this node downloads for one environment"
                    )
                )
                raise RequirementsError(f"requirement {shown!r}: {said}", text) from None
            except WheelRefused as exc:
                raise RequirementsError(f"requirement {shown!r}: {exc}", text) from None
            except WheelUnreachable as exc:
                raise InstallError(
                    f"requirement {shown!r}: could not download the wheel: {exc}", text
                ) from None
            bytes_left -= path.stat().st_size
            extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
            installable.append(f"{requirement.name}{extras} @ {path.as_uri()}")
        return installable, digests

    def _run_installer(
        self,
        target: Path,
        purelib: Path,
        requirements: list[str],
        installable: list[str],
        pins: Mapping[str, str],
    ) -> None:
        """Run the installer on ``installable`` (``requirements``, wheel URLs downloaded),
        naming ``requirements`` when it fails."""
        python = str(target / "bin" / "python")
        with tempfile.TemporaryDirectory(prefix="trainyard-install-") as tmp:
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
            try:
                if self.installer == "pip":
                    argv = [
                        self.base_python, "-m", "pip", "--python", python, "install",
                        "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
                        "--only-binary=:all:", "--no-compile", "--constraint", str(constraints),
                        *installable,
                    ]  # fmt: skip
                    self._run(argv, "pip install", installing=True, requirements=requirements)
                else:
                    records = [_write_record(purelib, n, v) for n, v in pins.items()]
                    argv = [
                        _uv_bin(), "pip", "install", "--python", python, "--no-build",
                        "--constraint", str(constraints), *installable,
                    ]  # fmt: skip
                    try:
                        self._run(
                            argv, "uv pip install", installing=True, requirements=requirements
                        )
                    finally:
                        for record in records:
                            shutil.rmtree(record, ignore_errors=True)
            except RequirementsError as exc:
                said = str(exc).lower()
                named = [
                    f"{n} {v}"
                    for n, v in sorted(pins.items())
                    if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", said)
                ]
                if not named:
                    raise
                raise RequirementsError(
                    f"{exc}\nthe platform provides {', '.join(named)} (its base layer): "
                    "every requirement, and what it depends on, must accept that version"
                ) from None
        second = [p for p in installed_packages([str(purelib)]) if p.split("==")[0] in pins]
        if second:
            raise InstallError(
                f"the installer put {', '.join(second)} into the job's environment although "
                "the base layer provides it"
            )

    def _compile(self, purelib: Path) -> None:
        """Bytecode for the installed packages (job users cannot write it), by the
        interpreter the venv was made from (the same version, so the same bytecode), never
        by a program of the venv, which the installed wheels may have written: pip lets a
        wheel's ``.data`` put its own ``bin/python`` there (``_build`` refuses that too).
        Without ``site`` (``-S``: no ``.pth`` of a package runs)."""
        # The files compiled are the job's packages' (one that is no valid Python fails it).
        argv = [self.interpreter, "-I", "-S", "-m", "compileall", "-q", str(purelib)]
        self._run(argv, "compiling", failed_as=InstallError)

    def _run(
        self,
        argv: list[str],
        what: str,
        *,
        installing: bool = False,
        requirements: Sequence[str] = (),
        failed_as: type[EnvironmentBuildError] = EnvironmentBuildError,
    ) -> str:
        """``argv``'s output; raises ``failed_as`` when it fails or runs out of time (an
        :class:`InstallError` while ``installing``), a :class:`RequirementsError` when
        ``installing`` and the output blames the requirements, and
        :class:`EnvironmentBuildError` when it cannot be started at all (this node's
        installer or interpreter missing). While ``installing`` (the job's
        ``requirements``) the message is the job's user's to read (``install_failure``).
        Within a build under its bound, the build's ``_Stopper`` kills it (its process
        group) once the build is over the bound."""
        if installing:
            failed_as = InstallError
            hidden = [str(self.root), *(a for a in argv if a.startswith("/"))]

            def tail(output: str) -> str:
                return install_failure(output, requirements, hidden)
        else:
            tail = _tail
        env = installer_environment(os.environ)
        env.update(NO_COLOR="1", UV_NO_PROGRESS="1", PIP_NO_INPUT="1")
        env.update(self.installer_env)
        try:
            # A session (process group) of its own: a build over its bound is stopped by
            # killing the group from the watch's thread (``_Stopper``), what it started too.
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=env,
                cwd=self.root if self.root.is_dir() else None,
                umask=0o022,
                start_new_session=True,
            )
        except OSError as exc:
            raise EnvironmentBuildError(f"{what} could not start: {exc}") from None
        stopper: _Stopper = getattr(self._building, "stopper", None) or _Stopper()
        with stopper.running(process):
            try:
                # A launch's deadline stops the build too (``deadline.cap_timeout``).
                output, _ = process.communicate(timeout=cap_timeout(self.timeout))
            except subprocess.TimeoutExpired as exc:
                _kill_group(process)
                # The leader is waited for, not its output's end: a process that left its
                # group (``setsid``) keeps the pipe open for as long as it runs. The output
                # is what was read by the timeout.
                process.wait()
                _close_output(process)
                raise failed_as(
                    f"{what} timed out after {self.timeout:.0f} s{tail(_text(exc.output))}"
                ) from None
            except BaseException:
                _kill_group(process)
                process.wait()
                _close_output(process)
                raise
        if process.returncode != 0:
            error = RequirementsError if installing and requirements_at_fault(output) else failed_as
            raise error(f"{what} failed (exit status {process.returncode}){tail(output)}")
        return output

    # -- probing --------------------------------------------------------------------------

    def _probe_base(self) -> _Probe:
        with self._base_lock:
            if self._base is None:
                self._base = self._probe(self.base_python)
            return self._base

    def _probe(self, python: str, *, with_packages: bool = True) -> _Probe:
        out = self._run([python, "-I", "-c", _PROBE], f"probing {python}")
        try:
            data = json.loads(out.strip().splitlines()[-1])
            return _Probe(
                version=str(data["version"]),
                site=tuple(str(p) for p in data["site"]),
                purelib=str(data["purelib"]),
                packages=tuple(str(p) for p in data["packages"]) if with_packages else (),
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EnvironmentBuildError(f"probing {python} gave unreadable output: {exc}") from None

    def _key(self, normalized: list[str]) -> str:
        base = self._probe_base()
        material = {
            # How environments are built: bumped when a change makes earlier ones wrong (2:
            # provided packages pinned; before, a dependant of torch could bring one
            # built for another torch, and such an environment must not be reused).
            "recipe": 2,
            "requirements": normalized,
            "python": base.version,
            "installer": self.installer,
            "base_site": list(base.site),
            "base_packages": list(base.packages),
            "provided": list(self.provided),
            "interpreter": self.interpreter,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    # -- files and locks ------------------------------------------------------------------

    def _lock_path(self, key: str) -> Path:
        return self.root / f"{key}.lock"

    def _ready_packages(self, key: str) -> list[str] | None:
        """The published environment's package list, or None when it is not ready."""
        try:
            data = json.loads((self.path(key) / MARKER).read_text())
            return [str(p) for p in data["packages"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _published_target(self, key: str) -> Path | None:
        link = self.path(key)
        if not link.is_symlink():
            return None
        target = (self.root / os.readlink(link)).resolve()
        store = (self.root / STORE).resolve()
        return target if target.parent == store else None

    def _size(self, target: Path) -> int:
        try:
            return int((target / SIZE).read_text())
        except (OSError, ValueError):
            return self._record_size(target)  # built before sizes were recorded: once

    def _record_size(self, target: Path) -> int:
        """Measure the environment at ``target`` (the files in it are final) and record it."""
        size = disk_watch.measure([target], max_entries=sys.maxsize).bytes
        with contextlib.suppress(OSError):
            self._write_file(target / SIZE, f"{size}\n")
        return size

    def _record_use(self, key: str, team: str) -> None:
        """Record ``team``'s use of ``key`` (the caller holds its lock): its file in
        ``USERS`` created or touched. A file per team, not one file listing them, so that
        resolves of the same environment by several teams at once (shared locks, several
        runner processes) never write over one another's record. The folder is 0700: job
        users may list the environment they run in, never which teams use it."""
        folder = self.path(key) / USERS
        with contextlib.suppress(OSError):  # a record missing costs a fair eviction only
            folder.mkdir(mode=0o700, exist_ok=True)
            (folder / hashlib.sha256(team.encode()).hexdigest()).touch(mode=0o600)

    @staticmethod
    def _users(link: Path) -> dict[str, float]:
        """The teams recorded on the environment at ``link`` (by the sha256 of each name),
        each with its last use."""
        users: dict[str, float] = {}
        with contextlib.suppress(OSError), os.scandir(link / USERS) as records:
            for record in records:
                if _KEY_PATTERN.match(record.name):
                    with contextlib.suppress(OSError):
                        users[record.name] = record.stat().st_mtime
        return users

    def _last_used(self, link: Path) -> float:
        for name in (LAST_USED, MARKER):
            with contextlib.suppress(OSError):
                return (link / name).stat().st_mtime
        return 0.0

    @contextlib.contextmanager
    def _try_exclusive(self, key: str) -> Iterator[bool]:
        fd = os.open(self._lock_path(key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                yield False
            else:
                yield True
        finally:
            os.close(fd)

    def _remove_leftovers(self) -> None:
        """Unpublished store folders (crashed or superseded builds) and stray temporary
        links, each only when its key's lock is free."""
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and entry.name.endswith(".link") and entry.is_symlink():
                key = entry.name[1:].split(".", 1)[0]
                with self._try_exclusive(key) as held:
                    if held:
                        entry.unlink(missing_ok=True)
        store = self.root / STORE
        if not store.is_dir():
            return
        for entry in store.iterdir():
            key = entry.name.split(".", 1)[0]
            if not _KEY_PATTERN.match(key):
                continue
            with self._try_exclusive(key) as held:
                if held and self._published_target(key) != entry.resolve():
                    shutil.rmtree(entry, ignore_errors=True)

    @staticmethod
    def _ensure_dir(path: Path) -> None:
        # 0711: job users pass through to the environment they are given, but list neither
        # the cache nor its store (other teams' requirement sets, in markers and records).
        path.mkdir(parents=True, exist_ok=True)
        if stat.S_IMODE(path.stat().st_mode) != 0o711:
            os.chmod(path, 0o711)

    @staticmethod
    def _write_file(path: Path, text: str) -> None:
        """Write ``text`` to ``path`` atomically, mode 0644."""
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)

    @staticmethod
    def _touch(path: Path) -> None:
        with contextlib.suppress(OSError):
            os.utime(path)


class _Stopper:
    """Stops a build: kills the command it runs (:meth:`EnvironmentCache._run`) and any it
    starts later, from the thread of its ``disk_watch.Watch``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._process: subprocess.Popen[str] | None = None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._process is not None and self._process.returncode is None:
                _kill_group(self._process)

    @contextlib.contextmanager
    def running(self, process: subprocess.Popen[str]) -> Iterator[None]:
        """While ``process`` runs: killed at once when the build was stopped already."""
        with self._lock:
            if self._stopped:
                _kill_group(process)
            self._process = process
        try:
            yield
        finally:
            with self._lock:
                self._process = None


def _close_output(process: subprocess.Popen[str]) -> None:
    """Close the parent's end of ``process``'s output pipe, no longer read."""
    if process.stdout is not None:
        process.stdout.close()


def _kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL to ``process``'s group (its own session: ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True, eq=False)
class _Cached:
    """A published environment as :meth:`EnvironmentCache.prune` sees it."""

    key: str
    last_used: float
    users: dict[str, float]
    """The teams recorded on it (sha256 of the name) and when each last used it."""


def _next_to_go(
    waiting: Sequence[_Cached],
    kept: Sequence[_Cached],
    sizes: Mapping[str, int] | None,
    bound: int,
) -> _Cached:
    """The next of ``waiting`` (not empty) in :meth:`EnvironmentCache.prune`'s order,
    ``kept`` staying besides them: holdings in bytes of ``sizes`` (None: in environments),
    fair shares of ``bound``."""
    unrecorded = [e for e in waiting if not e.users]
    if unrecorded:
        return min(unrecorded, key=lambda e: (e.last_used, e.key))
    holdings: dict[str, Fraction] = {}
    for cached in (*waiting, *kept):
        weight = sizes.get(cached.key, 0) if sizes is not None else 1
        for team in cached.users:
            holdings[team] = holdings.get(team, Fraction(0)) + Fraction(weight, len(cached.users))
    fair = Fraction(bound, len(holdings))
    over = {team for team, holding in holdings.items() if holding > fair}
    pool = [e for e in waiting if over.issuperset(e.users)] or list(waiting)
    oldest: dict[str, float] = {}
    for cached in pool:
        for team, used in cached.users.items():
            oldest[team] = min(used, oldest.get(team, used))
    team = min(oldest, key=lambda t: (-holdings[t], oldest[t], t))
    return min((e for e in pool if team in e.users), key=lambda e: (e.users[team], e.key))


_INSTALLER_VARIABLES = frozenset(
    {
        "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "LD_LIBRARY_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
        "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    }
)  # fmt: skip
_INSTALLER_PREFIXES = ("UV_", "PIP_")


def installer_environment(runner_env: Mapping[str, str]) -> dict[str, str]:
    """What the installers see of the runner's environment: their own settings (``UV_*``,
    ``PIP_*`` but ``PIP_USER``), proxies, certificates, ``PATH`` and ``HOME`` (their
    caches), ``LD_LIBRARY_PATH`` (an interpreter with a shared libpython needs it to start),
    and nothing else: never the runner's bus, database or store credentials."""
    return {
        name: value
        for name, value in runner_env.items()
        if (name in _INSTALLER_VARIABLES or name.startswith(_INSTALLER_PREFIXES))
        and name != "PIP_USER"
    }


def installed_packages(search: Sequence[str]) -> tuple[str, ...]:
    """``name==version`` (names normalised, sorted) of the distributions along ``search``,
    the first one per name (the one an interpreter with that path imports), read from
    their metadata: nothing of them runs."""
    packages: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=list(search)):
        name = dist.metadata["Name"]
        if name:
            packages.setdefault(canonical_name(name), dist.version)
    return tuple(sorted(f"{k}=={v}" for k, v in packages.items()))


def _beyond_the_base(requirements: Sequence[str], pins: Mapping[str, str]) -> list[str]:
    """``requirements`` less those on a pinned (provided) package, each of which the
    base's version must satisfy; raises :class:`RequirementsError` for one it does not."""
    from packaging.requirements import InvalidRequirement, Requirement

    rest = []
    for text in requirements:
        name = _requirement_name(text)
        if name not in pins:
            rest.append(text)
            continue
        version = pins[name]
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise RequirementsError(f"requirement {text!r} is not valid: {exc}") from None
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # not for this platform: nothing to meet
        if requirement.extras:
            # The base has the package, not what its extras add; met by the base, they
            # would be left out without a word and the job fail at an import.
            raise RequirementsError(
                f"requirement {text!r}: the platform provides {name} {version} (its base "
                f"layer) without extras; write {name!r} and list the packages the extras "
                f"{sorted(requirement.extras)} add as requirements of their own"
            )
        if requirement.url is None and requirement.specifier.contains(version, prereleases=True):
            continue
        raise RequirementsError(
            f"requirement {text!r} cannot be met: the platform provides {name} {version} "
            f"(its base layer) and a job cannot install another {name}; write {name!r} "
            f"(or {name + '==' + version!r}) or leave it out"
        )
    return rest


def _write_record(purelib: Path, name: str, version: str) -> Path:
    """A metadata-only ``.dist-info`` of ``name`` ``version`` in ``purelib``: uv takes
    the package as installed (it does not see the base layer)."""
    record = purelib / f"{name.replace('-', '_')}-{version}.dist-info"
    record.mkdir()
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return record


def _uv_bin() -> str:
    import uv

    return str(uv.find_uv_bin())


def _base_pth(site_dirs: Sequence[str]) -> str:
    """A ``.pth`` that appends the base environment's site-packages (and runs their own
    ``.pth`` files); ``import`` lines are executed by ``site``."""
    calls = "".join(f"; site.addsitedir({d!r})" for d in site_dirs)
    return f"import site{calls}\n"  # one line: site executes a line that starts with import


def _identity(path: Path) -> tuple[int, int, int, str | None] | None:
    """What ``path`` is, without following it: its device, inode, mode and, for a link,
    where it points; None when it is missing. Another file written in its place is another
    identity."""
    try:
        info = os.lstat(path)
        target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mode, target


def _make_readable(root: Path) -> None:
    """Directories 0755; files keep their mode plus read (and execute where the owner
    has it) for group and others."""
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            wanted = mode | 0o044 | (0o011 if mode & 0o100 else 0)
            if wanted != mode:
                os.chmod(path, wanted)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]


def _text(output: str | bytes | None) -> str:
    if output is None:
        return ""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output


INSTALL_TAIL_LINES = 8
"""How many of the installer's last relevant lines a failed install's reason quotes."""

# The installer's lines that say what went well (uv's, pip's), never why it failed.
_INSTALL_NOISE = re.compile(
    r"^\s*(Using (C?Python|Python \S+ environment)|Resolved |Prepared |Installed |"
    r"Uninstalled |Audited |Downloading |Downloaded |Collecting |Looking in (indexes|links))"
)


def install_failure(output: str, requirements: Sequence[str], hidden: Sequence[str]) -> str:
    """The end of a failed install's reason, for the job's user: the requirements of
    ``spec.requirements`` the installer's ``output`` names, then its last relevant lines,
    each path of ``hidden`` (the runner's environments, the venv's interpreter, the
    constraints file) and below written ``<runner path>``. It quoted the installer's last 20 lines
    as they were, the runner's ``.store/<key>`` paths and progress lines included."""
    named = [r for r in requirements if _names(output, r)]
    lines = [
        _without_paths(line.rstrip(), hidden)
        for line in output.splitlines()
        if line.strip() and not _INSTALL_NOISE.match(line)
    ][-INSTALL_TAIL_LINES:]
    kind = "requirement" if len(named) == 1 else "requirements"
    said = f" on the {kind} {', '.join(map(repr, named))}" if named else ""
    quoted = "\n".join(f"  {line}" for line in lines)
    return f"{said}; it said:\n{quoted}" if quoted else said


def _names(output: str, requirement: str) -> bool:
    """Whether ``output`` names the package of ``requirement`` (``numpy==99``: numpy,
    written with any of ``-_.`` between its parts, in any case)."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if found is None:
        return False
    parts = re.split(r"[-_.]+", found.group(1))
    name = r"[-_.]+".join(map(re.escape, parts))
    return re.search(rf"(?<![\w.-]){name}(?![\w-])", output, re.IGNORECASE) is not None


def _without_paths(line: str, hidden: Sequence[str]) -> str:
    for path in sorted(hidden, key=len, reverse=True):
        line = re.sub(rf"{re.escape(path)}[^\s'\"`,;:)]*", "<runner path>", line)
    # A path of the runner's cache the list does not hold (the installer resolved a link).
    return re.sub(rf"\S*/{re.escape(STORE)}/[^\s'\"`,;:)]*", "<runner path>", line)


def _tail(output: str) -> str:
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    if not lines:
        return ""
    return ":\n" + "\n".join(lines[-ERROR_TAIL_LINES:])


# -- which interpreter job users can run ------------------------------------------------


def runnable_by_others(python: str) -> bool:
    """Whether a user other than the file's owner can run ``python``: the interpreter and
    its installation prefix (where the standard library lives) must be reachable."""
    real = Path(os.path.realpath(python))
    try:
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        prefix = real.parent.parent
        for folder in (real.parent, prefix, *prefix.parents):
            if not folder.stat().st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True


SYSTEM_PYTHON_FOLDERS = (Path("/usr/local/bin"), Path("/usr/bin"))


def job_interpreter(base_python: str, folders: Sequence[Path] = SYSTEM_PYTHON_FOLDERS) -> str:
    """``base_python`` when job users can run it, else a system interpreter of the same
    ``major.minor`` they can run (the base layer's compiled packages need that version).
    Raises ``EnvironmentBuildError`` when there is none."""
    if runnable_by_others(base_python):
        return base_python
    try:
        version = subprocess.run(
            [base_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentBuildError(
            f"cannot run the base interpreter {base_python}: {exc}"
        ) from None
    for folder in folders:
        candidate = folder / f"python{version}"
        if candidate.exists() and runnable_by_others(str(candidate)):
            return str(candidate)
    raise EnvironmentBuildError(
        f"job users cannot run the base interpreter {base_python} (a folder above it is "
        f"closed to them) and there is no python{version} in "
        f"{', '.join(map(str, folders))}; install Python {version} where every user can "
        "run it, or start the runner from such an interpreter"
    )
